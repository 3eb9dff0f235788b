"""Megatron-LM's 1F1B for many plans at once (``schedule.one_f_one_b``): its task graph built in
closed form is the general builder's, and every plan it times agrees with the simulation."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.schedule.graph import graph_levels
from paraplan.schedule.one_f_one_b import graph_arrays, one_f_one_b_finish, periodic_short
from paraplan.schedule.pipeline import _flat_structure, _structure, simulate_pipeline, task_durations
from paraplan.specs import Schedule

times = st.floats(0.1, 3.0)


@pytest.mark.parametrize("p", [2, 3, 5, 8])
@pytest.mark.parametrize("m", [1, 2, 4, 7, 9, 20])
def test_the_closed_form_graph_is_the_general_builders_graph_with_its_longest_chains_as_levels(p, m):
    kinds, prev, dep, level = graph_arrays(p, m)
    structure = _structure(Schedule.ONE_F_ONE_B, p, m, 1)
    node = np.array([(2 * i + kind) * m + j for i, _, kind, j, _, _ in structure])  # general id -> ours
    assert np.array_equal(kinds[node], [3 * i + kind for i, _, kind, _, _, _ in structure])
    assert np.array_equal(prev[node], [node[t[4]] if t[4] >= 0 else -1 for t in structure])
    assert np.array_equal(dep[node], [node[t[5]] if t[5] >= 0 else -1 for t in structure])
    levels, _ = graph_levels(*_flat_structure(Schedule.ONE_F_ONE_B, p, m, 1))
    assert level.max() == len(levels)  # as few levels as the general builder's


def _classes(p, fc, bc, send):
    cls = [0] + [1] * (p - 2) + [2]
    fwd, bwd = [fc[c] for c in cls], [bc[c] for c in cls]
    dur = np.asarray(task_durations(Schedule.ONE_F_ONE_B, p, 1, fwd, bwd, [0.0] * p, send, send + 0.01))
    return fwd, bwd, dur.reshape(-1, 1)


@settings(max_examples=30, deadline=None)
@given(p=st.integers(2, 9), data=st.data(), send=st.sampled_from([0.0, 0.02, 0.3]))
def test_every_micro_batch_count_up_to_the_short_run_is_timed_to_rounding_from_that_one_run(p, data, send):
    """The runs of fewer micro-batches share the short run's tasks up to their cool-down."""
    fc = data.draw(st.lists(times, min_size=3, max_size=3))
    bc = data.draw(st.lists(times, min_size=3, max_size=3))
    fwd, bwd, dur = _classes(p, fc, bc, send)
    ms = np.arange(1, periodic_short(p) + 1)
    got = one_f_one_b_finish(p, ms, np.repeat(dur, len(ms), axis=1))
    for q, m in enumerate(ms.tolist()):
        sim = simulate_pipeline(fwd, bwd, send, m, Schedule.ONE_F_ONE_B, fwd_extra_s=0.01, keep_tasks=True)
        assert got[:, q] == pytest.approx(sim.finish, rel=1e-12, abs=0.0)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(2, 9), data=st.data(), send=st.sampled_from([0.0, 0.02, 0.3]), extra=st.integers(0, 40))
def test_where_the_last_stage_paces_the_pipeline_its_closed_form_is_the_simulation(p, data, send, extra):
    """Per-stage times (not only three classes) with a heavier last stage, so that the
    condition often holds; where it does, the closed form equals the simulation to rounding."""
    from paraplan.schedule.one_f_one_b import _paced_by_last, _paced_finish

    fwd = data.draw(st.lists(times, min_size=p, max_size=p))
    bwd = data.draw(st.lists(times, min_size=p, max_size=p))
    bwd[-1] += data.draw(st.floats(0.0, 3.0))
    dur = np.asarray(task_durations(Schedule.ONE_F_ONE_B, p, 1, fwd, bwd, [0.0] * p, send, send + 0.01)).reshape(-1, 1)
    if not _paced_by_last(p, dur)[0]:
        return
    m = p + extra
    sim = simulate_pipeline(fwd, bwd, send, m, Schedule.ONE_F_ONE_B, fwd_extra_s=0.01, keep_tasks=True)
    paced = _paced_finish(p, dur)[:, 0] + (m - 1) * (dur[-3, 0] + dur[-2, 0])
    assert paced == pytest.approx(sim.finish, rel=1e-12)
    assert one_f_one_b_finish(p, np.array([m]), dur)[:, 0] == pytest.approx(sim.finish, rel=1e-12)


def test_the_closed_form_is_refused_where_a_stage_is_slower_than_the_last():
    """Stage 0 takes 1.1 s a micro-batch, the last stage 1.0 s: the last stage's pace would be
    2.6 % fast; the plan is timed from its task graph instead."""
    from paraplan.schedule.one_f_one_b import _paced_by_last, _paced_finish

    p, m = 4, 12
    fwd, bwd = [0.5, 0.3, 0.3, 0.4], [0.6, 0.5, 0.5, 0.6]
    dur = np.asarray(task_durations(Schedule.ONE_F_ONE_B, p, 1, fwd, bwd, [0.0] * p, 0.0, 0.0)).reshape(-1, 1)
    sim = simulate_pipeline(fwd, bwd, 0.0, m, Schedule.ONE_F_ONE_B, keep_tasks=True)
    paced = _paced_finish(p, dur)[:, 0] + (m - 1) * 1.0
    assert not _paced_by_last(p, dur)[0]
    assert paced[0] == pytest.approx(14.7) and sim.finish[0] == pytest.approx(15.1)
    assert one_f_one_b_finish(p, np.array([m]), dur)[:, 0] == pytest.approx(sim.finish, rel=1e-12)
