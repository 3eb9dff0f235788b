"""Thousands of identical micro-batches cost what a few do: the steady state is extrapolated,
and the extrapolation equals the task-by-task simulation, to rounding, unless the stages drift
into a slower steady state only after the simulated run: a small rate difference eating a
warm-up's slack over hundreds of micro-batches (max-plus systems whose two slowest cycles are
close). Then the extrapolation is slightly fast; hypothesis has found 1.7e-5 past ``LONG``
(DeepSpeed, 6 unequal stages), which the tests below bound at 1e-4."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.schedule import simulate_deepspeed_pipeline, simulate_pipeline
from paraplan.schedule.deepspeed import deepspeed_finish
from paraplan.schedule.one_f_one_b import DRIFT_BOUND
from paraplan.schedule.pipeline import batched_short, pipeline_finish, task_durations
from paraplan.schedule.steady import LONG
from paraplan.specs import Schedule
from timing import assert_no_slower

DRIFT = 1e-4  # the bound on a late drift's error past LONG (1.7e-5 the worst found)

times = st.floats(0.1, 3.0)


@settings(max_examples=12, deadline=None)
@given(
    p=st.integers(2, 6),
    data=st.data(),
    schedule=st.sampled_from([Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED, Schedule.GPIPE]),
    overlap=st.booleans(),
)
def test_an_extrapolated_schedule_equals_the_full_simulation(p, data, schedule, overlap):
    fwd = data.draw(st.lists(times, min_size=p, max_size=p))
    bwd = data.draw(st.lists(times, min_size=p, max_size=p))
    m = p * (LONG // p + data.draw(st.integers(1, 40)))  # a multiple of p past LONG
    vpp = 2 if schedule is Schedule.INTERLEAVED else 1
    short = simulate_pipeline(fwd, bwd, 0.05, m, schedule, vpp, overlap_p2p=overlap)
    full = simulate_pipeline(fwd, bwd, 0.05, m, schedule, vpp, keep_tasks=True, overlap_p2p=overlap)
    assert short.finish == pytest.approx(full.finish, rel=DRIFT)
    assert short.busy == pytest.approx(full.busy, rel=1e-12)


@settings(max_examples=8, deadline=None)
@given(p=st.integers(2, 6), data=st.data(), extra=st.integers(1, 50))
def test_deepspeeds_extrapolated_schedule_equals_its_full_simulation(p, data, extra):
    fwd = data.draw(st.lists(times, min_size=p, max_size=p))
    bwd = data.draw(st.lists(times, min_size=p, max_size=p))
    m = LONG + extra
    short = simulate_deepspeed_pipeline(fwd, bwd, 0.05, m, fwd_extra_s=0.01)
    full = simulate_deepspeed_pipeline(fwd, bwd, 0.05, m, keep_tasks=True, fwd_extra_s=0.01)
    assert short.finish == pytest.approx(full.finish, rel=DRIFT)
    dur = np.array([[f, b, 0.06, 0.05] for f, b in zip(fwd, bwd, strict=True)]).reshape(-1, 1)
    assert deepspeed_finish(p, m, dur)[:, 0] == pytest.approx(full.finish, rel=DRIFT)


@settings(max_examples=20, deadline=None)
@given(
    p=st.integers(2, 6),
    data=st.data(),
    schedule=st.sampled_from([Schedule.ZB_H1, Schedule.ZB_V, Schedule.ONE_F_ONE_B, Schedule.GPIPE, Schedule.INTERLEAVED]),
    overlap=st.booleans(),
)
def test_many_plans_of_one_shape_finish_when_each_ones_simulation_says(p, data, schedule, overlap):
    """``pipeline_finish`` (the search's screen: a task graph evaluated for many plans at once)
    equals ``simulate_pipeline`` plan by plan, with unequal stages, weight gradients and sends,
    blocking or asynchronous (Megatron-LM's overlap_p2p_comm: a send holds no stage, an input
    arrives one transfer later), where it evaluates the whole graph (up to ``batched_short(p) + 2 p`` micro-batches). Past
    that it reads the steady state off a short run; as the stages may drift into a slower pace
    only after it (a small rate difference eating a warm-up's slack, hundreds of micro-batches
    later), it takes the middle of the bracket between the run's last cycle and the slowest
    stage's pace where that is within ``DRIFT_BOUND`` (0.1 %), else the whole graph."""
    m = data.draw(st.sampled_from([1, p - 1, p, 2 * p + 1, 50, 97, 300, 700, LONG + 7]))
    vpp = 2 if schedule is Schedule.INTERLEAVED else 1
    if vpp > 1:  # interleaving runs whole rounds of p micro-batches
        m = p * -(-m // p)
    v, plans = schedule.chunks(vpp), 3
    fwd = np.array([data.draw(st.lists(times, min_size=plans, max_size=plans)) for _ in range(p)])
    bwd = fwd * np.array([data.draw(st.lists(st.floats(1.0, 3.0), min_size=plans, max_size=plans)) for _ in range(p)])
    share = np.array(data.draw(st.lists(st.floats(0.0, 0.6), min_size=plans, max_size=plans)))
    wgrad = bwd * share if schedule.splits_backward else np.zeros_like(bwd)
    send = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.05, 0.4]), min_size=plans, max_size=plans)))
    blocking = 0.0 if overlap else 1.0
    dur = np.asarray(task_durations(schedule, p, v, list(fwd), list(bwd), list(wgrad), blocking * send,
                                    blocking * (send + 0.01)))
    got = pipeline_finish(schedule, p, m, v, dur, np.stack([send + 0.01, send]) if overlap else None)
    exact = batched_short(p) + 2 * p
    for j in range(plans):
        sim = simulate_pipeline(list(fwd[:, j]), list(bwd[:, j]), float(send[j]), m, schedule, vpp,
                                fwd_extra_s=0.01, wgrad_s=list(wgrad[:, j]), overlap_p2p=overlap)
        assert list(got[:, j]) == pytest.approx(sim.finish, rel=1e-9 if m <= exact else DRIFT_BOUND)


def test_a_drift_after_the_short_run_keeps_many_plans_within_the_drift_bound():
    """1F1B with asynchronous sends on 4 unequal stages (0.4 s sends) repeats a cycle within
    its short run, then drifts into a slower pace: repeating that cycle to 700 micro-batches
    was 0.65 % fast; the drift bracket's middle is within ``DRIFT_BOUND``."""
    fwd, bwd, p, m, send = [1.86, 0.208, 0.546, 2.807], [3.984, 0.53, 0.856, 2.989], 4, 700, 0.4
    dur = np.asarray(task_durations(Schedule.ONE_F_ONE_B, p, 1, [np.full(1, f) for f in fwd],
                                    [np.full(1, b) for b in bwd], [np.zeros(1)] * p, np.zeros(1), np.zeros(1)))
    got = pipeline_finish(Schedule.ONE_F_ONE_B, p, m, 1, dur, np.array([[send + 0.01], [send]]))[:, 0]
    sim = simulate_pipeline(fwd, bwd, send, m, Schedule.ONE_F_ONE_B, 1, fwd_extra_s=0.01, overlap_p2p=True)
    assert list(got) == pytest.approx(sim.finish, rel=DRIFT_BOUND)


def test_a_steady_state_reached_after_a_long_drift_is_not_extrapolated_from_before_it():
    """ZB-V on 3 equal stages with a forward send of 0.01 runs at 2.01 s per micro-batch until
    the warm-up's slack is used up (55 micro-batches), then at 2.02 s: the screen sees the
    change within its short run and evaluates the whole graph instead (CI found the screen
    0.22 % fast at 97 micro-batches when its short run was 32)."""
    p, v = 3, Schedule.ZB_V.chunks(1)
    for m in (97, 300):
        dur = np.asarray(task_durations(Schedule.ZB_V, p, v, [np.ones(1)] * p, [np.ones(1)] * p, [np.zeros(1)] * p,
                                        np.zeros(1), np.full(1, 0.01)))
        got = pipeline_finish(Schedule.ZB_V, p, m, v, dur)[:, 0]
        sim = simulate_pipeline([1.0] * p, [1.0] * p, 0.0, m, Schedule.ZB_V, 1, fwd_extra_s=0.01, wgrad_s=[0.0] * p)
        assert list(got) == pytest.approx(sim.finish, rel=1e-12)

    def per_mb(a, b):
        fin = [simulate_pipeline([1.0] * p, [1.0] * p, 0.0, k, Schedule.ZB_V, 1, fwd_extra_s=0.01).finish[0]
               for k in (a, b)]
        return (fin[1] - fin[0]) / (b - a)

    assert per_mb(10, 40) == pytest.approx(2.01) and per_mb(100, 200) == pytest.approx(2.02)


def test_two_million_micro_batches_take_no_longer_than_two_thousand():
    fwd, bwd = [1.0, 1.2, 0.9, 1.1], [2.0, 2.1, 1.9, 2.2]
    # no longer than simulating 2,000 task by task (~10 x longer here); walking all 2 million
    # would take 1,000 x as long as that
    assert_no_slower(lambda: simulate_pipeline(fwd, bwd, 0.01, 2_000_000, Schedule.INTERLEAVED, 2),
                     lambda: simulate_pipeline(fwd, bwd, 0.01, 2000, Schedule.INTERLEAVED, 2, keep_tasks=True),
                     factor=1, repeat=3)
    many = simulate_pipeline(fwd, bwd, 0.01, 2_000_000, Schedule.INTERLEAVED, 2)
    few = simulate_pipeline(fwd, bwd, 0.01, 2000, Schedule.INTERLEAVED, 2)
    # the steady state adds the same seconds per micro-batch
    per_mb = (many.makespan - few.makespan) / (2_000_000 - 2000)
    assert per_mb == pytest.approx(max(f + b for f, b in zip(fwd, bwd, strict=True)), rel=0.02)


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 9), m=st.integers(1, 400), data=st.data(), send=st.sampled_from([0.0, 0.02, 0.3]))
def test_megatron_1f1b_for_many_plans_equals_its_simulation_within_the_drift_bound(p, m, data, send):
    """``one_f_one_b_finish`` (the screen's Megatron-LM 1F1B): stage 0, equal middle stages and
    a last stage as the screen costs them, against the task-by-task simulation: equal to
    rounding where the short run's steady band is periodic or the run is whole, within
    ``DRIFT_BOUND`` where the stages drift."""
    from paraplan.schedule.one_f_one_b import DRIFT_BOUND, one_f_one_b_finish

    fc = data.draw(st.lists(times, min_size=3, max_size=3))
    bc = data.draw(st.lists(times, min_size=3, max_size=3))
    cls = [0] + [1] * (p - 2) + [2]
    fwd, bwd = [fc[c] for c in cls], [bc[c] for c in cls]
    sim = simulate_pipeline(fwd, bwd, send, m, Schedule.ONE_F_ONE_B, fwd_extra_s=0.01, keep_tasks=True)
    dur = np.asarray(task_durations(Schedule.ONE_F_ONE_B, p, 1, fwd, bwd, [0.0] * p, send, send + 0.01)).reshape(-1, 1)
    got = one_f_one_b_finish(p, np.array([m, m]), np.hstack([dur, dur]))
    assert got[:, 0] == pytest.approx(sim.finish, rel=DRIFT_BOUND)
    assert got[:, 1] == pytest.approx(got[:, 0], rel=1e-12)


def test_megatron_1f1b_with_a_periodic_steady_state_is_exact_past_the_short_run():
    from paraplan.schedule.one_f_one_b import one_f_one_b_finish, periodic_short

    p, m = 6, 5 * periodic_short(6)
    fwd, bwd = [1.0, 1.1, 1.1, 1.1, 1.1, 1.6], [2.0, 2.2, 2.2, 2.2, 2.2, 3.0]  # the last stage sets the pace
    sim = simulate_pipeline(fwd, bwd, 0.05, m, Schedule.ONE_F_ONE_B, keep_tasks=True)
    dur = np.asarray(task_durations(Schedule.ONE_F_ONE_B, p, 1, fwd, bwd, [0.0] * p, 0.05, 0.05)).reshape(-1, 1)
    assert one_f_one_b_finish(p, np.array([m]), dur)[:, 0] == pytest.approx(sim.finish, rel=1e-12)
