"""Error statistics of validated runs: signed median, median and p90 of |error|."""

from __future__ import annotations

import pytest

from paraplan.validate.stats import error_stats


def test_stats_of_known_errors_match_hand_computed_values():
    s = error_stats("x", [-0.10, 0.02, -0.04, 0.30, -0.06])
    assert s.n == 5
    assert s.signed_median == pytest.approx(-0.04)
    assert s.median_abs == pytest.approx(0.06)
    # |errors| sorted: .02 .04 .06 .10 .30; the 90th percentile lies at rank 3.6
    assert s.p90_abs == pytest.approx(0.10 + 0.6 * 0.20)
    assert s.mean_abs == pytest.approx(0.104)
    assert s.worst == pytest.approx(0.30)


def test_a_single_run_is_its_own_median_and_p90():
    s = error_stats("one", [-0.2])
    assert (s.signed_median, s.median_abs, s.p90_abs, s.worst) == pytest.approx((-0.2, 0.2, 0.2, -0.2))


def test_no_runs_is_an_error_naming_the_group():
    with pytest.raises(ValueError, match="H100: no runs"):
        error_stats("H100", [])
