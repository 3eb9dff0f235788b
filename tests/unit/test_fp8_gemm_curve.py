"""Hopper's FP8 GEMM curve: the BF16 curve times the FP8/BF16 ratio of the Maximum Achievable
Matmul FLOPS measured by one tool (Bekman's mamf-finder.py, ml-engineering) on the 700 W SXM
boards: H100 SXM FP8 1402.6 / BF16 794.5 TFLOP/s, H200 SXM FP8 1453.4 / 794.5. Before, the
ratio was 1.91 (same-shape ratios taken on 500-600 W boards), which put the curve's FP8
ceiling (1515 TFLOP/s) above the fastest FP8 matmul measured on an H100 SXM."""

from __future__ import annotations

import copy

import pytest

from paraplan.catalog import load_catalog_entry, load_gpu, resolve_job
from paraplan.costmodel import AnalyticalCostModel
from paraplan.inventory import OpKind, count_job
from paraplan.prediction import predict
from paraplan.specs import Phase, Precision

# (BF16 MAMF, FP8 MAMF) per GPU, TFLOP/s as the table gives them
BF16_MAMF = {"H100-SXM5-80GB": (794.5e12, 1402.6e12), "H200-SXM-141GB": (794.5e12, 1453.4e12)}
RATIO_191 = {"max_fraction": 0.7656, "half_work": 9.34e9}

# GPT-3 175B as NVIDIA ran it in MLPerf Training v3.0 on 768 H100 (tp 4, pp 8, vpp 12), FP8
GPT3_MLPERF = {
    "model": {"name": "gpt3-175b", "num_layers": 96, "hidden_size": 12288, "num_attention_heads": 96,
              "ffn_hidden_size": 49152, "seq_length": 2048, "vocab_size": 50257, "activation": "gelu",
              "position_embedding": "learned", "normalization": "layernorm", "add_bias_linear": True},
    "cluster": {"name": "dgx-h100", "num_nodes": 96, "gpus_per_node": 8},
    "parallel": {"tp": 4, "pp": 8, "vpp": 12, "micro_batch_size": 1, "global_batch_size": 3072,
                 "sequence_parallel": True, "zero_stage": 1},
    "precision": "fp8",
}


def _fp8_gemm(gpu: str):
    return load_gpu(gpu).efficiency.precisions[Precision.FP8].gemm


def _with_fp8_curve(mapping: dict, curve: dict) -> dict:
    """The job with H100 SXM written out inline, its FP8 GEMM curve replaced by ``curve``."""
    out = copy.deepcopy(mapping)
    raw = copy.deepcopy(load_catalog_entry("gpus", "H100-SXM5-80GB"))
    raw.pop("aliases", None)
    raw["efficiency"]["precisions"]["fp8"]["gemm"].update(curve)
    out["cluster"]["gpu"] = raw
    return out


@pytest.mark.parametrize("gpu", sorted(BF16_MAMF))
def test_the_fp8_gemm_curve_is_the_bf16_curve_times_the_measured_mamf_ratio(gpu):
    bf16, fp8 = BF16_MAMF[gpu]
    spec = load_gpu(gpu)
    base, curve = spec.efficiency.gemm, _fp8_gemm(gpu)
    peak_ratio = spec.flops_for(Precision.FP8) / spec.flops_for(Precision.BF16)
    assert curve.max_fraction * peak_ratio / base.max_fraction == pytest.approx(fp8 / bf16, rel=2e-3)
    assert curve.half_work / base.half_work == pytest.approx(fp8 / bf16, rel=2e-3)


def test_the_h100_fp8_curve_never_saturates_above_the_fastest_fp8_matmul_measured_on_it():
    ceiling = _fp8_gemm("H100-SXM5-80GB").max_fraction * load_gpu("H100").flops_for(Precision.FP8)
    assert ceiling <= 1402.6e12 * 1.001
    assert ceiling == pytest.approx(1402.6e12, rel=0.005)


@pytest.mark.parametrize("gpu", ["H100-SXM5-80GB", "H200-SXM-141GB", "H100-PCIe", "H800"])
def test_every_hopper_fp8_curve_cites_the_700_w_mamf_measurement(gpu):
    source = load_gpu(gpu).efficiency.precisions[Precision.FP8].source
    assert "Maximum Achievable Matmul FLOPS" in source and "794.5" in source and "700 W" in source


@pytest.mark.parametrize("gpu", ["H100-PCIe", "H800", "H200-SXM-141GB"])
def test_hoppers_without_their_own_bf16_gemm_fit_say_their_fp8_curve_is_transferred(gpu):
    assert _fp8_gemm(gpu).transferred_from == "H100-SXM5-80GB"


def test_a_large_fp8_gemm_runs_at_the_mamf_ratio_not_the_500_w_ratio():
    job = resolve_job(GPT3_MLPERF)
    old = resolve_job(_with_fp8_curve(GPT3_MLPERF, RATIO_191))
    up = next(op for op in count_job(job).stages[0].layer_ops if op.kind is OpKind.GEMM and op.name == "linear3")
    now = AnalyticalCostModel(job.cluster, job.precision).estimate_op_s(up, Phase.FWD)
    before = AnalyticalCostModel(old.cluster, old.precision).estimate_op_s(up, Phase.FWD)
    assert now / before == pytest.approx(1.91 / (1402.6 / 794.5), rel=0.01)


def test_the_500_w_ratio_switched_back_on_restores_the_previous_curve_and_nothing_else():
    shipped = resolve_job(GPT3_MLPERF).cluster.gpu
    old = resolve_job(_with_fp8_curve(GPT3_MLPERF, RATIO_191)).cluster.gpu
    curve = old.efficiency.precisions[Precision.FP8].gemm
    assert (curve.max_fraction, curve.half_work) == (0.7656, 9.34e9)
    assert old.efficiency.model_copy(update={"precisions": {}}) == shipped.efficiency.model_copy(
        update={"precisions": {}})
    assert old.efficiency.precisions[Precision.FP8].attention == shipped.efficiency.precisions[Precision.FP8].attention


def test_the_mlperf_gpt3_iteration_is_slower_with_the_700_w_ratio_than_with_the_500_w_one():
    now = predict(resolve_job(GPT3_MLPERF)).iteration_s
    before = predict(resolve_job(_with_fp8_curve(GPT3_MLPERF, RATIO_191))).iteration_s
    assert 1.03 < now / before < 1.91 / (1402.6 / 794.5)


def test_a_bf16_job_on_h100_does_not_move_with_the_fp8_curve():
    bf16 = {**GPT3_MLPERF, "precision": "bf16"}
    assert predict(resolve_job(bf16)).iteration_s == predict(
        resolve_job(_with_fp8_curve(bf16, RATIO_191))).iteration_s
