"""paraplan calibrate gemm-table / attention: a kernel-kind curve fitted to published kernel
measurements (XLA's GEMM table, the FlashAttention papers' benchmarks)."""

from __future__ import annotations

import pytest

pytest.importorskip("scipy")
pytest.importorskip("pandas")

from typer.testing import CliRunner

from paraplan.calibrate.curves import ATTENTION_POINTS, fit_curve, load_attention_points, load_gemm_table
from paraplan.catalog import load_gpu
from paraplan.cli.app import app
from paraplan.specs import ConfigError, EfficiencyCurve, Precision

runner = CliRunner()
SIZES = (1024, 2048, 4096)


def _table(tmp_path, gpu, curve: EfficiencyCurve, *, scale: float = 1.0):
    """A GEMM table in XLA's format whose rows follow ``curve`` on ``gpu`` (times ``scale``)."""
    peak = gpu.flops_for(Precision.BF16)
    lines = ["gpu_key,b,m,n,k,dtype,flops_per_s"]
    for b in (1, 2):
        for m in SIZES:
            for n in SIZES:
                for k in SIZES:
                    flops = 2.0 * b * m * n * k
                    seconds = (flops + curve.half_work) / (peak * curve.max_fraction)
                    lines.append(f"sm_test,{b},{m},{n},{k},bf16xbf16->bf16,{scale * flops / seconds}")
    path = tmp_path / "matmul.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_fit_recovers_the_curve_that_made_the_table(tmp_path):
    gpu = load_gpu("H100-SXM5-80GB")
    truth = EfficiencyCurve(max_fraction=0.7, half_work=3e9)
    fit = fit_curve(load_gemm_table(_table(tmp_path, gpu, truth), "sm_test", "bf16xbf16->bf16", gpu), gpu)
    assert fit.curve.max_fraction == pytest.approx(0.7, rel=0.02)
    assert fit.holdout.median_abs < 2.0
    assert fit.block.startswith("gemm: {max_fraction: 0.7")


def test_a_table_faster_than_the_gpus_peak_is_refused(tmp_path):
    gpu = load_gpu("H100-SXM5-80GB")
    path = _table(tmp_path, gpu, EfficiencyCurve(max_fraction=0.9, half_work=1e6), scale=2.0)
    with pytest.raises(ConfigError, match="above H100-SXM5-80GB's dense bf16 peak"):
        load_gemm_table(path, "sm_test", "bf16xbf16->bf16", gpu)


def test_the_shipped_flash_attention_points_are_read_as_inventory_operators():
    points = load_attention_points()
    assert len(points.ops) == 36
    causal = [op for op in points.ops if op.exec_fraction == 0.5]
    assert len(causal) == 12  # causal forward, head dim 64 and 128, six lengths each
    assert "FlashAttention-2" in points.source


def test_the_attention_command_reproduces_the_h100_catalog_curve():
    result = runner.invoke(app, ["calibrate", "attention", "--gpu", "H100-SXM5-80GB"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    catalog = load_gpu("H100-SXM5-80GB").efficiency.attention
    assert f"attention: {{max_fraction: {catalog.max_fraction:.4f}, half_work: {catalog.half_work:.3g}}}" in result.stdout


def test_the_gemm_table_command_names_a_missing_file_and_an_unknown_key(tmp_path):
    missing = runner.invoke(app, ["calibrate", "gemm-table", str(tmp_path / "nope.csv"), "--gpu-key", "sm_90",
                                  "--gpu", "H100"])
    assert missing.exit_code == 2 and "no such file" in missing.output
    path = _table(tmp_path, load_gpu("H100"), EfficiencyCurve(max_fraction=0.7, half_work=3e9))
    unknown = runner.invoke(app, ["calibrate", "gemm-table", str(path), "--gpu-key", "sm_99", "--gpu", "H100"])
    assert unknown.exit_code == 2 and "no rows for sm_99" in unknown.output
    assert ATTENTION_POINTS.exists()
