"""Uncertainty intervals (issue 29): split-conformal bounds, regimes, fallbacks, the level."""

from __future__ import annotations

import math

import pytest

from paraplan.specs import ConfigError
from paraplan.uncertainty import check_level, conformal_bounds, conformal_rank, runs_needed
from paraplan.uncertainty.interval import conformal_interval
from paraplan.uncertainty.regimes import Regime, ResidualTable, load_residuals

CAL = Regime("calibrated", "preset", "dense")
MOE = Regime("calibrated", "preset", "moe")


def test_the_rank_is_the_finite_sample_ceil_of_n_plus_one_times_one_minus_half_alpha():
    assert conformal_rank(9, 0.8) == 9  # ceil(10 x 0.9), not 10 from a float a hair above 9
    assert conformal_rank(19, 0.9) == 19
    assert conformal_rank(30, 0.8) == 28  # ceil(31 x 0.9 = 27.9)
    assert runs_needed(0.8) == 9 and runs_needed(0.9) == 19 and runs_needed(0.5) == 3


def test_conformal_bounds_are_the_kth_smallest_and_kth_largest_residual_and_asymmetric():
    residuals = [0.01 * i for i in range(30)]  # 0.00 .. 0.29
    low, high = conformal_bounds(residuals, 0.8)
    assert (low, high) == (residuals[2], residuals[27])
    assert conformal_bounds(residuals[:8], 0.8) is None  # 9 needed at 80 %


def test_a_regime_with_enough_runs_gets_split_conformal_bounds_on_its_own_runs():
    table = ResidualTable.from_rows([(CAL, 0.01 * i) for i in range(10)])
    low, high, rule, fallback, runs = conformal_interval(CAL, 0.8, table)
    assert (low, high, fallback, runs) == (0.0, 0.09, False, 10)
    assert "split conformal on the 10 runs of GPU calibrated, preset, dense" in rule


def test_a_regime_with_too_few_runs_says_so_and_takes_the_wider_pooled_rule():
    rows = [(CAL, 0.01 * i) for i in range(10)] + [(MOE, 0.3)]
    low, high, rule, fallback, _ = conformal_interval(MOE, 0.8, ResidualTable.from_rows(rows, fallback_factor=1.5))
    assert fallback and "too few runs in GPU calibrated, preset, moe (1 run; 9 needed at 80 %)" in rule
    # the pool GPU calibrated, preset (11 runs: 0.00..0.09 and 0.3; k = 11: its extremes), its
    # width x1.5 about its middle
    mid, half = (0.0 + 0.3) / 2, (0.3 - 0.0) / 2 * 1.5
    assert low == pytest.approx(mid - half) and high == pytest.approx(mid + half)


def test_a_level_no_pool_can_give_falls_back_to_the_largest_error_seen_times_the_factor():
    table = ResidualTable.from_rows([(CAL, -0.2), (CAL, 0.1)] * 5, fallback_factor=1.5)
    low, high, rule, fallback, _ = conformal_interval(CAL, 0.99, table)
    assert fallback and (low, high) == pytest.approx((-0.3, 0.3)) and "largest |error|" in rule


@pytest.mark.parametrize("level", [0.0, 1.0, -0.2, 1.5, math.nan])
def test_a_level_outside_zero_to_one_is_a_one_line_error(level):
    with pytest.raises(ConfigError, match="--interval") as raised:
        check_level(level)
    assert "\n" not in str(raised.value)


def test_the_packaged_residuals_say_where_they_came_from_and_hold_the_dev_runs():
    table = load_residuals()
    assert "fit_intervals.py at commit" in table.produced_by and table.sources
    assert len(table.pooled(Regime("*", "*", "*"))) >= 40
    assert len(table.pooled(Regime("uncalibrated", "*", "*"))) >= 9
