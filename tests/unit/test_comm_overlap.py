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


def test_overlapped_sends_are_not_counted_as_stage_time():
    pred = predict(job(vpp=2, overlap_p2p_comm=True))
    assert pred.breakdown.pipeline_p2p_s == 0.0
    assert pred.iteration_s <= predict(job(vpp=2)).iteration_s


def test_deepspeed_has_no_asynchronous_sends():
    with pytest.raises(ConfigError, match="overlap_p2p_comm"):
        job(framework="deepspeed", tp=1, sequence_parallel=False, overlap_p2p_comm=True)
