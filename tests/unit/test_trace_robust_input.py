"""Real traces recorded by others: integers of any size, the 2021 Kineto schema, and rank files
that cannot be one run (issue 25, part 6)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from paraplan.traces import reader
from paraplan.traces.decode import decode_trace
from paraplan.traces.reader import iter_events

#: Above 2^64: real Kineto traces carry such ids (HolisticTraceAnalysis PR #324).
HUGE = 2**64 + 1


def _write(events: list[dict], path: Path, **header) -> Path:
    data = json.dumps({**header, "traceEvents": events}).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def _gpu_step(ids: list[int]) -> list[dict]:
    """One ProfilerStep launching a GEMM and an elementwise kernel, with the ids given; times in
    microseconds with fractions (the decimals a streaming reader must give back as floats)."""
    return [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1, "tid": 1, "ts": 0.5, "dur": 1000.25},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.5, "dur": 20,
         "args": {"External id": ids[0], "Record function id": ids[0]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 12.5, "dur": 5,
         "args": {"External id": ids[0], "correlation": ids[1]}},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32", "pid": 0, "tid": 7, "ts": 100.5,
         "dur": 300.25, "args": {"External id": ids[0], "correlation": ids[1]}},
        {"ph": "X", "cat": "kernel", "name": "vectorized_elementwise_kernel<4>", "pid": 0, "tid": 7, "ts": 800.5,
         "dur": 50, "args": {"External id": ids[2], "correlation": ids[2]}},
    ]


@pytest.fixture(params=["streamed by ijson", "read whole by json"])
def reading(request, monkeypatch):
    if request.param == "read whole by json":
        monkeypatch.setattr(reader, "_has_ijson", lambda: False)
    else:
        pytest.importorskip("ijson")
    return request.param


def test_integers_above_two_to_the_64_are_read_exactly_and_decimals_stay_floats(tmp_path, reading):
    path = _write(_gpu_step([HUGE, HUGE + 1, 2**70]), tmp_path / "rank0.json.gz")
    events = list(iter_events(path))
    assert [e["args"]["External id"] for e in events[1:]] == [HUGE, HUGE, HUGE, 2**70]
    assert events[3]["args"]["correlation"] == HUGE + 1
    assert all(type(e["ts"]) is float for e in events)
    assert events[3]["dur"] == 300.25 and type(events[3]["dur"]) is float


def test_a_trace_with_huge_ids_decodes_as_the_same_trace_with_small_ids(tmp_path, reading):
    small = decode_trace(_write(_gpu_step([1, 2, 3]), tmp_path / "rank0.json"))
    huge = decode_trace(_write(_gpu_step([HUGE, HUGE + 1, 2**70]), tmp_path / "rank1.json"))
    assert huge.device == "gpu"
    assert huge.iterations == small.iterations


def test_a_huge_integer_in_the_header_is_read_too(tmp_path, reading):
    path = _write(_gpu_step([1, 2, 3]), tmp_path / "rank0.json",
                  distributedInfo={"rank": 0, "world_size": 1}, baseTimeNanoseconds=HUGE)
    assert reader.read_header(path)["baseTimeNanoseconds"] == HUGE
    assert decode_trace(path).iterations[0].step == 7


def _as_2021(events: list[dict]) -> list[dict]:
    """The same events as PyTorch 1.8-1.9's Kineto wrote them: capitalised categories, and the
    device events' `external id` in lower case."""
    old = {v: k for k, v in reader.KINETO_2021.items()}
    out = []
    for e in events:
        e = {**e, "cat": old.get(e["cat"], e["cat"]), "args": dict(e.get("args", {}))}
        if e["cat"] in ("Kernel", "Memcpy", "Memset") and "External id" in e["args"]:
            e["args"]["external id"] = e["args"].pop("External id")
        out.append(e)
    return out


def test_a_2021_kineto_trace_is_decoded_as_the_gpu_trace_it_is(tmp_path, reading):
    today = decode_trace(_write(_gpu_step([1, 2, 3]), tmp_path / "rank0.json"))
    old_events = _as_2021(_gpu_step([1, 2, 3]))
    assert {e["cat"] for e in old_events} == {"user_annotation", "Operator", "Runtime", "Kernel"}
    old = decode_trace(_write(old_events, tmp_path / "rank1.json"))
    assert old.device == today.device == "gpu"
    assert old.iterations == today.iterations
    kernels = [e for e in iter_events(tmp_path / "rank1.json") if e["cat"] == "kernel"]
    assert [e["args"]["External id"] for e in kernels] == [1, 3]
