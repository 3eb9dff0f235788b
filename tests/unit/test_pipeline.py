"""The pipeline simulation reproduces the schedules' closed forms."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.schedule import simulate_pipeline
from paraplan.specs import Schedule


@given(p=st.integers(1, 8), m=st.integers(1, 32), f=st.floats(0.1, 5), b=st.floats(0.1, 10))
def test_1f1b_with_equal_stages_takes_m_plus_p_minus_1_slots(p, m, f, b):
    result = simulate_pipeline([f] * p, [b] * p, 0.0, m)
    assert result.makespan == pytest.approx((m + p - 1) * (f + b))


@given(p=st.integers(2, 8), m=st.integers(1, 32))
def test_1f1b_bubble_fraction_is_p_minus_1_over_m_plus_p_minus_1(p, m):
    result = simulate_pipeline([1.0] * p, [2.0] * p, 0.0, m)
    assert result.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


@given(p=st.integers(1, 6), m=st.integers(1, 16))
def test_gpipe_takes_as_long_as_1f1b_with_equal_stages(p, m):
    one = simulate_pipeline([1.0] * p, [2.0] * p, 0.0, m)
    gpipe = simulate_pipeline([1.0] * p, [2.0] * p, 0.0, m, Schedule.GPIPE)
    assert gpipe.makespan == pytest.approx(one.makespan)


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 4), (4, 2, 8), (4, 4, 16), (8, 3, 24)])
def test_interleaving_divides_the_bubble_by_the_number_of_chunks(p, v, m):
    """Narayanan et al. SC'21, section 2.2.2: bubble = (p-1)/v * (f+b) with v model chunks."""
    f, b = 1.0, 2.0
    result = simulate_pipeline([f] * p, [b] * p, 0.0, m, Schedule.INTERLEAVED, vpp=v)
    assert result.makespan == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)


def test_the_slowest_stage_sets_the_steady_state_pace():
    fast, slow = 1.0, 2.0
    result = simulate_pipeline([fast, slow, fast, fast], [2 * fast, 2 * slow, 2 * fast, 2 * fast], 0.0, 32)
    assert result.makespan >= 32 * 3 * slow


@given(m=st.integers(1, 16), c=st.floats(0.0, 1.0))
def test_point_to_point_time_never_shortens_the_pipeline(m, c):
    base = simulate_pipeline([1.0] * 4, [2.0] * 4, 0.0, m)
    slower = simulate_pipeline([1.0] * 4, [2.0] * 4, c, m)
    assert slower.makespan >= base.makespan - 1e-9


def test_a_timeline_lists_every_task_once():
    result = simulate_pipeline([1.0] * 3, [2.0] * 3, 0.1, 5, keep_tasks=True)
    assert len(result.tasks) == 3 * 5 * 2
    assert max(t.end for t in result.tasks) == pytest.approx(result.makespan)


def _reference_makespan(fwd, bwd, c, m, v):
    """A direct, slow event loop over Megatron's interleaved order (independent of the
    cached task graph): repeat until every stage has issued all of its tasks."""
    from paraplan.schedule.orders import F, stage_order

    p = len(fwd)
    sched = Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B
    orders = [[(kind != F, ch, j) for kind, ch, j in stage_order(sched, i, p, m, v)] for i in range(p)]
    done, clock, pos = {}, [0.0] * p, [0] * p
    while any(pos[i] < len(orders[i]) for i in range(p)):
        for i in range(p):
            while pos[i] < len(orders[i]):
                back, ch, j = orders[i][pos[i]]
                if not back:
                    key = (i - 1, ch, j, False) if i else ((p - 1, ch - 1, j, False) if ch else None)
                    d = fwd[i] / v + (0 if (i == p - 1 and ch == v - 1) else c)
                else:
                    key = (i + 1, ch, j, True) if i < p - 1 else ((0, ch + 1, j, True) if ch < v - 1 else (i, ch, j, False))
                    d = bwd[i] / v + (0 if (i == 0 and ch == 0) else c)
                if key is not None and key not in done:
                    break
                clock[i] = max(clock[i], done.get(key, 0.0)) + d
                done[(i, ch, j, back)] = clock[i]
                pos[i] += 1
    return max(clock)


@settings(max_examples=100, deadline=None)
@given(
    p=st.integers(2, 6),
    groups=st.integers(1, 8),
    times=st.lists(st.floats(0.1, 3.0), min_size=12, max_size=12),
    c=st.floats(0.0, 0.5),
    v=st.integers(1, 3),
)
def test_the_cached_task_graph_simulates_like_a_direct_event_loop(p, groups, times, c, v):
    fwd, bwd = times[:p], [2 * t for t in times[6 : 6 + p]]
    m = groups * p
    sched = Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B
    result = simulate_pipeline(fwd, bwd, c, m, sched, v)
    assert result.makespan == pytest.approx(_reference_makespan(fwd, bwd, c, m, v), rel=1e-12)
