"""Transformer Engine's multi-stream grouped GEMM at its concurrency measured on the GPU
(``calibrate.grouped_gemm``, ``efficiency.grouped_gemm``, ``costmodel.roofline.ramps``)."""

import dataclasses

import pytest

from paraplan.calibrate.grouped_gemm import GroupedGemmRow, fit_concurrency, row_concurrency
from paraplan.catalog.loader import load_gpu, load_model
from paraplan.costmodel import estimate_op_s
from paraplan.costmodel.roofline import ramps
from paraplan.inventory.moe import routed_expert_ops
from paraplan.inventory.shapes import ONE_KERNEL_STREAMS, shard_shape
from paraplan.specs import Phase, Precision

# TransformerEngine PR #2045: general_grouped_gemm, TE 2.7 and CUDA 12.9, H100, BF16 (the
# catalog's source quotes them)
TE_2_7_H100 = (GroupedGemmRow(8, 4096, 768, 2048, 627.903), GroupedGemmRow(16, 2048, 768, 2048, 553.945))


def h100():
    return load_gpu("H100-SXM5-80GB")


def expert_fc1(streams: int, ep: int = 8):
    """Qwen3-30B-A3B's experts' up projection on one rank at EP ``ep`` (128 / ep local experts)."""
    x = shard_shape(load_model("qwen3-30b-a3b"), 1, 1, False, 1, Precision.BF16, ep=ep, etp=1,
                    dispatcher="alltoall")
    ops = routed_expert_ops(x, x.moe_ffn, gated=True, activation="swiglu", grouped=True, streams=streams)
    return next(op for op in ops if op.name == "expert_fc1")


def test_the_h100_catalog_concurrency_is_the_median_fitted_to_transformer_engines_own_timings():
    assert fit_concurrency(TE_2_7_H100, h100()) == pytest.approx(h100().efficiency.grouped_gemm.concurrency, abs=0.005)


def test_a_grouped_gemm_measured_as_fast_as_four_streams_filling_the_gpu_fits_a_concurrency_of_four():
    gpu = h100()
    one = expert_fc1(streams=4)
    wave = dataclasses.replace(one, multi_stream_gemms=0)  # priced as 4 experts' summed GEMMs per wave
    seconds = estimate_op_s(wave, Phase.FWD, gpu, gpu.flops_for(Precision.BF16))
    m = one.dims[0][1] // one.multi_stream_gemms
    row = GroupedGemmRow(one.multi_stream_gemms, m, dict(one.dims)["n"], dict(one.dims)["k"], one.flops / seconds / 1e12)
    assert row_concurrency(row, gpu) == pytest.approx(4.0, rel=1e-6)


def test_fewer_gemms_side_by_side_than_the_streams_price_the_grouped_gemm_slower():
    gpu = h100()
    op = expert_fc1(streams=4)
    assert op.multi_stream_gemms == 16 and op.launches == 4
    assert ramps(op, gpu) == pytest.approx(16 / gpu.efficiency.grouped_gemm.concurrency)
    peak = gpu.flops_for(Precision.BF16)
    unmeasured = gpu.model_copy(update={"efficiency": gpu.efficiency.model_copy(update={"grouped_gemm": None})})
    assert estimate_op_s(op, Phase.FWD, gpu, peak) > 1.05 * estimate_op_s(op, Phase.FWD, unmeasured, peak)


def test_torch_grouped_mm_single_kernel_keeps_its_one_ramp():
    op = expert_fc1(streams=ONE_KERNEL_STREAMS)
    assert (op.launches, op.multi_stream_gemms, ramps(op, h100())) == (1, 0, 1)


def test_experts_one_by_one_pay_a_ramp_each_whatever_the_measured_concurrency():
    op = expert_fc1(streams=1)
    assert ramps(op, h100()) == op.launches == 16
