"""Megatron-LM's communication overlaps: --tp-comm-overlap (Transformer Engine userbuffers)
and Megatron-LM's overlap_p2p_comm (asynchronous pipeline sends)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.catalog import resolve_job
from paraplan.prediction import predict
from paraplan.schedule import simulate_pipeline
from paraplan.specs import ConfigError, Schedule


def job(**parallel):
    plan = {"tp": 8, "pp": 4, "sequence_parallel": True, "micro_batch_size": 1, "global_batch_size": 64, **parallel}
    return resolve_job({"model": {"name": "llama-3-70b", "seq_length": 4096}, "cluster": {"name": "dgx-h100", "num_nodes": 4},
                        "parallel": plan})


def test_tp_comm_overlap_hides_all_but_one_chunk_of_the_tp_collectives():
    plain, overlapped = predict(job()), predict(job(tp_comm_overlap=True))
    tp_plain = plain.stages[0].tp_fwd_mb_s
    tp_overlapped = overlapped.stages[0].tp_fwd_mb_s
    assert tp_plain / 8 <= tp_overlapped < tp_plain
    assert overlapped.iteration_s < plain.iteration_s


def test_tp_comm_overlap_needs_sequence_parallelism():
    with pytest.raises(ConfigError, match=r"tp_comm_overlap.*sequence_parallel"):
        job(sequence_parallel=False, tp_comm_overlap=True)


def test_one_micro_batch_pays_every_transfer_whether_sends_block_or_not():
    # p = 2, f = 1, b = 2, one 0.5 s transfer each way: 1 + .5 + 1 + 2 + .5 + 2 = 7
    for overlap in (False, True):
        r = simulate_pipeline([1.0, 1.0], [2.0, 2.0], 0.5, 1, Schedule.ONE_F_ONE_B, overlap_p2p=overlap)
        assert r.makespan == pytest.approx(7.0)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 4), st.integers(1, 8), st.floats(0.0, 1.0), st.sampled_from([1, 2]))
def test_asynchronous_sends_never_make_the_pipeline_slower(p, m, p2p, v):
    if v > 1 and m % p:
        m = p * max(1, m // p)
    schedule = Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B
    f, b = [1.0] * p, [2.0] * p
    blocking = simulate_pipeline(f, b, p2p, m, schedule, v)
    asynchronous = simulate_pipeline(f, b, p2p, m, schedule, v, overlap_p2p=True)
    assert asynchronous.makespan <= blocking.makespan + 1e-9
    if p2p == 0.0:
        assert asynchronous.makespan == pytest.approx(blocking.makespan)


def test_overlapped_sends_count_only_the_arrivals_the_schedule_waits_for():
    overlapped, blocking = predict(job(vpp=2, overlap_p2p_comm=True)), predict(job(vpp=2))
    assert overlapped.iteration_s <= blocking.iteration_s
    # asynchronous sends hold no stage, yet a task still waits for its input to arrive: that
    # wait is p2p (it used to be counted as bubble), and less than blocking sends cost
    assert 0.0 < overlapped.breakdown.pipeline_p2p_s < blocking.breakdown.pipeline_p2p_s
    # with free sends the two schedules are one: the same bubble
    assert overlapped.breakdown.pipeline_bubble_s == pytest.approx(blocking.breakdown.pipeline_bubble_s, rel=1e-9)


def test_deepspeed_has_no_asynchronous_sends():
    with pytest.raises(ConfigError, match="overlap_p2p_comm"):
        job(framework="deepspeed", tp=1, sequence_parallel=False, overlap_p2p_comm=True)


# --tp-comm-overlap's floor: the least share of a TP collective an overlapped GEMM leaves
# exposed, measured at operator level (Flux, arXiv 2406.06858) and held in the GPU's catalog entry.

def _with_floor(exposed_fraction, **parallel):
    """``job`` on an inline H100 whose ``efficiency.tp_overlap`` is ``exposed_fraction`` (None:
    the block removed)."""
    import copy

    from paraplan.catalog import load_catalog_entry

    raw = copy.deepcopy(load_catalog_entry("gpus", "H100-SXM5-80GB"))
    raw.pop("aliases", None)
    if exposed_fraction is None:
        raw["efficiency"].pop("tp_overlap")
    else:
        raw["efficiency"]["tp_overlap"] = {"exposed_fraction": exposed_fraction, "source": "test"}
    plan = {"tp": 8, "pp": 4, "sequence_parallel": True, "micro_batch_size": 1, "global_batch_size": 64,
            "tp_comm_overlap": True, **parallel}
    return resolve_job({"model": {"name": "llama-3-70b", "seq_length": 4096},
                        "cluster": {"name": "dgx-h100", "num_nodes": 4, "gpu": raw}, "parallel": plan})


def test_the_tp_overlap_floor_comes_from_the_catalog_with_its_source():
    from paraplan.catalog import load_gpu

    h800, h100 = load_gpu("H800").efficiency.tp_overlap, load_gpu("H100").efficiency.tp_overlap
    assert h800.exposed_fraction == pytest.approx(0.19) and h800.transferred_from is None
    assert "flux" in h800.source.lower() and "0.583" in h800.source
    assert h100.exposed_fraction == h800.exposed_fraction and h100.transferred_from == "H800"
    assert load_gpu("A100-SXM4-80GB").efficiency.tp_overlap.exposed_fraction == pytest.approx(0.066)


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 10.0), st.floats(0.0, 10.0), st.sampled_from([2, 4, 8]), st.floats(0.0, 0.5),
       st.one_of(st.none(), st.floats(0.001, 1.0)))
def test_overlapped_tp_time_lies_between_the_measured_floor_and_the_collective_itself(gemm, tp_s, tp, slowdown, floor):
    from types import SimpleNamespace

    from paraplan.prediction.stages import tp_overlapped
    from paraplan.specs import TpOverlap

    measured = None if floor is None else TpOverlap(exposed_fraction=floor, source="test")
    comm = SimpleNamespace(plan=SimpleNamespace(tp=tp), slowdown=slowdown, tp_overlap=measured)
    exposed = tp_overlapped(gemm, tp_s, comm)
    assert exposed <= tp_s + 1e-12
    assert exposed >= (floor or 0.0) * tp_s - 1e-12
    assert exposed >= tp_s - gemm - 1e-12  # a collective longer than its GEMMs is the critical path


def test_a_floor_below_the_chunked_overlap_leaves_the_prediction_exactly_as_without_it():
    # H100's 0.19 is below what one of 8 chunks plus contention exposes: no number moves
    with_floor, without = predict(_with_floor(0.19)), predict(_with_floor(None))
    assert with_floor.iteration_s == without.iteration_s
    assert with_floor.stages[0].tp_fwd_mb_s == without.stages[0].tp_fwd_mb_s


def test_a_binding_floor_shows_under_tp_communication_never_compute():
    loose, tight = predict(_with_floor(None)), predict(_with_floor(0.9))
    plain = predict(_with_floor(None, tp_comm_overlap=False))
    assert tight.stages[0].tp_fwd_mb_s >= 0.9 * plain.stages[0].tp_fwd_mb_s
    assert tight.breakdown.tp_communication_s > loose.breakdown.tp_communication_s
    assert tight.breakdown.forward_compute_s == loose.breakdown.forward_compute_s
    assert tight.breakdown.backward_compute_s == loose.breakdown.backward_compute_s
    assert loose.iteration_s < tight.iteration_s <= plain.iteration_s
