"""A GPU's kernel duration floor (``kernel_overhead_s``) from a trace's negligible-work kernels
(issue 27, in-situ effects): hand-written traces, our own H100 trace and HTA's A100 trace
(../shared/data/traces/hta, skipped when absent)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.hta_traces import hta_trace, write_trace

from paraplan.calibrate.kernel_floor import (
    NEGLIGIBLE_BYTES,
    fit_kernel_floor,
    kernel_bytes,
    memory_curve_s,
    queued_gaps,
)
from paraplan.catalog.loader import load_gpu
from paraplan.specs import ConfigError
from paraplan.traces.ops import KernelCall

ROOT = Path(__file__).resolve().parents[2]
H100_TRACE = ROOT / "benchmarks" / "data" / "gpu" / "h100-2026-11-27" / "run2" / "gpucheck" / "trace" / "rank0.json.gz"


def _call(name: str, ts: float, dims, corr: int, kernels: list[float], dtype: str = "c10::BFloat16") -> list[dict]:
    """One operator call launching one kernel per entry of ``kernels`` (their durations, us)."""
    events = [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 11, "ts": ts, "dur": 40,
               "args": {"External id": corr, "Input Dims": [list(d) for d in dims],
                        "Input type": [dtype] * len(dims)}}]
    for i, dur in enumerate(kernels):
        c = corr * 10 + i
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 11,
                       "ts": ts + 1 + i, "dur": 1, "args": {"correlation": c}})
        events.append({"ph": "X", "cat": "kernel", "name": "elementwise", "pid": 0, "tid": 7, "ts": ts + 100 + 10 * i,
                       "dur": dur, "args": {"correlation": c, "stream": 7}})
    return events


def test_a_fill_moves_only_its_output_and_an_elementwise_op_reads_its_inputs_and_writes_one_output():
    fill = KernelCall("aten::fill_", ((1024,),), "float", 1e-6, "fill", 1)
    add = KernelCall("aten::add", ((1024,), (1024,)), "c10::BFloat16", 1e-6, "add", 1)
    assert kernel_bytes(fill) == 4 * 1024
    assert kernel_bytes(add) == 2 * 3 * 1024
    assert kernel_bytes(KernelCall("aten::add", ((8,),), "c10::ComplexHalf", 1e-6, "add", 1)) is None


def test_the_overhead_is_the_median_of_the_tiny_kernels_time_above_the_memory_curve(tmp_path):
    gpu = load_gpu("H100-SXM5-80GB")
    times = [1.6, 1.7, 1.8, 1.7, 9.0]  # one slowed by a concurrent stream: the median ignores it
    events = [e for i, t in enumerate(times) for e in _call("aten::add", 1000 * i, ((4096,), (4096,)), i + 1, [t])]
    floor = fit_kernel_floor([write_trace(events, tmp_path / "t.json.gz")], gpu)
    curve = memory_curve_s(2 * 3 * 4096, gpu)
    assert (floor.kernels, floor.shapes) == (5, 1)
    assert floor.overhead_s == pytest.approx(1.7e-6 - curve, rel=1e-6)
    assert floor.median_s == pytest.approx(1.7e-6) and floor.min_s == pytest.approx(1.6e-6)
    assert floor.resolution_s == 1e-9  # durations with fractions of a microsecond


def test_large_copies_and_operators_launching_several_kernels_are_not_floor_points(tmp_path):
    gpu = load_gpu("H100-SXM5-80GB")
    big = NEGLIGIBLE_BYTES  # 3 x 2 x big bytes: far above the limit
    events = (_call("aten::copy_", 0, ((big,), (big,)), 1, [400.0])
              + _call("aten::mul", 1000, ((64,), (64,)), 2, [5.0, 6.0])  # two kernels: whose bytes?
              + _call("aten::zero_", 2000, ((64,),), 3, [2.0])
              + _call("aten::mm", 3000, ((64, 64), (64, 64)), 4, [3.0]))  # not a streaming operator
    floor = fit_kernel_floor([write_trace(events, tmp_path / "t.json.gz")], gpu)
    assert floor.kernels == 1 and floor.seconds == (pytest.approx(2e-6),)
    assert floor.resolution_s == 1e-6  # whole microseconds, as older Kineto traces record them


def test_a_trace_without_a_shaped_tiny_streaming_kernel_is_refused_in_one_line(tmp_path):
    events = _call("aten::mm", 0, ((64, 64), (64, 64)), 1, [3.0])
    with pytest.raises(ConfigError, match="record_shapes=True"):
        fit_kernel_floor([write_trace(events, tmp_path / "t.json.gz")], load_gpu("H100-SXM5-80GB"))


def test_our_h100_traces_tiny_kernels_run_about_1_7_us_and_give_the_catalogs_overhead():
    if not H100_TRACE.exists():
        pytest.skip("the H100 trace is not in this checkout")
    gpu = load_gpu("H100-SXM5-80GB")
    floor = fit_kernel_floor([H100_TRACE], gpu)
    assert floor.kernels >= 100
    assert 1.0e-6 < floor.min_s <= floor.median_s < 2.0e-6
    assert floor.overhead_s == pytest.approx(gpu.efficiency.kernel_overhead_s, abs=0.005e-6)  # the catalog's number
    assert "fit_kernel_floor.py" in gpu.sources["kernel_overhead_s"]


def test_the_catalog_prices_the_h100s_tiny_kernels_within_10_percent_of_their_median():
    if not H100_TRACE.exists():
        pytest.skip("the H100 trace is not in this checkout")
    gpu = load_gpu("H100-SXM5-80GB")
    floor = fit_kernel_floor([H100_TRACE], gpu)
    predicted = floor.curve_s + gpu.efficiency.kernel_overhead_s
    assert abs(predicted / floor.median_s - 1) < 0.10
    assert floor.curve_s / floor.median_s < 0.5  # the catalog without the overhead: under half the time


def test_an_a100_training_traces_tiny_kernels_run_several_microseconds():
    """HTA's 8 x A100 recommender trace (whole-microsecond resolution): the floor is ~3 us."""
    floor = fit_kernel_floor([hta_trace("E1_diff_control_a100x8")], load_gpu("A100-SXM4-80GB"))
    assert floor.kernels > 1000 and floor.resolution_s == 1e-6
    assert 2e-6 <= np.median(floor.seconds) <= 4e-6


def test_the_gap_between_queued_kernels_is_read_only_where_the_next_was_launched_before_the_first_ended(tmp_path):
    events = (_call("aten::add", 0, ((64,), (64,)), 1, [50.0])  # kernel 100..150
              + _call("aten::add", 10, ((64,), (64,)), 2, [2.0]))  # launched at 11 (queued); its kernel at 100 -> moved
    events[-1]["ts"] = 151.5  # the second kernel starts 1.5 us after the first ends
    events += _call("aten::add", 500, ((64,), (64,)), 3, [2.0])  # launched after the second ended: an idle GPU
    assert queued_gaps(write_trace(events, tmp_path / "t.json.gz")) == [pytest.approx(1.5e-6)]


def test_our_h100s_queued_kernels_wait_about_a_microsecond_and_a_half_between_them():
    if not H100_TRACE.exists():
        pytest.skip("the H100 trace is not in this checkout")
    gaps = queued_gaps(H100_TRACE)
    assert len(gaps) > 1000
    assert 0.9e-6 < min(gaps) and 1.0e-6 < float(np.median(gaps)) < 2.0e-6


def test_the_a100_catalogs_overhead_is_the_fixed_point_of_that_traces_floor():
    """The A100's curves were refitted with the overhead fixed (calibrate operators
    --kernel-overhead-us 3.0); the trace's tiny kernels then read the same overhead again."""
    gpu = load_gpu("A100-SXM4-80GB")
    floor = fit_kernel_floor([hta_trace("E1_diff_control_a100x8")], gpu)
    assert floor.overhead_s == pytest.approx(gpu.efficiency.kernel_overhead_s, abs=0.01e-6)
    assert "E1_diff_control_a100x8" in gpu.sources["kernel_overhead_s"]
    for transferred in ("A100-SXM4-40GB", "A100-PCIE-80GB"):
        assert load_gpu(transferred).efficiency.kernel_overhead_s == gpu.efficiency.kernel_overhead_s
