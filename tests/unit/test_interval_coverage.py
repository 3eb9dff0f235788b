"""Coverage without peeking (issue 29): leave one source out of the dev runs; each source's runs
get intervals from the other sources' residuals only. Needs ../shared (skips without)."""

from __future__ import annotations

import pytest

from paraplan.uncertainty import load_residuals
from paraplan.uncertainty.coverage import coverage_rows, leave_one_source_out
from paraplan.validate import load_runs, validate_runs
from paraplan.validate.residuals import held_runs


@pytest.fixture(scope="module")
def dev_runs(published_dir, gpumodeling_dir):
    files = (published_dir / "runs_dev.json", published_dir / "runs_dev_modern.json",
             gpumodeling_dir / "runs_perlmutter.json")
    return held_runs(r for f in files for r in validate_runs(load_runs(f), skipped=[]))


def test_an_80_percent_interval_covers_70_to_90_percent_of_the_left_out_sources_runs(dev_runs):
    rows = {row.group: row for row in coverage_rows(leave_one_source_out(dev_runs, 0.8))}
    overall = rows["all runs"]
    assert overall.n >= 40
    assert 0.70 <= overall.covered <= 0.90, overall


def test_the_packaged_residuals_are_those_of_todays_predictions(dev_runs):
    """The catalog is rewritten by benchmarks/fit_intervals.py when a prediction changes."""
    table = load_residuals()
    for regime in {h.regime for h in dev_runs}:
        mine = sorted(h.residual for h in dev_runs if h.regime == regime)
        assert table.residuals[regime] == pytest.approx(mine, abs=1e-4), regime.name
