"""The screen's pipeline formulas (schedule.closed_form) agree with the schedule simulators they
stand in for: finish times exactly for equal stages (every schedule) and for unequal ends
(zero-bubble: task graphs), in-flight micro-batches with the schedule's orders."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.schedule import peak_in_flight, simulate_pipeline
from paraplan.schedule.closed_form import (
    FIRST,
    LAST,
    MID,
    SCHEDULES,
    chunks_per_stage,
    finish_by_class,
    in_flight,
    stage_in_flight,
)
from paraplan.specs import Schedule

CLASSES = (FIRST, MID, LAST)


def _by_class(p: int, m: int, schedule: Schedule, vpp: int, f: dict, b: dict, w: dict, x: float):
    """finish_by_class for one plan, and the simulation of the same stages."""
    one = np.ones(1)
    pp, mm, sched = np.array([p]), np.array([float(m)]), np.array([SCHEDULES.index(schedule)])
    v = chunks_per_stage(sched, np.array([vpp]))
    got = finish_by_class({c: f[c] * one for c in CLASSES}, {c: b[c] * one for c in CLASSES},
                          {c: w[c] * one for c in CLASSES}, x * one, x * one, pp, mm, v, sched)
    cls = [FIRST] + [MID] * (p - 2) + [LAST]
    sim = simulate_pipeline([f[c] for c in cls], [b[c] for c in cls], x, m, schedule, vpp,
                            wgrad_s=[w[c] for c in cls] if schedule.splits_backward else None)
    return got, sim.finish


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 4), (4, 8), (8, 8), (8, 64), (3, 12)])
def test_every_schedules_finish_is_the_simulations_for_equal_stages_without_sends(schedule, p, m):
    vpp = 2 if schedule is Schedule.INTERLEAVED else 1
    even = {c: 1.0 for c in CLASSES}
    got, sim = _by_class(p, m, schedule, vpp, even, {c: 2.2 for c in CLASSES}, {c: 0.7 for c in CLASSES}, 0.0)
    assert got[FIRST][0] == pytest.approx(sim[0], rel=1e-12)
    assert got[LAST][0] == pytest.approx(sim[-1], rel=1e-12)


@pytest.mark.parametrize("schedule", [Schedule.ZB_H1, Schedule.ZB_V])
@pytest.mark.parametrize(("p", "m"), [(2, 1), (4, 3), (8, 8), (8, 64), (5, 200)])
def test_a_zero_bubble_plan_with_heavier_ends_and_sends_finishes_when_its_simulation_does(schedule, p, m):
    """The LM head makes the last stage the slowest (llama-3-8b on 8 stages: 1.6 times the
    middle's forward), which no closed form of Qi et al.'s kind follows."""
    f, b, w = {FIRST: 1.0, MID: 1.0, LAST: 1.6}, {FIRST: 2.4, MID: 2.3, LAST: 3.2}, {FIRST: 0.8, MID: 0.7, LAST: 1.1}
    got, sim = _by_class(p, m, schedule, 1, f, b, w, 0.01)
    assert got[FIRST][0] == pytest.approx(sim[0], rel=1e-9)
    assert got[LAST][0] == pytest.approx(sim[-1], rel=1e-9)
    if p > 2:
        assert got[MID][0] == pytest.approx(max(sim[1:-1]), rel=1e-9)


@pytest.mark.parametrize("schedule", list(Schedule))
@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_the_in_flight_micro_batches_are_those_the_schedules_order_holds(schedule, p):
    """On every stage, for one plan (what predict's memory reads) and per stage class for many
    (what the screen reads): the closed form equals the count on the schedule's order."""
    vpps = (2, 3) if schedule is Schedule.INTERLEAVED else (1,)
    code = np.array([SCHEDULES.index(schedule)])
    for vpp in vpps:
        v = schedule.chunks(vpp)
        for m in range(1, 3 * p + 2):
            if schedule is Schedule.INTERLEAVED and m % p:  # interleaving runs whole rounds of p
                continue
            for stage in range(p):
                assert stage_in_flight(schedule, stage, p, m, vpp) == peak_in_flight(schedule, stage, p, m, v), (
                    vpp, m, stage)
            for c, stage in ((FIRST, 0), (MID, 1), (LAST, p - 1)):
                if c == MID and p < 3:
                    continue
                got = in_flight(c, np.array([float(p)]), np.array([float(m)]), np.array([float(vpp)]), code)[0]
                assert got == peak_in_flight(schedule, stage, p, m, v), (vpp, m, stage)
