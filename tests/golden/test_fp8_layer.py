"""FP8 linear layers against Transformer Engine's own measurement.

Source: NVIDIA Transformer Engine documentation, "GEMM profiling" tutorial
(benchmarks/gemm/benchmark_gemm.py), H200 NVL, a 5B configuration: hidden 4096, FFN 16384,
32 heads, 31 sequences of 512 tokens (M = 15,872), 12 GEMMs per layer, 19.17 TFLOP per layer
forward and backward. Per-layer GEMM time with autocast (quantization included): BF16
32.014 ms, FP8 delayed scaling 18.978 ms, a 1.69x speedup. paraplan's H100/H200 FP8 curve was
fitted to the kernel-only ratio (1.90 here, 1.88-2.09 in FBGEMM): the 1.69 checks the casts and
transposes the inventory adds around each FP8 GEMM. Only the ratio is compared (the H200 NVL
is a 600 W PCIe card whose peak the catalog does not have).
"""

import pytest

from paraplan.catalog import resolve_job
from paraplan.costmodel import AnalyticalCostModel
from paraplan.inventory import OpKind, count_job
from paraplan.specs import Phase

TE_5B = {"name": "te-5b", "num_layers": 2, "hidden_size": 4096, "num_attention_heads": 32,
         "ffn_hidden_size": 16384, "seq_length": 512, "vocab_size": 32000, "add_bias_linear": False}


def _linear_layers(precision: str) -> tuple[float, float]:
    """(seconds, FLOPs) of one layer's GEMMs and FP8 casts, forward and backward."""
    job = resolve_job({"model": TE_5B, "cluster": {"gpu": "H200", "gpus_per_node": 1},
                       "parallel": {"micro_batch_size": 31, "global_batch_size": 31}, "precision": precision})
    cm = AnalyticalCostModel(job.cluster, job.precision)
    ops = [op for op in count_job(job).stages[0].layer_ops if op.kind is OpKind.GEMM or op.name.startswith("fp8_")]
    seconds = sum(cm.estimate_op_s(op, ph) for op in ops for ph in (Phase.FWD, Phase.BWD_INPUT, Phase.BWD_WEIGHT))
    flops = sum(op.flops + op.bwd_flops for op in ops if op.kind is OpKind.GEMM)
    return seconds, flops


def test_the_layer_has_the_gemm_flops_transformer_engine_counts():
    assert _linear_layers("bf16")[1] == pytest.approx(19.17e12, rel=0.001)


def test_fp8_with_its_casts_speeds_the_linear_layers_up_as_much_as_transformer_engine_measured():
    bf16, fp8 = _linear_layers("bf16")[0], _linear_layers("fp8")[0]
    assert bf16 / fp8 == pytest.approx(32.014 / 18.978, rel=0.10)
