"""DeepSpeed's pipeline engine: TrainSchedule's step order, every transfer a rendezvous."""

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan import predict
from paraplan.catalog.jobs import load_job, resolve_job
from paraplan.schedule import simulate_deepspeed_pipeline, simulate_pipeline
from paraplan.schedule.deepspeed import (
    BWD,
    FWD,
    RECV_ACT,
    RECV_GRAD,
    SEND_ACT,
    SEND_GRAD,
    deepspeed_finish,
    train_schedule,
)
from paraplan.specs import ConfigError, Framework


def test_the_commands_are_deepspeeds_train_schedule_steps():
    """Worked by hand from deepspeed/runtime/pipe/schedule.py (TrainSchedule.steps, 0.9+)
    for two stages and two micro-batches: stage 0 sends each activation at its next step."""
    assert train_schedule(0, 2, 2) == [
        (FWD, 0), (SEND_ACT, 0), (FWD, 1), (RECV_GRAD, 0), (SEND_ACT, 1), (BWD, 0), (RECV_GRAD, 1), (BWD, 1)
    ]
    assert train_schedule(1, 2, 2) == [
        (RECV_ACT, 0), (FWD, 0), (BWD, 0), (SEND_GRAD, 0), (RECV_ACT, 1), (FWD, 1), (BWD, 1), (SEND_GRAD, 1)
    ]


@given(p=st.integers(1, 8), m=st.integers(1, 24))
def test_every_stage_runs_each_micro_batch_forward_then_backward_once(p, m):
    for stage in range(p):
        cmds = train_schedule(stage, p, m)
        assert [mb for kind, mb in cmds if kind == FWD] == list(range(m))
        assert [mb for kind, mb in cmds if kind == BWD] == list(range(m))
        assert sum(kind == SEND_ACT for kind, _ in cmds) == (m if stage < p - 1 else 0)
        assert sum(kind == SEND_GRAD for kind, _ in cmds) == (m if stage > 0 else 0)


def test_a_two_stage_pipeline_with_transfers_worked_by_hand():
    """f = 1, b = 2, every transfer 0.5. Stage 0: F0 [0, 1], send A0 [1, 1.5], F1 [1.5, 2.5],
    then waits for stage 1 (F0 [1.5, 2.5], B0 [2.5, 4.5]) to send G0 [4.5, 5], sends A1
    [5, 5.5], B0 [5.5, 7.5]; stage 1 F1 [5.5, 6.5], B1 [6.5, 8.5], G1 [8.5, 9]; stage 0 B1
    [9, 11]."""
    result = simulate_deepspeed_pipeline([1.0, 1.0], [2.0, 2.0], 0.5, 2)
    assert result.finish == pytest.approx((11.0, 9.0))
    assert result.makespan == pytest.approx(11.0)
    assert result.busy == pytest.approx((8.0, 8.0))  # 2 forwards, 2 backwards, 4 transfers


@given(p=st.integers(1, 8), m=st.integers(1, 32), f=st.floats(0.1, 5), b=st.floats(0.1, 10))
def test_with_equal_stages_and_no_transfers_it_is_1f1b(p, m, f, b):
    result = simulate_deepspeed_pipeline([f] * p, [b] * p, 0.0, m)
    assert result.makespan == pytest.approx((m + p - 1) * (f + b))
    assert result.makespan == pytest.approx(simulate_pipeline([f] * p, [b] * p, 0.0, m).makespan)


@given(m=st.integers(2, 16), c=st.floats(0.01, 1.0))
def test_a_rendezvous_costs_more_than_a_send_that_never_waits_for_its_receiver(m, c):
    lockstep = simulate_deepspeed_pipeline([1.0] * 4, [2.0] * 4, c, m)
    megatron = simulate_pipeline([1.0] * 4, [2.0] * 4, c, m)
    assert lockstep.makespan > megatron.makespan


def _direct(fwd, bwd, x, xf, m):
    """A slow, literal walk over every stage's commands: a transfer waits until both stages
    have reached it, then holds both (independent of the cached graph)."""
    p = len(fwd)
    orders = [train_schedule(i, p, m) for i in range(p)]
    pos, clock = [0] * p, [0.0] * p
    partner = {SEND_ACT: (1, RECV_ACT), SEND_GRAD: (-1, RECV_GRAD), RECV_ACT: (-1, SEND_ACT),
               RECV_GRAD: (1, SEND_GRAD)}
    while any(pos[i] < len(orders[i]) for i in range(p)):
        moved = False
        for i in range(p):
            if pos[i] == len(orders[i]):
                continue
            kind, mb = orders[i][pos[i]]
            if kind in (FWD, BWD):
                clock[i] += fwd[i] if kind == FWD else bwd[i]
                pos[i] += 1
                moved = True
                continue
            step, want = partner[kind]
            j = i + step
            if pos[j] < len(orders[j]) and orders[j][pos[j]] == (want, mb):
                d = xf if SEND_ACT in (kind, want) else x
                clock[i] = clock[j] = max(clock[i], clock[j]) + d
                pos[i] += 1
                pos[j] += 1
                moved = True
        assert moved, "deadlock"
    return clock


@settings(max_examples=100, deadline=None)
@given(
    p=st.integers(1, 7),
    m=st.integers(1, 12),
    times=st.lists(st.floats(0.1, 3.0), min_size=14, max_size=14),
    x=st.floats(0.0, 0.5),
    mask=st.floats(0.0, 0.2),
)
def test_the_cached_step_graph_simulates_like_a_direct_walk(p, m, times, x, mask):
    fwd, bwd = times[:p], [2 * t for t in times[7 : 7 + p]]
    result = simulate_deepspeed_pipeline(fwd, bwd, x, m, fwd_extra_s=mask)
    assert result.finish == pytest.approx(tuple(_direct(fwd, bwd, x, x + mask, m)), rel=1e-12)
    dur = np.array([[fwd[i], bwd[i], x + mask, x][k] for i in range(p) for k in range(4)])[:, None]
    assert deepspeed_finish(p, m, np.repeat(dur, 3, axis=1))[:, 2] == pytest.approx(result.finish, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    p=st.integers(2, 6),
    m=st.integers(1, 12),
    times=st.lists(st.floats(0.1, 3.0), min_size=12, max_size=12),
    stage=st.integers(0, 5),
    extra=st.floats(0.0, 2.0),
)
def test_a_slower_stage_never_makes_the_pipeline_faster(p, m, times, stage, extra):
    fwd, bwd = times[:p], times[6 : 6 + p]
    base = simulate_deepspeed_pipeline(fwd, bwd, 0.1, m).makespan
    slower = list(bwd)
    slower[stage % p] += extra
    assert simulate_deepspeed_pipeline(fwd, slower, 0.1, m).makespan >= base - 1e-12


def test_a_timeline_lists_every_compute_once_in_order():
    result = simulate_deepspeed_pipeline([1.0] * 3, [2.0] * 3, 0.1, 5, keep_tasks=True)
    assert len(result.tasks) == 3 * 5 * 2
    assert max(t.end for t in result.tasks) == pytest.approx(result.makespan)
    for stage in range(3):
        mine = [t for t in result.tasks if t.stage == stage]
        assert all(a.end <= b.start + 1e-12 for a, b in itertools.pairwise(mine))


def _job(framework: Framework):
    job = load_job(Path(__file__).parents[2] / "examples" / "gpt-neox-20b-perlmutter-pp4-tp4-dp8.yaml")
    return job.model_copy(update={"parallel": job.parallel.model_copy(update={"framework": framework})})


def _stage_inputs(pred):
    """What the prediction feeds its pipeline simulation: per-stage forward and backward
    seconds per micro-batch, the send time and the mask's extra time."""
    t = pred.stages
    fwd = [s.forward_mb_s + s.tp_fwd_mb_s for s in t]
    bwd = [s.backward_mb_s + s.recompute_mb_s + s.tp_bwd_mb_s for s in t]
    return fwd, bwd, max(s.p2p_s for s in t), max(s.p2p_mask_s for s in t)


def test_a_deepspeed_pipeline_job_is_predicted_with_the_train_schedule():
    pred = predict(_job(Framework.DEEPSPEED), keep_timeline=True)
    t = pred.stages
    fwd, bwd, x, mask = _stage_inputs(pred)
    expected = simulate_deepspeed_pipeline(fwd, bwd, x, 16, fwd_extra_s=mask)
    assert pred.pipeline.finish == pytest.approx(expected.finish)
    assert pred.breakdown.total_s == pytest.approx(pred.iteration_s)
    assert pred.breakdown.pipeline_bubble_s >= 0.0
    # p2p is what the transfers delay the critical stage by, its own rendezvous and those
    # that hold the stages it waits for: more than its own 16 micro-batches' activation and
    # gradient with each neighbour, the seconds it holds in transfers
    crit = max(range(4), key=lambda i: expected.finish[i] + t[i].exposed_dp_s)
    free = simulate_deepspeed_pipeline(fwd, bwd, 0.0, 16)
    assert pred.breakdown.pipeline_p2p_s == pytest.approx(expected.finish[crit] - free.finish[crit])
    neighbours = (crit > 0) + (crit < 3)
    assert pred.breakdown.pipeline_p2p_s > neighbours * 16 * (2 * x + mask)


def test_megatron_keeps_its_own_1f1b():
    pred = predict(_job(Framework.MEGATRON), keep_timeline=True)
    fwd, bwd, x, mask = _stage_inputs(pred)
    expected = simulate_pipeline(fwd, bwd, x, 16, fwd_extra_s=mask)
    assert pred.pipeline.finish == pytest.approx(expected.finish)


def _mapping(**parallel):
    return {"model": "llama-2-7b", "cluster": {"name": "dgx-a100", "num_nodes": 4}, "precision": "bf16",
            "parallel": {"tp": 8, "pp": 4, "micro_batch_size": 1, "global_batch_size": 64, **parallel}}


def test_the_train_schedule_can_be_switched_on_or_off_whatever_the_framework():
    ds = predict(resolve_job(_mapping(framework="deepspeed")))
    off = predict(resolve_job(_mapping(framework="deepspeed", deepspeed_train_schedule=False)))
    on = predict(resolve_job(_mapping(framework="megatron", deepspeed_train_schedule=True)))
    assert ds.job.parallel.runs_deepspeed_train_schedule and on.job.parallel.runs_deepspeed_train_schedule
    assert not off.job.parallel.runs_deepspeed_train_schedule
    assert off.iteration_s < ds.iteration_s  # the same stages without the lock-step


def test_the_train_schedule_is_1f1b_only():
    with pytest.raises(ConfigError, match=r"parallel\.deepspeed_train_schedule: DeepSpeed's TrainSchedule is a 1F1B"):
        resolve_job(_mapping(deepspeed_train_schedule=True, schedule="gpipe"))
