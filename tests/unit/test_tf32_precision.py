"""The tf32 precision (issue 25 item 6): fp32 training whose matmuls run on TF32 tensor cores,
at the GPU's own dense TF32 peak; everything else (storage, memory-bound operators) as fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from paraplan.catalog import resolve_job
from paraplan.catalog.jobs import read_job_mapping
from paraplan.cli.app import app
from paraplan.costmodel.roofline import AnalyticalCostModel
from paraplan.inventory import Op, OpKind
from paraplan.prediction import predict
from paraplan.specs import Phase, Precision

MISTRAL = Path(__file__).resolve().parents[2] / "examples" / "mistral-7b-one-node.yaml"  # 8 x A100-SXM4-80GB
runner = CliRunner()


def mistral(precision: str):
    return resolve_job({**read_job_mapping(MISTRAL), "precision": precision}, base_dir=MISTRAL.parent)


def test_tf32_keeps_fp32_storage_and_has_no_master_weights():
    assert Precision.TF32.full_width and Precision.FP32.full_width
    assert not any(p.full_width for p in (Precision.BF16, Precision.FP16, Precision.FP8))


def test_a_tf32_job_on_a100_is_faster_than_the_same_fp32_job_and_needs_the_same_memory():
    fp32, tf32, bf16 = (predict(mistral(p)) for p in ("fp32", "tf32", "bf16"))
    # the GEMMs move from the 19.5 TFLOP/s fp32 peak to the 156 TFLOP/s TF32 tensor cores
    assert tf32.iteration_s < fp32.iteration_s / 4
    assert bf16.iteration_s < tf32.iteration_s  # and 16-bit tensor cores are faster still
    assert tf32.worst_memory.total == fp32.worst_memory.total  # 4-byte weights, grads, activations
    assert tf32.worst_memory.total > bf16.worst_memory.total


def test_a_tf32_jobs_matmuls_take_the_tf32_peak_and_its_memory_bound_operators_time_as_fp32():
    fp32, tf32 = (AnalyticalCostModel(mistral(p).cluster, Precision(p)) for p in ("fp32", "tf32"))
    assert (fp32.peak_flops, tf32.peak_flops) == (19.5e12, 156e12)
    norm = Op(name="layernorm", kind=OpKind.NORM, role="norm", flops=0.0, bytes=2e9, bwd_flops=0.0, bwd_bytes=4e9)
    assert tf32.estimate_op_s(norm, Phase.FWD) == fp32.estimate_op_s(norm, Phase.FWD)


def test_a_tf32_prediction_says_its_gemm_curve_is_not_measured_in_tf32():
    notes = predict(mistral("tf32")).uncalibrated
    assert any("tf32 gemm kernels" in note for note in notes)


def test_paraplan_predict_takes_precision_tf32():
    result = runner.invoke(app, ["predict", str(MISTRAL), "--precision", "tf32"], terminal_width=80)
    assert result.exit_code == 0, result.output
    assert "tf32" in result.stdout


def test_paraplan_predict_with_tf32_on_a_v100_says_in_one_line_it_has_no_tf32_peak():
    result = runner.invoke(app, ["predict", str(MISTRAL), "--precision", "tf32", "--gpu", "V100"], terminal_width=80)
    assert result.exit_code == 2
    assert result.output.strip() == "error: precision: GPU V100-SXM2-32GB has no tf32 peak (it has: fp32, fp16)"


@pytest.mark.parametrize("word", ["TF32", "fp32 (tf32)"])
def test_a_published_run_recorded_in_tf32_is_read_as_tf32_not_fp32(word):
    from paraplan.validate.records import _precision

    assert _precision(word) == "tf32"
