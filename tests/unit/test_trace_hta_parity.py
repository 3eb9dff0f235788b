"""A GPU iteration splits as HolisticTraceAnalysis's temporal breakdown does
(hta/analyzers/breakdown_analysis.py, `get_temporal_breakdown`): computation is the union of the
compute kernels, non-compute the rest of the union of all kernels (communication, and memory
copies and sets), idle the rest of the span. Checked on hand-made traces and against HTA's own
table for its test traces (../shared/data/traces/README.md, HTA run from source)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from paraplan.traces.decode import decode_trace

HTA = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces" / "hta"
POINTS = 2.0  # issue 25: within 2 percentage points of HTA's figure


def _write(events: list[dict], path: Path) -> Path:
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    return path


def _trace(tmp_path: Path, *device: dict) -> Path:
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 500}
    launches = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1 + c,
                 "dur": 1, "args": {"correlation": c}} for c in range(len(device))]
    return _write([step, *launches, *device], tmp_path / "rank0.json.gz")


def _device(cat: str, name: str, correlation: int, ts: float, dur: float, stream: int) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"correlation": correlation}}


def _gemm(c: int, ts: float, dur: float, stream: int = 7) -> dict:
    return _device("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32", c, ts, dur, stream)


def _copy(c: int, ts: float, dur: float, stream: int = 8) -> dict:
    return _device("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", c, ts, dur, stream)


def test_a_memory_copy_beside_no_compute_is_memory_not_compute(tmp_path):
    (it,) = decode_trace(_trace(tmp_path, _gemm(0, 100, 100), _copy(1, 250, 50))).iterations
    assert it.iteration_s == pytest.approx(200e-6)
    assert (it.compute_s, it.memory_s, it.idle_s) == (pytest.approx(100e-6), pytest.approx(50e-6),
                                                      pytest.approx(50e-6))
    assert "memory" not in it.compute_by_class


def test_a_memory_copy_under_a_compute_kernel_adds_nothing_but_compute(tmp_path):
    (it,) = decode_trace(_trace(tmp_path, _gemm(0, 100, 100), _copy(1, 120, 50), _gemm(2, 260, 40))).iterations
    assert (it.compute_s, it.memory_s) == (pytest.approx(140e-6), 0.0)
    assert it.compute_s + it.exposed_comm_s + it.memory_s + it.idle_s == pytest.approx(it.iteration_s)


def test_a_memory_copy_partly_under_compute_counts_only_its_uncovered_part(tmp_path):
    (it,) = decode_trace(_trace(tmp_path, _gemm(0, 100, 100), _copy(1, 180, 60))).iterations
    assert (it.compute_s, it.memory_s, it.idle_s) == (pytest.approx(100e-6), pytest.approx(40e-6), 0.0)


def _hta(folder: str, rank: int) -> Path:
    files = sorted((HTA / folder).glob("*.json.gz"))
    if not files:
        pytest.skip(f"../shared/data/traces/hta/{folder} is not present")
    return files[rank] if len(files) > 1 else files[0]


def _split(path: Path, steps: range) -> tuple[float, float, float]:
    """paraplan's compute / non-compute / idle in % of HTA's span over `steps`: first kernel of
    the first to last kernel of the last. Non-compute is exposed communication plus memory (HTA's
    "non-compute": all kernels less computation); idle is the rest of the span, which holds the
    GPU's waits between steps as well as within them."""
    its = [it for it in decode_trace(path).iterations if it.step in steps]
    assert [it.step for it in its] == list(steps)
    span = max(it.start_us * 1e-6 + it.iteration_s for it in its) - its[0].start_us * 1e-6
    compute = sum(it.compute_s for it in its)
    non_compute = sum(it.exposed_comm_s + it.memory_s for it in its)
    return tuple(100 * x / span for x in (compute, non_compute, span - compute - non_compute))


# HTA's get_temporal_breakdown on each set (../shared/data/traces/README.md): every step but the
# last; compute %, non-compute %, idle % of the span. paraplan keeps the trace's fractional
# microseconds; HTA's figures match whole microseconds (ts and dur cut to integers): on F, where
# thousands of kernels last a few us, cutting them so moves paraplan's 97.4 / 0.9 / 1.7 to
# 96.9 / 0.7 / 2.3 (HTA: 96.8 / 0.6 / 2.6), most of the gap left there; on B, 17.7 / 5.1 / 77.2
# to 17.5 / 5.0 / 77.5 (HTA: 17.3 / 5.0 / 77.8), about half of it
HTA_TABLE = [
    ("A_vit128_sampled", 0, range(551, 552), (17.7, 28.7, 53.6)),
    ("A_vit128_sampled", 1, range(551, 552), (22.6, 22.7, 54.7)),
    ("B_resnet_nccl_a100", 0, range(4, 6), (17.3, 5.0, 77.8)),
    ("C_dfindex_v100", 0, range(2, 6), (35.5, 18.4, 46.1)),
    ("E1_diff_control_a100x8", 0, range(1009, 1014), (61.2, 22.6, 16.2)),
    ("F_ns_resolution_v100", 0, range(101, 105), (96.8, 0.6, 2.6)),
]


@pytest.mark.shared_data
@pytest.mark.parametrize(("folder", "rank", "steps", "hta"), HTA_TABLE,
                         ids=[f"{f.split('_')[0]}-file{r}" for f, r, *_ in HTA_TABLE])
def test_compute_non_compute_and_idle_are_within_2_points_of_htas_temporal_breakdown(folder, rank, steps, hta):
    ours = _split(_hta(folder, rank), steps)
    gaps = [round(a - b, 2) for a, b in zip(ours, hta, strict=True)]
    assert all(abs(g) <= POINTS for g in gaps), f"paraplan {ours} vs HTA {hta}: gaps {gaps} points"
