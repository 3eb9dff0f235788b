"""The trace decoder reads real profiler traces of tiny CPU runs (gloo, 2 ranks) recorded by
`python -m paraplan.traces.tinyrun ... --layers 2 --active 2 --no-shapes` into
tests/fixtures/traces/{ddp,fsdp,pipeline}, beside the run's own wall-clock timers."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from paraplan.traces.decode import decode_trace
from paraplan.traces.rules import classify, collective_kind, group_dimension
from paraplan.traces.summary import summarize
from paraplan.traces.tinyrun import load_timers

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
MODES = ("ddp", "fsdp", "pipeline")
#: The ProfilerStep span and the loop's perf_counter span differ by the profiler's own step
#: bookkeeping: tens of microseconds in these recordings.
TIME_TOLERANCE_S = 0.2e-3


@pytest.mark.parametrize("mode", MODES)
def test_the_decoder_finds_every_profiled_iteration_on_every_rank(mode):
    timers = load_timers(FIXTURES / mode)
    for rank, steps in timers.items():
        trace = decode_trace(FIXTURES / mode / f"rank{rank}.json.gz")
        assert trace.rank == rank and trace.world_size == 2 and trace.backend == "gloo"
        assert [it.step for it in trace.iterations] == sorted(steps)


@pytest.mark.parametrize("mode", MODES)
def test_iteration_times_match_the_runs_wall_clock_timers(mode):
    timers = load_timers(FIXTURES / mode)
    for rank, steps in timers.items():
        for it in decode_trace(FIXTURES / mode / f"rank{rank}.json.gz").iterations:
            assert it.iteration_s == pytest.approx(steps[it.step], abs=TIME_TOLERANCE_S)


@pytest.mark.parametrize("mode", MODES)
def test_compute_exposed_communication_and_idle_add_up_to_the_iteration(mode):
    for f in sorted((FIXTURES / mode).glob("rank*.json.gz")):
        for it in decode_trace(f).iterations:
            assert it.compute_s + it.exposed_comm_s + it.memory_s + it.idle_s == pytest.approx(it.iteration_s, rel=1e-9)
            assert sum(it.compute_by_class.values()) == pytest.approx(it.compute_s, rel=1e-9)
            assert it.overlap_s <= it.comm_s + 1e-12
            assert it.compute_by_class["gemm"] > 0 and it.compute_by_class["optimizer"] > 0


def _kinds(mode: str) -> set[str]:
    return {k for f in (FIXTURES / mode).glob("rank*.json.gz") for it in decode_trace(f).iterations
            for k in it.comm_by_kind}


def test_ddp_communicates_by_data_parallel_all_reduce_only():
    assert _kinds("ddp") == {"dp all_reduce"}


def test_fsdp_gathers_parameters_and_reduce_scatters_gradients():
    assert {"dp all_gather", "dp reduce_scatter"} <= _kinds("fsdp")
    assert not any(k.startswith("pp") for k in _kinds("fsdp"))


def test_a_two_stage_pipeline_sends_and_receives_each_micro_batch():
    assert _kinds("pipeline") == {"pp send", "pp recv"}
    summary = summarize([FIXTURES / "pipeline"])
    counts = {(c["rank"], c["kind"]): c["count_per_iteration"] for c in summary.collective_totals()}
    # 2 micro-batches: stage 0 sends 2 activations and receives 2 gradients; stage 1 the reverse
    assert counts == {(0, "send"): 2, (0, "recv"): 2, (1, "send"): 2, (1, "recv"): 2}


def test_the_summary_gives_statistics_fastest_median_noise_and_the_slowest_rank():
    s = summarize([FIXTURES / "ddp"])
    st = s.stats()
    assert st["min_s"] <= st["median_s"] <= st["p90_s"] <= st["max_s"]
    assert s.step_times_s[s.fastest_step] == st["min_s"]
    assert s.fastest_step != s.median_step  # two iterations: the fastest and the other
    assert s.noise_pct == pytest.approx(100 * (st["median_s"] / st["min_s"] - 1))
    assert s.slowest_rank in (0, 1)


def test_the_straggler_on_the_fsdp_fixture_is_the_rank_that_starts_each_collective_last():
    s = summarize([FIXTURES / "fsdp"])
    waits = s.waits_caused()
    # rank 1 reaches the all-gathers late (the same GEMM takes it 3x as long): rank 0 waits
    assert s.slowest_rank == 1 and waits[1] > 10 * waits[0]
    # and rank 0's iteration is the longer one, because it holds that waiting
    shares = {sh.rank: sh for sh in s.shares()}
    assert shares[0].iteration_s > shares[1].iteration_s and shares[0].comm_s > shares[1].comm_s


def test_the_straggler_is_who_the_others_wait_for_not_who_has_the_most_compute():
    s = summarize([FIXTURES / "ddp-shapes"])
    shares = {sh.rank: sh for sh in s.shares()}
    assert shares[1].compute_s > shares[0].compute_s  # by compute, rank 1
    waits = s.waits_caused()
    assert waits[0] > waits[1] and s.slowest_rank == 0  # but rank 1 waits for rank 0


def test_without_collectives_to_match_the_straggler_is_the_rank_with_the_most_compute():
    s = summarize([FIXTURES / "pipeline"])  # sends and receives only: the receiver alone waits
    assert s.waits_caused() is None
    assert s.slowest_rank == max(s.shares(), key=lambda sh: sh.compute_s).rank


def test_a_partly_overlapping_event_closes_its_parent_instead_of_being_cut(tmp_path):
    # torch 2.13 records c10d::send, then gloo:send starting a few microseconds before it ends
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::send", "pid": 1, "tid": 1, "ts": 10, "dur": 20},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:send", "pid": 1, "tid": 1, "ts": 28, "dur": 50},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 80, "dur": 10},
    ]
    it = decode_trace(_write(events, tmp_path / "rank0.json.gz")).iterations[0]
    assert it.comm_by_kind["pp send"] == pytest.approx(68e-6)
    assert it.compute_by_class == {"gemm": pytest.approx(10e-6)}
    assert it.idle_s == pytest.approx(22e-6)


def test_a_gpu_trace_is_read_from_its_kernels_and_nccl_arguments(tmp_path):
    nccl = {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024, "Group size": 4,
            "dtype": "BFloat16", "Process Group Name": "3", "Process Group Description": "TENSOR_MODEL_PARALLEL_GROUP",
            "Process Group Ranks": "[0, 1, 2, 3]"}
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1, "tid": 1, "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32", "pid": 0, "tid": 7, "ts": 100, "dur": 300},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*)", "pid": 0,
         "tid": 20, "ts": 300, "dur": 400, "args": nccl},
        {"ph": "X", "cat": "kernel", "name": "vectorized_elementwise_kernel<4>", "pid": 0, "tid": 7, "ts": 800, "dur": 50},
    ]
    trace = decode_trace(_write(events, tmp_path / "rank3.json"))
    it = trace.iterations[0]
    assert trace.device == "gpu" and trace.rank == 3
    assert it.compute_by_class == {"gemm": pytest.approx(300e-6), "elementwise": pytest.approx(50e-6)}
    assert it.comm_by_kind == {"tp all_reduce": pytest.approx(400e-6)}
    assert it.overlap_s == pytest.approx(100e-6) and it.exposed_by_dimension == {"tp": pytest.approx(300e-6)}
    (c,) = trace.collectives
    assert (c.kind, c.dimension, c.bytes, c.group_size, c.step) == ("all_reduce", "tp", 2048, 4, 7)


def test_the_fixtures_decode_to_what_the_decoder_gave_before_it_was_made_fast():
    # decoded.json: every iteration and collective of each fixture, as the decoder of main at
    # 5042c42 (tuples per event, no caches, no merged segments) gave them
    before = json.loads((FIXTURES / "decoded.json").read_text())
    for name, expected in before.items():
        trace = decode_trace(FIXTURES / name)
        assert [asdict(it) for it in trace.iterations] == expected["iterations"], name
        assert [asdict(c) for c in trace.collectives] == expected["collectives"], name
        assert trace.events == expected["events"], name


def test_back_to_back_events_of_one_class_still_split_at_an_iteration_edge(tmp_path):
    steps = [(1, 0, 100), (2, 100, 0), (3, 100, 100)]  # step 2 takes no time
    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1, "ts": ts,
               "dur": dur} for n, ts, dur in steps]
    events += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": ts, "dur": 50}
               for ts in (50, 100)]
    first, empty, last = decode_trace(_write(events, tmp_path / "rank0.json")).iterations
    assert first.compute_by_class == last.compute_by_class == {"gemm": pytest.approx(50e-6)}
    assert empty.compute_by_class == {} and empty.iteration_s == 0


@pytest.mark.parametrize(("name", "kind"), [
    ("gloo:all_reduce", "all_reduce"), ("c10d::_allgather_base_", "all_gather"),
    ("c10d::_reduce_scatter_base_", "reduce_scatter"), ("gloo:recv", "recv"), ("c10d::send", "send"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"), ("ncclKernel_SendRecv", "send_recv"),
])
def test_communication_is_named_by_its_operation(name, kind):
    verdict = classify(name, "kernel" if name.startswith("nccl") else "cpu_op")
    assert verdict.klass == "comm" and verdict.collective == kind


@pytest.mark.parametrize(("name", "klass"), [
    ("aten::addmm", "gemm"), ("aten::mm", "gemm"), ("aten::scaled_dot_product_attention", "attention"),
    ("aten::native_layer_norm", "norm"), ("Optimizer.step#AdamW.step", "optimizer"), ("aten::gelu", "elementwise"),
    ("flash_fwd_kernel", "attention"), ("cast_transpose_kernel", "fp8_cast"), ("aten::view", None),
])
def test_compute_is_classified_by_a_table_of_names(name, klass):
    assert classify(name, "kernel" if "kernel" in name else "cpu_op").klass == klass


def test_process_groups_are_mapped_to_parallel_dimensions_by_their_names():
    assert [group_dimension(n) for n in ("TENSOR_MODEL_PARALLEL_GROUP", "PIPELINE_MODEL_PARALLEL_GROUP",
            "dp_shard_cp", "EXPERT_MODEL_PARALLEL_GROUP", "default_pg")] == ["tp", "pp", "dp", "ep", None]
    assert collective_kind("AllGather") == "all_gather"


def test_importing_the_traces_package_does_not_import_torch():
    code = ("import sys, paraplan.traces.summary, paraplan.traces.tinyrun, paraplan.cli.trace; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def _write(events: list[dict], path: Path) -> Path:
    data = json.dumps({"traceEvents": events}).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path
