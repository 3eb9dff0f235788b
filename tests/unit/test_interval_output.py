"""Every time, rate and cost figure of `paraplan predict` with its interval (issue 29): the
table at 80 columns, JSON and CSV fields, --interval, and the widening for unstated settings."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.cli.loading import interval_of, load_flagged_job, predict_flagged
from paraplan.report.tables import render_prediction
from readable import assert_readable

runner = CliRunner()
JOB = {
    "name": "gpt3-175b-selective-sp",
    "model": "gpt3-175b",
    "cluster": {"name": "dgx-a100", "num_nodes": 8, "price_per_gpu_hour": 2.0},
    "parallel": {"tp": 8, "pp": 8, "vpp": 3, "sequence_parallel": True, "micro_batch_size": 1,
                 "global_batch_size": 64, "recompute": "selective"},
    "precision": "bf16",
    "train_tokens": "300B",
}
# every setting catalog/plausible.yaml widens over, stated
STATED = {"tp_comm_overlap": False, "overlap_grad_reduce": True, "overlap_p2p_comm": True,
          "grad_reduce_in_fp32": True, "attention_kernel": "fa2"}


def _job_file(tmp_path: Path, **parallel) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**JOB, "parallel": {**JOB["parallel"], **parallel}}), encoding="utf-8")
    return path


def _predict(*args: str) -> str:
    result = runner.invoke(app, ["predict", *args], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.stdout


def _interval(path: Path | None):
    job, _ = load_flagged_job(path, {})
    pred, _ = predict_flagged(job, "analytical", None)
    return pred, interval_of(job, pred, 0.8, "analytical", None)


def test_the_table_shows_every_time_rate_and_cost_figure_with_its_interval_within_80_columns(tmp_path):
    pred, interval = _interval(_job_file(tmp_path))
    texts = assert_readable(render_prediction(pred, interval), widths=(80,))
    for label in ("iteration time", "tokens / s", "model TFLOP/s per GPU", "MFU", "$ per million tokens",
                  "time to train", "cost to train"):
        line = next(line for line in texts[80].splitlines() if label in line)
        assert "(80 %: " in line, line
    assert "80 % interval: " in texts[80]


def test_json_gives_each_figure_low_and_high_around_the_regime_rule(tmp_path):
    data = json.loads(_predict(str(_job_file(tmp_path)), "--format", "json"))
    iv = data["interval"]
    low, high = iv["log_ratio"]
    assert iv["level"] == 0.8 and iv["regime"].startswith("GPU calibrated") and iv["rule"]
    assert iv["iteration_s"] == pytest.approx([data["iteration_s"] * math.exp(low), data["iteration_s"] * math.exp(high)])
    # a rate is inverse to the time: its low end is the time's high end
    assert iv["tokens_per_s"] == pytest.approx([data["tokens_per_s"] / math.exp(high), data["tokens_per_s"] / math.exp(low)])
    assert iv["cost_to_train_usd"][0] < data["cost"]["cost_to_train_usd"] < iv["cost_to_train_usd"][1]


def test_csv_gives_each_bound_its_own_column():
    row = next(csv.DictReader(io.StringIO(_predict("--format", "csv"))))
    assert float(row["interval.iteration_s_low"]) < float(row["interval.iteration_s_high"])
    assert float(row["interval.mfu_low"]) < float(row["interval.mfu_high"])


def test_a_higher_level_gives_a_wider_interval():
    def width(level: str) -> float:
        iv = json.loads(_predict("--format", "json", "--interval", level))["interval"]
        return iv["log_ratio"][1] - iv["log_ratio"][0]

    assert width("0.5") < width("0.8") < width("0.95")


@pytest.mark.parametrize("level", ["0", "1", "1.5", "-0.8"])
def test_a_level_outside_zero_to_one_is_one_line_and_exit_2(level):
    result = runner.invoke(app, ["predict", "--interval", level], env={"COLUMNS": "80"})
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0 and "--interval" in result.stderr


def test_a_job_stating_every_setting_gets_a_narrower_interval_than_one_leaving_them_to_defaults(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, guessed = _interval(_job_file(tmp_path / "a"))
    _, stated = _interval(_job_file(tmp_path / "b", **STATED))
    assert stated.guessed == ()  # nothing left to guess
    assert {s.field for s in guessed.guessed} >= {"tp_comm_overlap", "overlap_p2p_comm"}
    assert stated.high - stated.low < guessed.high - guessed.low


def test_the_widening_is_the_recomputed_spread_of_each_unstated_setting(tmp_path):
    job, _ = load_flagged_job(_job_file(tmp_path), {})
    pred, _ = predict_flagged(job, "analytical", None)
    interval = interval_of(job, pred, 0.8, "analytical", None)
    overlap = next(s for s in interval.guessed if s.field == "tp_comm_overlap")
    on, _ = predict_flagged(load_flagged_job(_job_file(tmp_path, tp_comm_overlap=True), {})[0], "analytical", None)
    assert overlap.low == pytest.approx(math.log(on.iteration_s / pred.iteration_s)) and overlap.low < 0


def test_a_runs_file_with_too_few_runs_for_its_regime_warns_naming_the_regime_and_the_fallback(
        tmp_path, gpumodeling_dir):
    runs = json.loads((gpumodeling_dir / "runs_perlmutter.json").read_text(encoding="utf-8"))[:2]
    path = tmp_path / "my_runs.json"
    path.write_text(json.dumps(runs), encoding="utf-8")
    result = runner.invoke(app, ["predict", str(_job_file(tmp_path)), "--runs", str(path), "--format", "json"],
                           env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    warning = next(line for line in result.stderr.splitlines() if line.startswith("warning: --runs"))
    assert "too few runs in GPU calibrated, engine, dense (7 runs; 9 needed at 80 %)" in warning
    assert "the interval's width x1.5" in warning
    assert json.loads(result.stdout)["interval"]["runs"] == 35 + 2  # the pool, the user's runs in it


def test_a_heterogeneous_job_says_its_interval_is_not_widened_for_unstated_settings():
    from test_hetero import gpt2xl_job

    from paraplan.prediction.hetero import predict_hetero

    job = gpt2xl_job((1, 1, 1, 0, 1, 1, 1, 1))
    interval = interval_of(job, predict_hetero(job), 0.8, "analytical", None)
    assert interval.guessed == () and "a heterogeneous job is not widened" in interval.rule


def test_the_learned_backend_says_it_takes_the_analytical_backends_residuals(monkeypatch):
    import paraplan.prediction.entry as entry

    job, _ = load_flagged_job(None, {})
    pred, _ = predict_flagged(job, "analytical", None)
    monkeypatch.setattr(entry, "predict_any", lambda j, **kw: pred)  # no models file needed for the rule
    interval = interval_of(job, pred, 0.8, "learned", None)
    assert "residuals are the analytical backend's (the learned backend has none on the dev runs)" in interval.rule


def test_a_spread_that_rounds_to_zero_prints_as_plus_zero_and_settings_that_moved_nothing_share_one_line():
    from rich.console import Console

    from paraplan.report.tables import render_interval
    from paraplan.uncertainty.guessed import Spread
    from paraplan.uncertainty.interval import Interval
    from paraplan.uncertainty.regimes import Regime

    spreads = (Spread("attention_kernel", "fa3", ("fa2", "sdpa"), -0.078, -0.0002),
               Spread("grad_reduce_in_fp32", True, (False,), -0.0004, 0.0003),
               Spread("overlap_p2p_comm", True, (False,), 0.0, 0.0001))
    interval = Interval(0.8, Regime("calibrated", "engine", "dense"), "a rule", False, -0.1, 0.1, 9, spreads)
    console = Console(width=80, record=True, color_system=None)
    for line in render_interval(interval):
        console.print(line)
    text = " ".join(console.export_text().split())  # the count's line wraps at 80 columns
    assert "-0.0" not in text and "attention_kernel (fa2, sdpa): -7.8 / +0.0 %" in text
    assert "2 unstated settings moved it less than 0.05 %: grad_reduce_in_fp32, overlap_p2p_comm" in text
    assert "widened for unstated grad_reduce_in_fp32" not in text


AUDITED = ["predict", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--num-nodes", "1", "--tp", "1", "--pp", "1",
           "--cp", "8", "--seq-length", "131072", "--micro-batch-size", "1", "--global-batch-size", "8",
           "--framework", "megatron-core", "--recompute", "full"]


def test_an_interval_that_leaves_out_its_prediction_says_so_and_why_in_its_rule():
    result = runner.invoke(app, [*AUDITED, "-f", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    low, high = data["interval"]["iteration_s"]
    rule = data["interval"]["rule"]
    if low > data["iteration_s"]:  # every dev run of its regime measured slower than predicted
        assert "lies wholly above the prediction" in rule and "measured slower" in rule
    elif high < data["iteration_s"]:
        assert "lies wholly below the prediction" in rule
    else:
        assert "lies wholly" not in rule


def test_the_one_sided_remark_is_made_exactly_when_the_bounds_leave_out_the_point():
    from paraplan.uncertainty.interval import one_sided

    assert one_sided(-0.1, 0.2) == one_sided(0.0, 0.0) == ""
    assert "above the prediction (from +1.0 %)" in one_sided(math.log(1.01), 0.2)
    assert "below the prediction (up to -2.0 %)" in one_sided(-0.3, math.log(0.98))
