"""Attention as H100 measured it (issue 27 item 4): cuDNN's fused attention priced by its tiles
(``efficiency.attention_kernels.cudnn.tiles``, ``roofline.attention_tile_s``) and held at the
power limit by its own measured factor (``efficiency.sustained.attention_fraction``), both fitted
by benchmarks/fit_h100_attention.py from the H100's operator-level records."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.catalog import load_cluster, load_gpu
from paraplan.costmodel import AnalyticalCostModel
from paraplan.costmodel.roofline import attention_tile_s, sustained_attention_factor, with_attention_kernel
from paraplan.inventory import Op, OpKind
from paraplan.specs import AttentionKernel, ClusterSpec, Phase, Precision

ROOT = Path(__file__).resolve().parents[2]
H100_DATA = ROOT / "benchmarks/data/gpu/h100-2026-11-27"
CUDNN = with_attention_kernel(load_gpu("H100-SXM5-80GB"), AttentionKernel.CUDNN).efficiency.attention
PEAK = load_gpu("H100-SXM5-80GB").flops_for(Precision.BF16)


def _attention(b: int, h: int, s: int, d: int = 128, causal: bool = True) -> Op:
    flops = 4.0 * b * h * s * s * d
    return Op(name="flash_atten", kind=OpKind.ATTENTION, role="attention core", flops=flops, bytes=0.0,
              bwd_flops=2.5 * flops, bwd_bytes=0.0, exec_fraction=0.5 if causal else 1.0,
              dims=(("b", b), ("h", h), ("l", s), ("l_kv", s), ("d", d)))


def _rate(op: Op, phase: Phase) -> float:
    flops = op.work(phase)[0]
    return flops / attention_tile_s(op, phase, flops, PEAK, CUDNN)


@settings(max_examples=60, deadline=None)
@given(heads=st.integers(1, 64), batch=st.integers(1, 4), blocks=st.integers(1, 128),
       phase=st.sampled_from([Phase.FWD, Phase.BWD_INPUT]))
def test_fewer_tiles_never_run_faster_per_flop(heads, batch, blocks, phase):
    # the same sequence (same tile length) with one head fewer: fewer tiles for the 132 SMs
    s = 128 * blocks
    more, fewer = _attention(batch, heads + 1, s), _attention(batch, heads, s)
    assert _rate(fewer, phase) <= _rate(more, phase) * (1 + 1e-12)


def test_the_same_flops_in_fewer_longer_tiles_run_slower_as_the_h100_measured():
    # 68.7 GFLOP forward each: 1,024 tiles of seq 2k, 512 of 4k, 256 of 8k (453, 435, 347 TFLOP/s measured)
    rates = [_rate(_attention(b, h, s), Phase.FWD) for b, h, s in ((2, 32, 2048), (1, 16, 4096), (1, 4, 8192))]
    assert rates[0] > rates[1] > rates[2] and rates[0] / rates[2] > 1.15


def test_a_launch_of_fewer_tiles_than_sms_takes_at_least_its_longest_tile():
    op = _attention(1, 4, 8192)  # 256 tiles; one head-row of 64 blocks is the critical path
    flops = op.work(Phase.FWD)[0]
    longest = 4.0 * 128 * 8192 * 128  # the last query tile sees every key
    rate = CUDNN.tiles.fwd
    assert attention_tile_s(op, Phase.FWD, flops, PEAK, CUDNN) > longest * CUDNN.tiles.sms / (PEAK * rate.max_fraction)


def test_an_op_without_its_head_shape_or_a_kernel_without_tiles_keeps_the_curve():
    op = dataclasses.replace(_attention(1, 8, 4096), dims=())
    assert attention_tile_s(op, Phase.FWD, op.work(Phase.FWD)[0], PEAK, CUDNN) is None
    fa2 = load_gpu("H100-SXM5-80GB").efficiency.attention
    assert attention_tile_s(_attention(1, 8, 4096), Phase.FWD, 1e12, PEAK, fa2) is None


def test_the_cost_model_prices_cudnn_attention_by_its_tiles_and_fa2_by_its_curve():
    cluster = load_cluster("dgx-h100")
    op = _attention(1, 24, 2048)  # GPT-3 175B at TP 4: 384 tiles
    overhead = cluster.gpu.efficiency.kernel_overhead_s  # one launch's, on top of the roofline
    cudnn = AnalyticalCostModel(cluster, Precision.BF16, sustained=False, attention_kernel=AttentionKernel.CUDNN)
    assert cudnn.estimate_op_s(op, Phase.FWD) == pytest.approx(
        attention_tile_s(op, Phase.FWD, op.work(Phase.FWD)[0], PEAK, CUDNN) + overhead, rel=1e-12)
    fa2 = AnalyticalCostModel(cluster, Precision.BF16, sustained=False, attention_kernel=AttentionKernel.FA2)
    curve = cluster.gpu.efficiency.attention
    assert fa2.estimate_op_s(op, Phase.FWD) == pytest.approx(
        (op.work(Phase.FWD)[0] + curve.half_work) / (PEAK * curve.max_fraction) + overhead, rel=1e-12)


@pytest.mark.parametrize("kernel", [AttentionKernel.CUDNN, AttentionKernel.FA2, None])
def test_the_held_factor_slows_attention_by_the_catalog_s_fraction(kernel):
    cluster = load_cluster("dgx-h100")
    fraction = cluster.gpu.efficiency.sustained.attention_fraction
    assert fraction == 0.9313
    op = _attention(1, 32, 8192)
    burst = AnalyticalCostModel(cluster, Precision.BF16, sustained=False, attention_kernel=kernel)
    held = AnalyticalCostModel(cluster, Precision.BF16, attention_kernel=kernel)
    overhead = cluster.gpu.efficiency.kernel_overhead_s  # the launch's overhead is not slowed
    for phase in (Phase.FWD, Phase.BWD_INPUT):
        assert held.estimate_op_s(op, phase) == pytest.approx(
            (burst.estimate_op_s(op, phase) - overhead) / fraction + overhead, rel=1e-12)


@pytest.mark.parametrize("gpu", ["A100-SXM4-80GB", "H200-SXM-141GB", "B200"])
def test_a_gpu_without_a_held_attention_measurement_keeps_attention_at_its_burst_rate(gpu):
    cluster = load_cluster("dgx-h100").model_copy(update={"gpu": load_gpu(gpu)})
    assert sustained_attention_factor(cluster) == 1.0
    op = _attention(1, 32, 8192)
    burst = AnalyticalCostModel(cluster, Precision.BF16, sustained=False)
    held = AnalyticalCostModel(cluster, Precision.BF16)
    assert held.estimate_op_s(op, Phase.FWD) == burst.estimate_op_s(op, Phase.FWD)


def test_a_power_cap_below_the_tdp_slows_held_attention_further():
    cluster = load_cluster("dgx-h100")
    capped = ClusterSpec.model_validate({**cluster.model_dump(), "power_cap_w": 500})
    assert sustained_attention_factor(capped) < sustained_attention_factor(cluster) == 0.9313


def _fit_script():
    spec = importlib.util.spec_from_file_location("fit_h100_attention", ROOT / "benchmarks/fit_h100_attention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not (H100_DATA / "run2/gpucheck/profile/ops.samples").exists(), reason="H100 records absent")
def test_the_fit_script_reproduces_the_catalog_s_tiles_and_held_factor_from_the_h100_records():
    fit = _fit_script()
    result = fit.fit(fit.attention_samples(H100_DATA))
    tiles = CUDNN.tiles
    assert (tiles.rows, tiles.sms) == (fit.ROWS, fit.SMS)
    for name in ("fwd", "bwd"):
        max_fraction, tile_work = result[name]["x"]
        rate = getattr(tiles, name)
        assert max_fraction == pytest.approx(rate.max_fraction, abs=5e-5)
        assert tile_work == pytest.approx(rate.tile_work, rel=5e-3)
        assert result[name]["n"] == 18
    both = np.concatenate([result["fwd"]["in"], result["bwd"]["in"]])
    assert (len(both), round(float(np.median(abs(both))), 3)) == (tiles.fitted, tiles.median_err)
    # the tiles follow the records the FLOP curve misses by tens of percent
    assert np.median(abs(result["fwd"]["curve"])) > 0.3 > 0.05 > np.median(abs(result["fwd"]["loo"]))
    fraction, rows = fit.held_fraction(H100_DATA)
    assert (len(rows), fraction) == (3, pytest.approx(load_gpu("H100").efficiency.sustained.attention_fraction,
                                                       abs=5e-5))


def test_a_head_dim_the_tiles_were_not_measured_at_keeps_the_flop_curve():
    assert CUDNN.tiles.head_dim == 128
    at_128, at_64 = _attention(2, 16, 4096, d=128), _attention(2, 16, 4096, d=64)
    assert attention_tile_s(at_128, Phase.FWD, at_128.work(Phase.FWD)[0], PEAK, CUDNN) is not None
    assert attention_tile_s(at_64, Phase.FWD, at_64.work(Phase.FWD)[0], PEAK, CUDNN) is None
