"""Sustained-clock GEMM throughput (issue 27, item 4): the curves were calibrated on short
bursts of random data at the boost clock; a training step holds the clock the board sustains
at its power limit. The ratio is catalog data with its source, a cluster may cap its GPUs
below their TDP, and switching the effect off gives back the burst-rate numbers exactly."""

from __future__ import annotations

import copy
import importlib.util
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import paraplan
from paraplan.catalog import load_catalog_entry, load_cluster, load_gpu, resolve_job
from paraplan.cli.app import app
from paraplan.costmodel import AnalyticalCostModel, power_gaps
from paraplan.costmodel.roofline import sustained_gemm_factor
from paraplan.inventory import Op, OpKind
from paraplan.prediction import predict
from paraplan.specs import ClusterSpec, Phase, Precision


def _capped(cluster: ClusterSpec, watts: float | None) -> ClusterSpec:
    return ClusterSpec.model_validate({**cluster.model_dump(), "power_cap_w": watts})


def _gemm(flops: float = 2 * 8192**3) -> Op:
    return Op(name="linear", kind=OpKind.GEMM, role="gemm", flops=flops, bytes=3 * 2 * 8192**2,
              bwd_flops=2 * flops, bwd_bytes=6 * 2 * 8192**2)


def _job(gpu: str | dict, **cluster) -> dict:
    return {"model": "llama-3-8b", "cluster": {"gpu": gpu, "gpus_per_node": 8, **cluster},
            "parallel": {"global_batch_size": 64}}


def _without_sustained(name: str) -> dict:
    raw = copy.deepcopy(load_catalog_entry("gpus", load_gpu(name).name))
    raw.pop("aliases", None)
    raw["efficiency"].pop("sustained")
    return raw


H100_DATA = Path(__file__).resolve().parents[2] / "benchmarks/data/gpu/h100-2026-11-27"


def test_the_h100s_sustained_factors_are_its_own_measurement_with_their_source():
    sustained = load_gpu("H100-SXM5-80GB").efficiency.sustained
    assert (sustained.gemm_fraction, sustained.fp8_gemm_fraction) == (0.8177, 0.7774)
    assert sustained.transferred_from is None
    assert "benchmarks/data/gpu/h100-2026-11-27" in sustained.source and "700 W" in sustained.source
    assert load_gpu("H100-SXM5-80GB").tdp_w == 700.0
    assert "700W" in load_gpu("H100-SXM5-80GB").sources["tdp_w"]


def test_the_a100s_sustained_factor_is_he_s_randn_measurement_over_the_curve_at_the_same_shape():
    a100 = load_cluster("dgx-a100")
    burst = AnalyticalCostModel(a100, Precision.BF16, sustained=False).estimate_op_s(_gemm(), Phase.FWD)
    # 257 TFLOP/s on randn at 400 W (He 2024) over the burst curve's own rate at 8192^3
    assert a100.gpu.efficiency.sustained.gemm_fraction == pytest.approx(257e12 * burst / (2 * 8192**3), abs=2e-4)


def test_the_h100s_factors_are_the_median_held_rate_over_its_burst_curve_in_the_committed_probe():
    """benchmarks/fit_sustained.py's arithmetic, on the measurements it read (both runs)."""
    spec = importlib.util.spec_from_file_location("fit_sustained", H100_DATA.parents[2] / "fit_sustained.py")
    fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit)
    gpu = load_gpu("H100-SXM5-80GB")
    rows = [r for path in fit.DEFAULT_RECORDS for r in fit.rows_of(path) if r["data"] == "randn"]
    for precision, expected in ((Precision.BF16, 0.8177), (Precision.FP8, 0.7774)):
        ratios = [r["sustained_tflops"] / fit.curve_tflops(gpu, r["m"], r["n"], r["k"], precision)
                  for r in rows if r["precision"] == precision.value]
        assert len(ratios) == 18 and statistics.median(ratios) == pytest.approx(expected, abs=5e-5)


def test_a_sustained_gemm_takes_longer_by_exactly_the_factor_of_its_precision():
    cluster = load_cluster("dgx-h100")
    overhead = cluster.gpu.efficiency.kernel_overhead_s
    for precision, fp8, factor in ((Precision.BF16, False, 0.8177), (Precision.FP8, True, 0.7774)):
        op = Op(name="linear", kind=OpKind.GEMM, role="gemm", flops=2 * 8192**3, bytes=3 * 8192**2,
                bwd_flops=4 * 8192**3, bwd_bytes=6 * 8192**2, fp8=fp8)
        burst = AnalyticalCostModel(cluster, precision, sustained=False).estimate_op_s(op, Phase.FWD)
        held = AnalyticalCostModel(cluster, precision).estimate_op_s(op, Phase.FWD)
        assert (held - overhead) == pytest.approx((burst - overhead) / factor, rel=1e-12)


def test_a_gpu_without_its_own_fp8_ratio_slows_fp8_gemms_by_its_16_bit_one():
    cluster = load_cluster("dgx-h200")
    assert cluster.gpu.efficiency.sustained.fp8_gemm_fraction is None
    assert sustained_gemm_factor(cluster, Precision.FP8) == sustained_gemm_factor(cluster) == 0.9053


def test_a_memory_bound_kernel_is_not_slowed_by_the_clock():
    cluster = load_cluster("dgx-h100")
    norm = Op(name="layernorm", kind=OpKind.NORM, role="norm", flops=1e9, bytes=1e9, bwd_flops=2e9, bwd_bytes=2e9)
    burst = AnalyticalCostModel(cluster, Precision.BF16, sustained=False).estimate_op_s(norm, Phase.FWD)
    assert AnalyticalCostModel(cluster, Precision.BF16).estimate_op_s(norm, Phase.FWD) == burst


@settings(max_examples=60, deadline=None)
@given(high=st.floats(50.0, 1500.0), low=st.floats(1.0, 1500.0), flops=st.floats(1e6, 1e15))
def test_a_lower_power_cap_never_makes_a_gemm_faster(high, low, flops):
    low, high = sorted((low, high))
    cluster = load_cluster("dgx-h100")
    op = _gemm(flops)
    slow = AnalyticalCostModel(_capped(cluster, low), Precision.BF16).estimate_op_s(op, Phase.FWD)
    fast = AnalyticalCostModel(_capped(cluster, high), Precision.BF16).estimate_op_s(op, Phase.FWD)
    assert slow >= fast


def test_a_cap_at_or_above_the_tdp_changes_nothing():
    cluster = load_cluster("dgx-h100")
    assert sustained_gemm_factor(_capped(cluster, 700)) == sustained_gemm_factor(cluster) == 0.8177
    assert sustained_gemm_factor(_capped(cluster, 1000)) == 0.8177
    assert sustained_gemm_factor(_capped(cluster, 1000), Precision.FP8) == 0.7774


def test_a_500_w_h100_fleet_is_slower_and_says_the_cap_rule_is_unmeasured():
    capped = paraplan.predict(_job("H100-SXM5-80GB", power_cap_w="500 W"))
    plain = paraplan.predict(_job("H100-SXM5-80GB"))
    assert capped.iteration_s > plain.iteration_s
    assert any("capped at 500 W" in n and "no measured cap sweep" in n for n in capped.uncalibrated)
    assert sustained_gemm_factor(_capped(load_cluster("dgx-h100"), 500)) == pytest.approx(0.8177 * (5 / 7) ** (1 / 3))
    assert sustained_gemm_factor(_capped(load_cluster("dgx-h100"), 500), Precision.FP8) == pytest.approx(
        0.7774 * (5 / 7) ** (1 / 3))


def test_switching_the_effect_off_restores_the_burst_rate_numbers_exactly():
    off = resolve_job(_job(_without_sustained("H100-SXM5-80GB")))
    on = resolve_job(_job("H100-SXM5-80GB"))
    burst = predict(on, AnalyticalCostModel(on.cluster, on.precision, sustained=False))
    assert predict(off).iteration_s == burst.iteration_s
    assert predict(on).iteration_s > burst.iteration_s


def test_an_unmeasured_gpu_says_its_gemms_keep_the_burst_rate():
    assert sustained_gemm_factor(load_cluster("dgx-b200")) == 1.0
    notes = paraplan.predict(_job("B200")).uncalibrated
    assert any(n.startswith("B200: no sustained-clock GEMM measurement") for n in notes)


def test_an_fp8_job_on_a_gpu_without_an_fp8_ratio_says_its_gemms_take_the_16_bit_one():
    h200 = load_cluster("dgx-h200")
    assert any("no FP8 sustained-clock GEMM measurement" in n and "0.905" in n
               for n in power_gaps(h200, Precision.FP8))
    assert not any("FP8 sustained" in n for n in power_gaps(h200, Precision.BF16))
    assert not any("FP8 sustained" in n for n in power_gaps(load_cluster("dgx-h100"), Precision.FP8))


def test_a_cap_on_a_gpu_without_a_tdp_is_ignored_and_says_so():
    cluster = _capped(load_cluster("dgx-h100"), 500)
    raw = cluster.gpu.model_dump()
    raw["tdp_w"] = None
    no_tdp = ClusterSpec.model_validate({**cluster.model_dump(), "gpu": raw})
    assert sustained_gemm_factor(no_tdp) == 0.8177
    assert any("ignored: no TDP" in n for n in power_gaps(no_tdp))


@pytest.mark.parametrize("cap", ["0", "-300", "5000", "1e9", "lots"])
def test_a_bad_power_cap_is_one_line_naming_the_field(cap, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "model: llama-3-8b\ncluster: {name: dgx-h100, power_cap_w: " + cap + "}\nparallel: {global_batch_size: 64}\n"
    )
    result = CliRunner().invoke(app, ["predict", str(path)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "power_cap_w" in lines[0], result.output
