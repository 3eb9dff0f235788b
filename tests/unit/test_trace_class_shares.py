"""Compute by kernel class on a trace whose kernels run on several streams at once: each class
is its kernels' union across the streams, an instant k classes share counts 1/k to each, so the
classes add up to the rank's compute and an iteration's parts never exceed the iteration."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hta_traces import write_trace
from paraplan.traces import intervals as iv
from paraplan.traces.decode import decode_trace

CLASSES = ("gemm", "attention", "elementwise")


def _kernel(correlation: int, ts: float, dur: float, name: str, stream: int) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"correlation": correlation}}


def _launch(correlation: int, ts: float) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts, "dur": 1,
            "args": {"correlation": correlation}}


def _two_streams(tmp_path):
    """One step: a 100 us GEMM on stream 7 and, beneath it on stream 8, a 79 us element-wise
    kernel (each stream's union of a class, added up, would be 179 us: +79 %)."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 20},
              _launch(1, 2), _launch(2, 4),
              _kernel(1, 10, 100, "sm90_xmma_gemm_bf16bf16_bf16f32", 7),
              _kernel(2, 20, 79, "void at::native::vectorized_elementwise_kernel<4>(int)", 8)]
    return write_trace(events, tmp_path / "rank0.json.gz")


def test_classes_on_two_streams_at_once_share_the_time_and_add_up_to_the_iteration(tmp_path):
    (it,) = decode_trace(_two_streams(tmp_path)).iterations
    assert it.iteration_s == pytest.approx(100e-6) and it.compute_s == pytest.approx(100e-6)
    assert it.compute_by_class == {"gemm": pytest.approx(60.5e-6), "elementwise": pytest.approx(39.5e-6)}
    parts = sum(it.compute_by_class.values()) + it.exposed_comm_s + it.memory_s + it.idle_s
    assert parts == pytest.approx(it.iteration_s)


def test_sets_that_never_overlap_keep_their_own_lengths():
    assert iv.shares({"a": [(0.0, 2.0)], "b": [(2.0, 5.0)], "c": []}) == {"a": 2.0, "b": 3.0, "c": 0.0}


def test_an_instant_three_sets_hold_counts_a_third_to_each():
    assert iv.shares({"a": [(0.0, 3.0)], "b": [(0.0, 3.0)], "c": [(0.0, 3.0)]}) == pytest.approx(
        {"a": 1.0, "b": 1.0, "c": 1.0})


_piece = st.tuples(st.integers(0, 1000), st.integers(1, 300), st.sampled_from(CLASSES))
_streams = st.lists(st.lists(_piece, max_size=12), min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(_streams, st.integers(1, 1400))
def test_the_parts_of_random_kernels_on_several_streams_never_exceed_the_iteration(streams, span):
    """Per stream, kernels cut into the iteration [0, span]; each class's part is at most the
    sum over streams of its per-stream union, and the parts add up to no more than the span."""
    per_stream: list[dict[str, iv.Intervals]] = []
    for kernels in streams:
        mine: dict[str, list] = {}
        for start, dur, klass in kernels:
            piece = (max(0, start), min(span, start + dur))
            mine.setdefault(klass, []).append(piece)
        per_stream.append({k: iv.union(v) for k, v in mine.items()})
    by_class = {k: iv.union(p for s in per_stream for p in s.get(k, [])) for k in CLASSES}
    parts = iv.shares(by_class)
    everything = iv.length(iv.union(p for s in per_stream for a in s.values() for p in a))
    assert sum(parts.values()) <= span * (1 + 1e-12)
    assert sum(parts.values()) == pytest.approx(everything, abs=1e-9)
    for klass, part in parts.items():
        assert part <= sum(iv.length(s.get(klass, [])) for s in per_stream) + 1e-9
        assert part >= 0
