"""Megatron-LM's interleaved 1F1B task graph built in closed form (``schedule.interleaved``) is the
general builder's, its levels the longest chains, and ``pipeline_finish`` through it times every
plan as the simulation does, with blocking or asynchronous sends; so do the shared runs of
``schedule.interleaved_runs``."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.schedule import interleaved, interleaved_runs
from paraplan.schedule.graph import graph_levels
from paraplan.schedule.one_f_one_b import DRIFT_BOUND
from paraplan.schedule.pipeline import (
    _flat_structure,
    _last_task,
    _stage0_done,
    _structure,
    pipeline_finish,
    simulate_pipeline,
    task_durations,
)
from paraplan.specs import Schedule

IL = Schedule.INTERLEAVED


@pytest.mark.parametrize(("p", "m", "v"), [(2, 2, 2), (2, 4, 3), (4, 4, 2), (4, 12, 3), (3, 6, 4), (8, 16, 2), (5, 10, 2)])
def test_the_closed_form_graph_is_the_general_builders_graph_with_its_longest_chains_as_levels(p, m, v):
    kinds, prev, dep, _ = interleaved.graph_arrays(p, m, v)
    structure = _structure(IL, p, m, v)
    seen = [0] * p
    node = []  # general id -> ours: the stage's position in its order
    for i, *_ in structure:
        node.append(i * 2 * m * v + seen[i])
        seen[i] += 1
    node = np.array(node)
    assert np.array_equal(kinds[node], [(i * v + c) * 3 + kind for i, c, kind, _, _, _ in structure])
    assert np.array_equal(prev[node], [node[t[4]] if t[4] >= 0 else -1 for t in structure])
    assert np.array_equal(dep[node], [node[t[5]] if t[5] >= 0 else -1 for t in structure])
    assert np.array_equal(node[list(_last_task(IL, p, m, v))], interleaved.last_tasks(p, m, v))
    assert np.array_equal(node[list(_stage0_done(IL, p, m, v))], interleaved.stage0_done(p, m, v))
    levels, _ = interleaved.levels(p, m, v)
    assert len(levels) == len(graph_levels(*_flat_structure(IL, p, m, v))[0])  # as few levels


@settings(max_examples=30, deadline=None)
@given(p=st.integers(2, 6), v=st.integers(2, 4), runs=st.integers(1, 12), overlap=st.booleans(), data=st.data(),
       send=st.sampled_from([0.0, 0.02, 0.3]))
def test_pipeline_finish_times_interleaved_plans_as_the_simulation_does(p, v, runs, overlap, data, send):
    """Unequal stages (a heavier last one, as with an LM head), sends held or asynchronous."""
    m = p * runs
    fwd = data.draw(st.lists(st.floats(0.1, 3.0), min_size=p, max_size=p))
    bwd = data.draw(st.lists(st.floats(0.1, 3.0), min_size=p, max_size=p))
    held = 0.0 if overlap else 1.0
    dur = np.asarray(task_durations(IL, p, v, fwd, bwd, [0.0] * p, held * send, held * (send + 0.01)))
    arrival = np.array([[send + 0.01], [send]]) if overlap else None
    got = pipeline_finish(IL, p, m, v, dur.reshape(-1, 1), arrival)[:, 0]
    sim = simulate_pipeline(fwd, bwd, send, m, IL, v, fwd_extra_s=0.01, overlap_p2p=overlap)
    assert got == pytest.approx(sim.finish, rel=1e-12, abs=0.0)


@settings(max_examples=25, deadline=None)
@given(p=st.integers(2, 5), v=st.integers(2, 4), overlap=st.booleans(), data=st.data(),
       send=st.sampled_from([0.0, 0.02, 0.3]))
def test_one_run_per_column_times_every_micro_batch_count_as_the_simulation_does(p, v, overlap, data, send):
    """interleaved_finish: plans of many micro-batch counts (up to past its shared run, where the
    run's repeat or a longer run times them) sharing two columns of unequal stages."""
    held = 0.0 if overlap else 1.0
    stages = [(data.draw(st.lists(st.floats(0.1, 3.0), min_size=p, max_size=p)),
               data.draw(st.lists(st.floats(0.1, 3.0), min_size=p, max_size=p))) for _ in range(2)]
    dur = np.stack([np.asarray(task_durations(IL, p, v, fwd, bwd, [0.0] * p, held * send, held * (send + 0.01)))
                    for fwd, bwd in stages], axis=1)
    arrival = np.array([[send + 0.01] * 2, [send] * 2]) if overlap else None
    runs = data.draw(st.lists(st.integers(1, 3 * interleaved_runs.long_run(p, v) // p), min_size=1, max_size=4))
    m = np.array([p * r for r in runs])
    column = np.array(data.draw(st.lists(st.integers(0, 1), min_size=len(m), max_size=len(m))))
    got = interleaved_runs.interleaved_finish(p, v, m, dur, column, arrival)
    for j in range(len(m)):
        fwd, bwd = stages[column[j]]
        sim = simulate_pipeline(fwd, bwd, send, int(m[j]), IL, v, fwd_extra_s=0.01, overlap_p2p=overlap)
        exact = m[j] <= interleaved_runs.long_run(p, v)  # past the run: its repeat (exact) or a drift bracket
        assert got[:, j] == pytest.approx(sim.finish, rel=1e-12 if exact else DRIFT_BOUND, abs=0.0)


def test_drifting_stages_past_the_run_are_timed_inside_the_drift_bound_from_a_bracket(monkeypatch):
    """Four stages of two chunks alternately 3 % faster and slower, sends held: at 160
    micro-batches the stages still drift past the shared run of 40 (no repeat), and the
    middle of the bracket between the run's last period and the slowest stage's pace is within
    0.1 % of the simulation; a plan inside the run stays exact."""
    p, v = 4, 2
    fwd, bwd = [0.97, 1.03, 0.97, 1.03], [1.94, 2.06, 1.94, 2.06]
    dur = np.asarray(task_durations(IL, p, v, fwd, bwd, [0.0] * p, 0.02, 0.03)).reshape(-1, 1)
    bracketed = []
    real = interleaved_runs.drift_bracket

    def spy(*args):
        finish, narrow = real(*args)
        bracketed.append(int(narrow.sum()))
        return finish, narrow

    monkeypatch.setattr(interleaved_runs, "drift_bracket", spy)
    m = np.array([interleaved_runs.long_run(p, v), 160])
    got = interleaved_runs.interleaved_finish(p, v, m, dur, np.zeros(2, dtype=np.int64))
    assert sum(bracketed) == 1
    for j, exact in ((0, 1e-12), (1, DRIFT_BOUND)):
        sim = simulate_pipeline(fwd, bwd, 0.02, int(m[j]), IL, v, fwd_extra_s=0.01)
        assert got[:, j] == pytest.approx(sim.finish, rel=exact, abs=0.0)


@pytest.mark.parametrize(("p", "v", "overlap"), [(2, 2, True), (4, 3, False), (8, 2, True), (16, 3, False)])
def test_the_window_of_rows_gives_the_whole_graphs_ends_bit_for_bit(p, v, overlap):
    """graph.window_ends steps the levels through a few spans of rows, sliding kept rows out:
    every kept row's end is level_ends', whatever the rows kept and however far evaluated,
    with the run's delays or without them."""
    from paraplan.schedule.graph import level_ends, window_ends

    rng = np.random.default_rng(p * v)
    k = interleaved_runs.long_run(p, v)
    ordered = interleaved_runs._run(p, k, v)[0]
    lv = interleaved.levels(p, k, v, overlap)[0]
    dur = rng.random((3 * p * v + 3, 7))
    for upto in (None, len(lv) // 2, 3):
        whole = level_ends(lv, dur, upto)
        keep = np.unique(rng.integers(1, whole.shape[0], 200))
        assert np.array_equal(window_ends(ordered, dur, keep, upto, overlap), whole[keep])


@pytest.mark.parametrize(("p", "v"), [(2, 2), (2, 8), (3, 2), (4, 3), (5, 4), (8, 6), (16, 3)])
def test_every_run_past_the_warm_up_has_the_same_tail_reading_tasks_a_period_later(p, v):
    """_tail builds the tail once per (p, v) and shifts what it reads: for every m from
    _steady_tail(p, v) to the shared run, the tail built for that m is the same graph and reads
    the same tasks 2 p v positions later per p micro-batches."""
    k = interleaved_runs.long_run(p, v)
    for m in range(interleaved_runs._steady_tail(p, v), k + 1, p):
        levels, finals, size, stage, pos = interleaved_runs._tail_graph(p, m, v)
        _, shared, shared_finals, shared_size, nodes_k = interleaved_runs._tail(p, m, v, k)
        assert size == shared_size and np.array_equal(finals, shared_finals) and len(levels) == len(shared)
        for ours, theirs in zip(levels, shared, strict=True):
            assert ours[:2] == theirs[:2] and all(np.array_equal(x, y) for x, y in zip(ours[2:], theirs[2:], strict=True))
        assert np.array_equal(stage * 2 * k * v + pos, nodes_k)
