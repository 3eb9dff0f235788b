"""A GPU's kind-level memory curve from a trace's streaming kernels (issue 27, in-situ effects):
the bytes each kernel moves, its class by PyTorch's kernel, the fit through the package's fitter
with leave-one-out, and our H100 trace's curve in the catalog."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.hta_traces import write_trace

from paraplan.calibrate import memory_kernels as mk
from paraplan.calibrate.operators import above_launch_floor
from paraplan.catalog.loader import load_gpu
from paraplan.specs import MemoryKernel
from paraplan.traces.ops import KernelCall

ROOT = Path(__file__).resolve().parents[2]
H100_TRACE = ROOT / "benchmarks" / "data" / "gpu" / "h100-2026-11-27" / "run2" / "gpucheck" / "trace" / "rank0.json.gz"
VECTORIZED = "void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor>"
BF16, F32 = "c10::BFloat16", "float"


def _kernel(op: str, dims, dtypes, kernel: str = VECTORIZED) -> KernelCall:
    return KernelCall(op, tuple(dims), dtypes[0] if dtypes else "", 1e-5, kernel, 1, tuple(dtypes))


def test_a_cast_reads_its_source_and_writes_its_destination_each_at_its_own_element_size():
    n = 1024
    assert mk.traffic_bytes(_kernel("aten::copy_", [(n,), (n,)], [BF16, F32])) == n * (2 + 4)
    assert mk.traffic_bytes(_kernel("aten::fill_", [(n,)], [F32])) == 4 * n
    assert mk.traffic_bytes(_kernel("aten::add_", [(n,), (n,)], [F32, F32])) == 3 * 4 * n  # self read and written
    assert mk.traffic_bytes(_kernel("aten::mul", [(8, n), (n,)], [BF16, BF16])) == 2 * (8 * n + n + 8 * n)  # broadcast
    assert mk.traffic_bytes(_kernel("aten::add", [(n,)], [])) is None  # types not recorded


def test_the_class_is_pytorchs_kernel_first_then_the_operator():
    strided = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl>"
    unrolled = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>"
    assert mk.kernel_class(_kernel("aten::copy_", [(4,), (4,)], [BF16, BF16], strided)) == "strided"
    assert mk.kernel_class(_kernel("aten::copy_", [(4,), (4,)], [F32, BF16], unrolled)) == "unrolled"
    assert mk.kernel_class(_kernel("aten::copy_", [(4,), (4,)], [BF16, F32])) == "cast"
    assert mk.kernel_class(_kernel("aten::copy_", [(4,), (4,)], [BF16, BF16])) == "copy"
    assert mk.kernel_class(_kernel("aten::zero_", [(4,)], [BF16])) == "fill"
    assert mk.kernel_class(_kernel("aten::mul_", [(4,), (4,)], [BF16, BF16])) == "elementwise"


def _fill_trace(tmp_path: Path, rate: float, sizes=(1 << 22, 1 << 24, 1 << 26, 1 << 28), calls: int = 3) -> Path:
    """Fills of ``sizes`` fp32 elements, each kernel as long as HBM at ``rate`` of the H100's
    bandwidth plus 1.29 us makes it (the middle call of each size twice as long)."""
    bw = load_gpu("H100-SXM5-80GB").hbm_bandwidth_bytes_per_s
    events, corr = [], 0
    for n in sizes:
        for k in range(calls):
            corr += 1
            us = (4 * n / (bw * rate) + 1.29e-6) * 1e6 * (2 if k == 1 and calls > 2 else 1)
            ts = 10_000 * corr
            events += [{"ph": "X", "cat": "cpu_op", "name": "aten::fill_", "pid": 1, "tid": 11, "ts": ts, "dur": 40,
                        "args": {"External id": corr, "Input Dims": [[n], []], "Input type": [F32, "Scalar"]}},
                       {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 11,
                        "ts": ts + 1, "dur": 1, "args": {"correlation": corr}},
                       {"ph": "X", "cat": "kernel", "name": VECTORIZED, "pid": 0, "tid": 7, "ts": ts + 50,
                        "dur": us, "args": {"correlation": corr, "stream": 7}}]
    return write_trace(events, tmp_path / "t.json.gz")


def test_each_distinct_kernel_is_one_sample_at_the_median_of_its_calls(tmp_path):
    samples = mk.stream_samples(_fill_trace(tmp_path, 0.9))
    assert len(samples) == 4 and set(samples.tag) == {"fill"}
    bw = load_gpu("H100-SXM5-80GB").hbm_bandwidth_bytes_per_s
    n = 1 << 28
    i = [op.bytes for op in samples.ops].index(4.0 * n)
    assert samples.measured[i] == pytest.approx(4 * n / (bw * 0.9) + 1.29e-6, rel=1e-3)  # not the slow middle call


def test_the_fit_recovers_the_rate_the_kernels_streamed_at_with_the_overhead_kept(tmp_path):
    gpu = load_gpu("H100-SXM5-80GB")
    samples = mk.stream_samples(_fill_trace(tmp_path, 0.8))
    curve = mk.fit_memory_curve(samples, gpu)
    assert curve.max_fraction == pytest.approx(0.8, rel=0.01)
    assert np.abs(mk.leave_one_out(samples, gpu)).max() < 0.01


def test_the_h100s_generic_memory_curve_stays_gh200s_for_operators_whose_kernels_kind_is_unknown():
    """Its best kind's curve (vectorized) would price every untagged operator as PyTorch's
    fastest kernels: the generic curve is GH200's mix of operators, and says so."""
    eff = load_gpu("H100-SXM5-80GB").efficiency
    assert eff.memory.transferred_from == "GH200-120GB"
    assert eff.memory.max_fraction < eff.memory_kernels[MemoryKernel.VECTORIZED].max_fraction


def _h100_kept():
    if not H100_TRACE.exists():
        pytest.skip("the H100 trace is not in this checkout")
    every = mk.stream_samples(H100_TRACE)
    return every.subset(above_launch_floor(every))


def test_the_h100s_unrolled_and_strided_kernels_run_well_below_its_vectorized_curve():
    """What one curve cannot follow: PyTorch's non-vectorized kernels take at least a third more
    time than its vectorized kernels' curve gives (it prices them fast)."""
    kept = _h100_kept()
    gpu = load_gpu("H100-SXM5-80GB")
    vectorized = mk.with_memory_curve(mk.without_kind_curves(gpu), gpu.efficiency.memory_kernels[MemoryKernel.VECTORIZED])
    for cls in ("unrolled", "strided"):
        err = mk.curve_errors(kept.subset(np.asarray(kept.tag) == cls), vectorized)
        assert np.median(err) < -0.3


@pytest.mark.parametrize("kind", [MemoryKernel.VECTORIZED, MemoryKernel.UNROLLED, MemoryKernel.STRIDED])
def test_each_kind_curve_of_the_h100_prices_the_traces_kernels_of_that_kind_within_its_held_out_error(kind):
    kept = _h100_kept()
    gpu = load_gpu("H100-SXM5-80GB")
    curve = gpu.efficiency.memory_kernels[kind]
    mine = mk.kind_samples(kept, kind)
    assert len(mine) == curve.fitted
    err = mk.curve_errors(mine, gpu)  # each sample names its kind: the catalog's kind curve times it
    assert np.median(np.abs(err)) <= curve.held_out_median_err
    assert abs(np.median(err)) < 0.05
    assert curve.transferred_from is None and "fit_kernel_floor.py --memory" in curve.source


@pytest.mark.parametrize("kind", [MemoryKernel.VECTORIZED, MemoryKernel.UNROLLED, MemoryKernel.STRIDED])
def test_each_kind_curve_of_the_h100_is_the_fit_to_that_kinds_kernels(kind):
    kept = _h100_kept()
    gpu = load_gpu("H100-SXM5-80GB")
    mine = mk.kind_samples(kept, kind)
    curve = mk.fit_memory_curve(mine, gpu)
    catalog = gpu.efficiency.memory_kernels[kind]
    assert curve.max_fraction == pytest.approx(catalog.max_fraction, abs=0.001)
    assert curve.half_work == pytest.approx(catalog.half_work, rel=0.01)
    assert np.median(np.abs(mk.leave_one_out(mine, gpu))) == pytest.approx(catalog.held_out_median_err, abs=0.001)
