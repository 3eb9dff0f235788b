"""An interval holds only for runs exchangeable with the dev runs it came from (issue 29): a GPU
whose architecture has no dev run in its regime, or any pool of it, gets the wide stated rule
and says so, naming the GPU; a GPU with dev runs on its architecture keeps its regime's bounds."""

from __future__ import annotations

import json
import math

from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.uncertainty.interval import conformal_interval
from paraplan.uncertainty.regimes import Regime, ResidualTable, load_residuals

runner = CliRunner()
CAL = Regime("calibrated", "preset", "dense")
UNCAL = Regime("uncalibrated", "preset", "dense")


def _table() -> ResidualTable:
    rows = [(CAL, r / 100, "Ampere") for r in range(-5, 6)] + [(UNCAL, 0.15 + r / 100, "Hopper") for r in range(10)]
    return ResidualTable.from_rows(rows)


def _json_interval(*args: str) -> dict:
    result = runner.invoke(app, ["predict", *args, "--format", "json"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["interval"]


def test_a_gpu_whose_architecture_has_dev_runs_in_its_regime_keeps_the_split_conformal_bounds():
    table = _table()
    assert conformal_interval(UNCAL, 0.8, table, frozenset({"Hopper"}), "H100") == conformal_interval(UNCAL, 0.8, table)


def test_an_uncalibrated_gpu_of_an_architecture_without_dev_runs_gets_the_widest_rule_naming_it():
    table = _table()
    low, high, rule, fallback, _ = conformal_interval(UNCAL, 0.8, table, frozenset({"CDNA 3"}), "MI300X")
    worst = 0.24 * 1.5
    assert (low, high) == (-worst, worst) and fallback
    assert "no dev run on MI300X (CDNA 3)" in rule and "x1.5, both sides" in rule
    tight_low, tight_high, *_ = conformal_interval(UNCAL, 0.8, table)
    assert high - low > 3 * (tight_high - tight_low)


def test_a_closed_loop_error_widens_a_calibrated_regime_for_an_unseen_gpu_but_never_an_uncalibrated_one():
    table = _table()
    loop = (0.1, "a measured error")
    low, high, rule, *_ = conformal_interval(CAL, 0.8, table, frozenset({"cpu-core"}), "cpu-core", loop)
    base_low, base_high, *_ = conformal_interval(CAL, 0.8, table)
    assert math.isclose(low, base_low - 0.1) and math.isclose(high, base_high + 0.1)
    assert "closed loop" in rule
    wide = conformal_interval(UNCAL, 0.8, table, frozenset({"cpu-core"}), "cpu-core", loop)
    assert "closed loop" not in wide[2] and wide[0] == -0.24 * 1.5


def test_the_packaged_residuals_record_the_architectures_their_runs_were_measured_on():
    table = load_residuals()
    assert table.architectures_in(Regime("uncalibrated", "*", "dense")) == {"Hopper"}
    assert table.architectures_in(Regime("uncalibrated", "*", "moe")) == {"Hopper", "Blackwell"}
    assert "Ampere" in table.architectures_in(Regime("calibrated", "*", "*"))


def test_an_mi300x_prediction_is_not_given_the_h100_runs_interval():
    h100 = _json_interval("--gpu", "H100-SXM5-80GB")
    mi300x = _json_interval("--cluster", "azure-nd-mi300x-v5")
    assert "no dev run on MI300X" in mi300x["rule"] and "no dev run" not in h100["rule"]
    width = lambda iv: iv["log_ratio"][1] - iv["log_ratio"][0]  # noqa: E731
    assert width(mi300x) > width(h100)


def test_two_plans_on_different_architectures_share_no_error_in_a_comparison():
    from paraplan.uncertainty.pair import ratio_interval

    hopper, cdna = frozenset({"Hopper"}), frozenset({"CDNA 3"})
    shared = ratio_interval(UNCAL, UNCAL, 1.0, 0.8, architectures=(hopper, hopper), gpus=("H100", "H200"))
    apart = ratio_interval(UNCAL, UNCAL, 1.0, 0.8, architectures=(hopper, cdna), gpus=("H100", "MI300X"))
    assert "errors shared" in shared.rule and "different GPU architectures" in apart.rule
    assert apart.high - apart.low > shared.high - shared.low


def test_a_calibrated_gpu_does_not_borrow_the_bounds_of_uncalibrated_runs_on_its_architecture():
    low, high, rule, *_ = conformal_interval(CAL, 0.8, _table(), frozenset({"Hopper"}), "GH200")
    assert (low, high) == (-0.24 * 1.5, 0.24 * 1.5)
    assert "no dev run on GH200 (Hopper) among the calibrated GPUs' runs (they ran on Ampere)" in rule


def test_an_unseen_architecture_takes_the_largest_error_of_its_own_kind_of_model():
    moe = Regime("uncalibrated", "preset", "moe")
    table = ResidualTable.from_rows([(CAL, r / 100, "Ampere") for r in range(-5, 6)]
                                    + [(moe, 0.5 - r / 10, "Hopper") for r in range(10)])
    _, dense_high, rule, *_ = conformal_interval(UNCAL, 0.8, table, frozenset({"CDNA 3"}), "MI300X")
    assert math.isclose(dense_high, 0.05 * 1.5) and "dense runs" in rule
    _, moe_high, rule, *_ = conformal_interval(moe, 0.8, table, frozenset({"CDNA 3"}), "MI300X")
    assert math.isclose(moe_high, 0.5 * 1.5) and "moe runs" in rule
