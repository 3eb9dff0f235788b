"""Real traces recorded by others: integers of any size, the 2021 Kineto schema, and rank files
that cannot be one run (issue 25, part 6)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.traces import reader
from paraplan.traces.decode import decode_trace
from paraplan.traces.reader import TraceFileError, iter_events
from paraplan.traces.summary import summarize

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


def run_cli(*args: str):
    return CliRunner().invoke(app, ["trace", *args], env={"COLUMNS": "80"})


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


HTA = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces" / "hta"
needs_hta = pytest.mark.skipif(not HTA.is_dir(), reason="the HTA traces live in ../shared (not in CI)")


def _rank(path: Path, rank: int, *, trailer: dict | None = None, **header) -> Path:
    """A tiny GPU rank file of a 2-rank run; `trailer` is written after the events, where newer
    Kineto writes baseTimeNanoseconds."""
    events = _gpu_step([1, 2, 3])
    top = {"distributedInfo": {"rank": rank, "world_size": 2}, **header, "traceEvents": events, **(trailer or {})}
    path.write_text(json.dumps(top))
    return path


DAY_NS = 86_400 * 10**9
BASE_NS = 1_711_964_646_000_000_000  # B_resnet_nccl_a100's baseTimeNanoseconds


@needs_hta
def test_rank_files_of_two_different_real_runs_are_refused_naming_the_gpus():
    # B (A100, rank 0 of 2, steps 4-6) and C (V100, rank 1 of 2, steps 2-6) share steps 4-6
    b, c = HTA / "B_resnet_nccl_a100" / "nccl_data.json.gz", HTA / "C_dfindex_v100" / "df_index_resolver.json.gz"
    with pytest.raises(TraceFileError, match="disagree on the GPU") as info:
        summarize([b, c])
    assert "A100" in str(info.value) and "V100" in str(info.value) and "\n" not in str(info.value)


@needs_hta
def test_the_two_ranks_of_one_real_run_are_still_one_run():
    assert [r.rank for r in summarize([HTA / "A_vit128_sampled"]).ranks] == [0, 1]


def test_ranks_recorded_a_day_apart_are_refused_with_both_times(tmp_path, reading):
    a = _rank(tmp_path / "rank0.json", 0, trailer={"baseTimeNanoseconds": BASE_NS})
    b = _rank(tmp_path / "rank1.json", 1, trailer={"baseTimeNanoseconds": BASE_NS + DAY_NS})
    with pytest.raises(TraceFileError, match="recorded at different times") as info:
        summarize([a, b])
    assert "2024-04-01" in str(info.value) and "2024-04-02" in str(info.value) and "+86,400 s" in str(info.value)
    result = run_cli("summarize", str(a), str(b))
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "recorded at different times" in result.stderr


def test_ranks_recorded_a_second_apart_or_on_clocks_since_boot_are_one_run(tmp_path, reading):
    a = _rank(tmp_path / "rank0.json", 0, trailer={"baseTimeNanoseconds": BASE_NS})
    b = _rank(tmp_path / "rank1.json", 1, trailer={"baseTimeNanoseconds": BASE_NS + 10**9})
    assert [r.rank for r in summarize([a, b]).ranks] == [0, 1]
    c = _rank(tmp_path / "rank1b.json", 1)  # no base: ts counts from boot, nothing to compare
    assert [r.rank for r in summarize([a, c]).ranks] == [0, 1]


def test_a_run_that_fits_on_one_host_is_refused_when_its_files_name_two_hosts(tmp_path, reading):
    eight = [{"name": "NVIDIA H100 80GB HBM3"}] * 8
    a = _rank(tmp_path / "rank0.json", 0, deviceProperties=eight, hostname="node-a")
    b = _rank(tmp_path / "rank1.json", 1, deviceProperties=eight, trailer={"host_name": "node-b"})
    with pytest.raises(TraceFileError, match="disagree on the host name") as info:
        summarize([a, b])
    assert "node-a" in str(info.value) and "node-b" in str(info.value)


def test_ranks_of_a_run_across_hosts_may_name_different_hosts(tmp_path, reading):
    one = [{"name": "NVIDIA H100 80GB HBM3"}]
    a = _rank(tmp_path / "rank0.json", 0, deviceProperties=one, hostname="node-a")
    b = _rank(tmp_path / "rank1.json", 1, deviceProperties=one, hostname="node-b")
    assert [r.rank for r in summarize([a, b]).ranks] == [0, 1]


def test_the_fields_kineto_writes_after_the_events_are_read_without_decoding_the_file(tmp_path, reading):
    path = _rank(tmp_path / "rank0.json.gz", 0, hostname="node-a", trailer={"baseTimeNanoseconds": BASE_NS})
    path.write_bytes(gzip.compress(path.read_bytes()))
    top = reader.read_top(path)
    assert (top["baseTimeNanoseconds"], top["hostname"], top["distributedInfo"]["rank"]) == (BASE_NS, "node-a", 0)
