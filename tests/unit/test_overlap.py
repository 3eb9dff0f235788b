"""Computation beside communication: slower while NCCL runs (Lee et al. 2025, arXiv
2507.03114: 18.9 % on average), never slower than running the two one after the other."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from paraplan.catalog import resolve_job
from paraplan.prediction import predict
from paraplan.schedule import overlapped_s, sharded_pass_s, with_sharded_traffic

seconds = st.floats(min_value=0.0, max_value=100.0)
slowdowns = st.floats(min_value=0.0, max_value=1.0)


def test_without_contention_the_longer_of_the_two_is_the_time():
    assert overlapped_s(3.0, 2.0, 0.0) == pytest.approx(3.0)
    assert overlapped_s(2.0, 3.0, 0.0) == pytest.approx(3.0)


def test_short_communication_slows_the_computation_it_overlaps():
    # 1 s of NCCL beside 10 s of compute at 20 % slowdown: the 1 s window does 1/1.2 s of
    # work, the remaining 10 - 0.833 s run at full speed: 10.1667 s in all
    assert overlapped_s(10.0, 1.0, 0.2) == pytest.approx(10.0 + 1.0 * 0.2 / 1.2)


def test_communication_longer_than_the_slowed_computation_is_the_critical_path():
    assert overlapped_s(1.0, 5.0, 0.2) == pytest.approx(5.0)
    assert overlapped_s(1.0, 1.2, 0.2) == pytest.approx(1.2)  # the boundary: both end together


@given(seconds, seconds, slowdowns)
def test_overlap_is_never_faster_than_either_part_nor_slower_than_both_in_turn(compute, comm, slowdown):
    t = overlapped_s(compute, comm, slowdown)
    assert t >= max(compute, comm) - 1e-9
    assert t <= compute + comm + 1e-9


@given(seconds, seconds, slowdowns, st.floats(min_value=0.0, max_value=10.0))
def test_more_communication_never_takes_less_time(compute, comm, slowdown, extra):
    assert overlapped_s(compute, comm + extra, slowdown) >= overlapped_s(compute, comm, slowdown) - 1e-9


def test_a_sharded_pass_exposes_one_units_traffic():
    # 32 layers, 3.2 s of gathers beside 10 s of compute, no contention: 0.1 s exposed
    assert sharded_pass_s(10.0, 3.2, 32, 0.0) == pytest.approx(10.1)
    assert sharded_pass_s(10.0, 3.2, 1, 0.0) == pytest.approx(13.2)  # one unit: nothing hides it


def test_contention_makes_an_fsdp_job_slower_than_perfect_overlap_and_the_gathers_carry_the_slowdown():
    job = resolve_job({"model": "llama-2-7b", "cluster": {"name": "dgx-a100", "num_nodes": 2},
                       "parallel": {"zero_stage": 3, "micro_batch_size": 2, "global_batch_size": 32}})
    gpu = job.cluster.gpu
    calm = gpu.model_copy(update={"efficiency": gpu.efficiency.model_copy(update={"overlap_slowdown": 0.0})})
    perfect = job.model_copy(update={"cluster": job.cluster.model_copy(update={"gpu": calm})})
    contended, ideal = predict(job), predict(perfect)
    assert contended.iteration_s > ideal.iteration_s
    # the kernels take as long; what NCCL beside them adds is the traffic's, not compute's
    assert contended.breakdown.forward_compute_s == ideal.breakdown.forward_compute_s
    assert contended.breakdown.dp_communication_s > ideal.breakdown.dp_communication_s


@given(seconds, seconds, slowdowns, st.floats(min_value=0.0, max_value=10.0))
def test_communication_beside_more_computation_is_never_more_exposed(compute, comm, slowdown, beside):
    """A backward pass's recompute runs inside it (``beside_s``, counted elsewhere): what the
    communication adds to ``compute`` never grows with it, never falls below what ``compute`` and
    ``beside`` together leave exposed, and with none beside it the time is the plain pair's."""
    plain = overlapped_s(compute, comm, slowdown)
    more = overlapped_s(compute, comm, slowdown, beside)
    assert overlapped_s(compute, comm, slowdown, 0.0) == plain
    assert compute - 1e-9 <= more <= plain + 1e-9
    assert more + beside >= overlapped_s(compute + beside, comm, slowdown) - 1e-9


def test_a_checkpointed_units_gathers_and_reduce_scatters_also_hide_behind_its_recompute():
    """Megatron-FSDP and torch's FSDP reduce-scatter a unit's gradients and prefetch the next unit's
    weights while a unit's backward runs, its recompute included (the checkpointed forward runs
    inside the unit's backward): 4 s of backward traffic beside 2 s of backward kernels and 1 s of
    recompute, 32 units, no contention: 4/32 s exposed and the rest ends 1 s after the kernels,
    where without the recompute it would end 2 s after them."""
    _, alone = with_sharded_traffic(1.0, 2.0, 0.0, 0.0, 0.0, 4.0, 32, 0.0, True)
    _, beside = with_sharded_traffic(1.0, 2.0, 0.0, 0.0, 0.0, 4.0, 32, 0.0, True, recompute_s=1.0)
    assert alone == pytest.approx(4.0)
    assert beside == pytest.approx(3.0)
    # the kernels alone when the traffic is short: the recompute changes nothing
    assert with_sharded_traffic(1.0, 2.0, 0.0, 0.0, 0.0, 0.32, 32, 0.0, True, recompute_s=1.0)[1] == pytest.approx(
        with_sharded_traffic(1.0, 2.0, 0.0, 0.0, 0.0, 0.32, 32, 0.0, True)[1])
