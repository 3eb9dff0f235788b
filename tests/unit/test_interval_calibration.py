"""Calibration shrinks the interval (issue 29): after `paraplan calibrate trace` on the user's
own run, the GPU's curves are measured, so its prediction leaves the uncalibrated regime and its
interval takes the calibrated GPUs' residuals (tests/fixtures/traces/ddp-shapes: a real trace
recorded by `paraplan trace record --mode ddp` with shapes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("scipy")
pytest.importorskip("pandas")

from typer.testing import CliRunner

from paraplan.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
SHAPES = ROOT / "tests" / "fixtures" / "traces" / "ddp-shapes"
JOB = ROOT / "examples" / "tiny-cpu" / "ddp.yaml"
runner = CliRunner()


def _interval(*args: str) -> dict:
    result = runner.invoke(app, ["predict", str(JOB), *args, "--format", "json"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    return {**data["interval"], "notes": data["uncalibrated"]}


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cal") / "mycluster.yaml"
    result = runner.invoke(app, ["calibrate", "trace", str(SHAPES), "--job", str(JOB), "-o", str(out),
                                 "--date", "2026-11-25"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return out


def test_after_calibrate_trace_the_gpu_is_calibrated_and_its_interval_takes_the_calibrated_runs(calibrated):
    before, after = _interval(), _interval("--cluster", str(calibrated))
    assert before["regime"].startswith("GPU uncalibrated") and after["regime"].startswith("GPU calibrated")
    assert not any(n.startswith("cpu-core:") for n in after["notes"])
    assert "runs of GPU calibrated" in after["rule"] and "uncalibrated" not in after["rule"]


def test_a_gemm_curve_fitted_to_a_training_step_is_not_slowed_again_by_a_burst_ratio(calibrated):
    text = calibrated.read_text(encoding="utf-8")
    assert "gemm_fraction: 1.0" in text and "at its sustained" in text


def test_the_calibrated_cluster_file_carries_each_fitted_curves_held_out_error(calibrated):
    import yaml

    from paraplan.specs import ClusterSpec
    from paraplan.uncertainty.interval import measured_curves

    cluster = ClusterSpec.model_validate(yaml.safe_load(calibrated.read_text(encoding="utf-8")))
    curves = {name: (held, err) for name, held, err in measured_curves(cluster.gpu)}
    assert curves["memory"][0] > 0 and curves["memory"][1] is not None
    assert curves["fp32 gemm"][0] > 0 and 0 < curves["fp32 gemm"][1] < 1
    assert curves["fp32 attention"] == (0, None)  # 2 shapes: none held out, no error claimed


def test_calibrating_on_a_trace_narrows_the_interval_by_what_the_closed_loop_measured(calibrated):
    before, after = _interval(), _interval("--cluster", str(calibrated))
    width = lambda iv: iv["log_ratio"][1] - iv["log_ratio"][0]  # noqa: E731
    assert "no dev run on cpu-core" in before["rule"] and "x1.5, both sides" in before["rule"]
    assert "closed loop" in after["rule"] and "held-out median error" in after["rule"]
    assert width(after) < 0.8 * width(before)
