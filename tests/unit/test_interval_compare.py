"""`paraplan compare` with intervals (issue 29): both plans' intervals, and whether B differs
from A judged on the ratio B / A, whose error two plans in one regime largely share."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.cli.loading import load_flagged_job, pair_intervals, predict_flagged
from paraplan.prediction.compare import compare_predictions
from paraplan.report.compare import render_comparison
from paraplan.uncertainty import Regime, load_residuals
from paraplan.uncertainty.interval import conformal_interval
from paraplan.uncertainty.pair import ratio_interval
from readable import assert_readable

runner = CliRunner()
CALIBRATED = Regime("calibrated", "preset", "dense")
JOB = {
    "name": "gpt3-175b",
    "model": "gpt3-175b",
    "cluster": {"name": "dgx-a100", "num_nodes": 8, "price_per_gpu_hour": 2.0},
    "parallel": {"tp": 8, "pp": 8, "vpp": 3, "sequence_parallel": True, "micro_batch_size": 1,
                 "global_batch_size": 64, "recompute": "selective", "tp_comm_overlap": False,
                 "overlap_grad_reduce": True, "overlap_p2p_comm": True, "grad_reduce_in_fp32": True,
                 "attention_kernel": "fa2"},
    "precision": "bf16",
    "train_tokens": "300B",
}


def _job_file(path: Path, nodes: int = 8) -> Path:
    path.write_text(yaml.safe_dump({**JOB, "cluster": {**JOB["cluster"], "num_nodes": nodes}}), encoding="utf-8")
    return path


def _compare(*args: str) -> str:
    result = runner.invoke(app, ["compare", *args], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.stdout


def test_two_plans_in_one_regime_get_a_ratio_interval_narrower_than_their_own_intervals_combined():
    low, high, *_ = conformal_interval(CALIBRATED, 0.8, load_residuals())
    ratio = ratio_interval(CALIBRATED, CALIBRATED, 1.0, 0.8)
    assert "errors shared" in ratio.rule and "one source" in ratio.rule
    assert ratio.high - ratio.low < (high - low) * 2  # what disjoint ranges would ask for


def test_plans_in_different_regimes_share_no_error_and_take_the_conservative_sum():
    other = Regime("uncalibrated", "preset", "dense")
    table = load_residuals()
    a_low, a_high, *_ = conformal_interval(CALIBRATED, 0.8, table)
    b_low, b_high, *_ = conformal_interval(other, 0.8, table)
    ratio = ratio_interval(CALIBRATED, other, 1.0, 0.8)
    assert (ratio.low, ratio.high) == pytest.approx((b_low - a_high, b_high - a_low))
    assert "different regimes" in ratio.rule


def test_the_same_plan_twice_is_within_the_uncertainty():
    assert ratio_interval(CALIBRATED, CALIBRATED, 1.0, 0.8).verdict == "within"


def test_half_the_gpus_is_slower_beyond_the_uncertainty_and_the_table_says_so_within_80_columns(tmp_path):
    jobs = [load_flagged_job(_job_file(tmp_path / f"{n}.yaml", n), {})[0] for n in (16, 8)]
    a, b = (predict_flagged(j, "analytical", None)[0] for j in jobs)
    bounds = pair_intervals(*jobs, a, b, 0.8, "analytical", None)
    assert bounds[2].verdict == "slower" and bounds[2].guessed == ()  # everything stated
    texts = assert_readable(render_comparison(compare_predictions(a, b), ("A", "B"), bounds), widths=(80,))
    assert texts[80].count("80 % interval") >= 6  # time, tokens/s, MFU, $ per Mtok, time and cost to train
    assert "B is slower than A beyond the uncertainty" in " ".join(texts[80].split())


def test_json_and_csv_carry_both_intervals_and_the_ratio(tmp_path):
    files = [str(_job_file(tmp_path / f"{n}.yaml", n)) for n in (16, 8)]
    iv = json.loads(_compare(*files, "--format", "json"))["interval"]
    assert iv["a"]["iteration_s"][0] < iv["a"]["iteration_s"][1] < iv["b"]["iteration_s"][0]
    assert iv["b_over_a"]["verdict"] == "slower" and iv["b_over_a"]["iteration_ratio_bounds"][0] > 1
    rows = {r["figure"]: r for r in csv.DictReader(io.StringIO(_compare(*files, "--format", "csv")))}
    assert float(rows["interval.iteration_s.low"]["a"]) < float(rows["interval.iteration_s.high"]["a"])
    assert float(rows["interval.b_over_a.iteration_s.low"]["relative"]) > 0


def test_an_unstated_setting_widens_the_ratio_by_its_recomputed_spread_in_both_plans_at_once():
    result = json.loads(_compare("--vs", "tp=4", "--format", "json"))["interval"]["b_over_a"]
    fields = {g["field"] for g in result["guessed_settings"]}
    assert "tp_comm_overlap" in fields


def test_a_level_outside_zero_to_one_is_one_line():
    result = runner.invoke(app, ["compare", "--vs", "tp=4", "--interval", "2"], env={"COLUMNS": "80"})
    assert result.exit_code == 2 and result.stderr.strip().count("\n") == 0
