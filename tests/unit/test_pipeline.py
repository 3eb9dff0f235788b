"""The pipeline simulation reproduces the schedules' closed forms."""

import pytest
from hypothesis import given
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
