"""Zero-bubble schedules against the paper's closed forms (equal stages, no transfer time).

Qi, Wan, Huang, Lin, "Zero Bubble Pipeline Parallelism" (ICLR 2024, arXiv 2401.10241):
Section 2.1 / Figure 3: ZB-H1 keeps 1F1B's memory and its bubble is (p - 1)(T_F + T_B - T_W),
a third of 1F1B's (p - 1)(T_F + T_B + T_W) when T_F = T_B = T_W (the authors' comparison
table: bubble rate (p - 1)/m for 1F1B, (p - 1)/(3m) for ZB-H1, 0 for ZB-V; activation
memory 1x for all three). Section 6: ZB-V, two chunks per stage in a V, has no bubble when
T_F = T_B = T_W: each stage is busy from its first task to its last, and only the staggered
start of the first forward remains, (p - 1) chunk forwards of T_F / 2.
"""

from __future__ import annotations

import pytest

from paraplan.schedule import simulate_pipeline
from paraplan.specs import Schedule


def _zb(schedule, p, m, f, b, w, keep=False):
    return simulate_pipeline([f] * p, [b + w] * p, 0.0, m, schedule, keep_tasks=keep, wgrad_s=[w] * p)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("groups", [1, 2, 3])
@pytest.mark.parametrize(("f", "b", "w"), [(1.0, 1.0, 1.0), (1.0, 1.2, 0.8), (1.0, 1.5, 0.5), (2.0, 2.5, 1.5)])
def test_zb_h1_makespan_is_the_papers_m_passes_plus_p_minus_1_times_f_plus_b_minus_w(p, groups, f, b, w):
    m = groups * p
    result = _zb(Schedule.ZB_H1, p, m, f, b, w)
    assert result.makespan == pytest.approx(m * (f + b + w) + (p - 1) * (f + b - w), rel=1e-12)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_zb_h1_bubble_is_a_third_of_1f1bs_when_the_three_passes_take_equal_time(p):
    m = 4 * p
    one = simulate_pipeline([1.0] * p, [2.0] * p, 0.0, m)
    zb = _zb(Schedule.ZB_H1, p, m, 1.0, 1.0, 1.0)
    assert (one.makespan - 3 * m) == pytest.approx(3 * (zb.makespan - 3 * m))


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("groups", [2, 3, 5])
def test_zb_v_has_no_bubble_between_a_stages_first_and_last_task_when_f_b_and_w_are_equal(p, groups):
    m = groups * p
    result = _zb(Schedule.ZB_V, p, m, 1.0, 1.0, 1.0, keep=True)
    for i in range(p):
        first = min(t.start for t in result.tasks if t.stage == i)
        assert result.finish[i] - first == pytest.approx(result.busy[i])
    assert result.makespan == pytest.approx(3 * m + (p - 1) * 0.5)


def test_zb_v_places_chunks_in_a_v_and_sends_nothing_at_the_turn():
    result = _zb(Schedule.ZB_V, 4, 8, 1.0, 1.0, 1.0, keep=True)
    # stage 0 holds both ends of the model: its chunk 1 backward of a micro-batch follows the
    # loss, its chunk 0 backward ends the micro-batch
    first_b1 = min(t.start for t in result.tasks if t.stage == 3 and t.chunk == 1 and t.backward)
    assert first_b1 > 0
    with_p2p = simulate_pipeline([1.0] * 4, [2.0] * 4, 0.25, 8, Schedule.ZB_V, wgrad_s=[1.0] * 4)
    # the last stage sends one activation and one gradient per micro-batch, not two of each
    assert with_p2p.busy[3] == pytest.approx(8 * (3.0 + 0.25 + 0.25))
    assert with_p2p.busy[1] == pytest.approx(8 * (3.0 + 4 * 0.25))
