"""A GPU communication kernel is the host collective that launched it: its kind, process group and
bytes come from the `record_param_comms` / `nccl:*` / `c10d::*` events around its launching runtime
call (same `args.correlation`), else from its own name and arguments; the host's `nccl:*`
annotations are no transfers on a GPU trace; DeepEP/NVSHMEM all-to-all kernels are EP
communication. Checked on hand-made traces and on HolisticTraceAnalysis's test traces
(../shared/data/traces/hta)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from hta_traces import hta_trace, write_trace
from paraplan.traces.decode import decode_trace
from paraplan.traces.rules import classify

_hta, _write = hta_trace, write_trace


def _host(name: str, ts: float, dur: float, cat: str = "cpu_op", args: dict | None = None) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args or {}}


def _launch(correlation: int, ts: float) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts, "dur": 2,
            "args": {"correlation": correlation}}


def _kernel(name: str, correlation: int | None, ts: float, dur: float, args: dict | None = None) -> dict:
    extra = {} if correlation is None else {"correlation": correlation}
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 20, "ts": ts, "dur": dur,
            "args": {**extra, **(args or {})}}


SENDRECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8(ncclDevComm*, unsigned long, ncclWork*)"
RECORD_ARGS = {"Collective name": "all_to_all", "In msg nelems": 4096, "Out msg nelems": 4096, "dtype": "BFloat16",
               "Group size": 8, "Process Group Name": "5", "Process Group Description": "ep_group"}


def _all_to_all(tmp_path: Path, record_args: dict | None, annotation_args: dict | None = None) -> Path:
    """One step whose host runs c10d::alltoall_base_ > record_param_comms > nccl:all_to_all >
    cudaLaunchKernel, and the GPU runs the SendRecv kernel that NCCL implements it with."""
    events = [
        _host("ProfilerStep#3", 0, 1000, cat="user_annotation"),
        _host("c10d::alltoall_base_", 100, 100),
        _host("record_param_comms", 110, 80, args=record_args),
        _host("nccl:all_to_all", 120, 60, cat="user_annotation", args=annotation_args),
        _launch(42, 130),
        _kernel(SENDRECV, 42, 300, 400),
    ]
    return _write(events, tmp_path / "rank0.json.gz")


def test_a_sendrecv_kernel_launched_by_an_all_to_all_is_an_all_to_all_with_its_hosts_group_and_bytes(tmp_path):
    trace = decode_trace(_all_to_all(tmp_path, RECORD_ARGS))
    (c,) = trace.collectives  # the host's nccl:all_to_all annotation is no second transfer
    assert (c.kind, c.dimension, c.group, c.group_size, c.bytes) == ("all_to_all", "ep", "ep_group", 8, 8192)
    assert trace.iterations[0].comm_by_kind == {"ep all_to_all": pytest.approx(400e-6)}


def test_without_host_arguments_the_kind_is_the_annotations_and_the_bytes_its_input_tensors(tmp_path):
    dims = {"Input Dims": [[16, 128]], "Input type": ["float"]}
    (c,) = decode_trace(_all_to_all(tmp_path, None, dims)).collectives
    assert (c.kind, c.dimension, c.bytes) == ("all_to_all", "ep", 16 * 128 * 4)


def test_a_kernel_with_no_launching_call_keeps_its_own_name_and_arguments(tmp_path):
    events = [_host("ProfilerStep#1", 0, 1000, cat="user_annotation"),
              _host("record_param_comms", 100, 50, args=RECORD_ARGS),
              _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", None, 300, 100,
                      {"Collective name": "allreduce", "In msg nelems": 10, "dtype": "Float",
                       "Process Group Description": "TENSOR_MODEL_PARALLEL_GROUP", "Group size": 2})]
    (c,) = decode_trace(_write(events, tmp_path / "t.json.gz")).collectives
    assert (c.kind, c.dimension, c.bytes, c.group_size) == ("all_reduce", "tp", 40, 2)


def test_a_kernel_launched_outside_any_host_collective_is_named_by_its_kernel(tmp_path):
    events = [_host("ProfilerStep#1", 0, 1000, cat="user_annotation"),
              _host("record_param_comms", 100, 20, args=RECORD_ARGS),
              _launch(9, 500),
              _kernel(SENDRECV, 9, 600, 100)]
    (c,) = decode_trace(_write(events, tmp_path / "t.json.gz")).collectives
    assert (c.kind, c.dimension, c.bytes) == ("send_recv", "pp", None)


def test_on_a_trace_without_kernels_the_hosts_collective_annotations_are_the_transfers(tmp_path):
    events = [_host("ProfilerStep#1", 0, 1000, cat="user_annotation"),
              _host("gloo:all_reduce", 100, 200, cat="user_annotation",
                    args={"Input Dims": [[256]], "Input type": ["float"]}),
              _host("nccl:all_gather", 400, 100, cat="user_annotation")]
    kinds = sorted((c.kind, c.bytes) for c in decode_trace(_write(events, tmp_path / "t.json.gz")).collectives)
    assert kinds == [("all_gather", None), ("all_reduce", 1024)]


@pytest.mark.parametrize("name", [
    "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*, int*, "
    "int4 const*, float const*, long const*, float const*, bool const*, int const*, int, int, int, int, int, "
    "int, int, void**, int, int, int)",
    "void deep_ep::intranode::combine<__nv_bfloat16, 8, 768, 4096>(__nv_bfloat16*, float*, void const*, "
    "float const*, int const*, int const*, int const*, int const*, int, int, int, void**, int, int, int, int)",
    "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*, int, int, int, int "
    "const*, int*, int*, int, void**, int**, int)",
    "void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*, float*, int*, long*, int*, int*, void*, int*, "
    "void*, int*, void const*, long const*, int*, int*, int, int, int, int, int, int, int, int)",
    "void deep_ep::internode_ll::combine<false, 3, 7168, 9>(void*, void*, int*, void*, void const*, long const*, "
    "float const*, int const*, long const*, int*, int*, int, int, int, int, int, int, int, int, int, bool)",
    "void deep_ep::internode::cached_notify<2>(int, int, int, int, int, int*, int, int*, int*, int const*, "
    "int*, void*, int, void**, int, int**, int, int, bool)",
])
def test_deepep_dispatch_and_combine_kernels_are_all_to_all_communication(name):
    verdict = classify(name, "kernel")
    assert (verdict.klass, verdict.collective, verdict.transfer) == ("comm", "all_to_all", True)


def test_deepeps_layout_kernel_is_compute_not_communication():
    name = "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, int)"
    assert classify(name, "kernel").klass != "comm"


def test_a_deepep_dispatch_on_the_gpu_is_expert_parallel_all_to_all(tmp_path):
    name = "void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*, float*, int*)"
    events = [_host("ProfilerStep#1", 0, 1000, cat="user_annotation"), _launch(5, 100),
              _kernel(name, 5, 200, 300)]
    trace = decode_trace(_write(events, tmp_path / "t.json.gz"))
    assert trace.iterations[0].comm_by_kind == {"ep all_to_all": pytest.approx(300e-6)}


@pytest.mark.shared_data
def test_on_hta_set_a_the_recommenders_sendrecv_kernels_are_its_all_to_alls_not_pipeline_p2p():
    trace = decode_trace(_hta("A_vit128_sampled"))
    kinds = Counter(c.kind for c in trace.collectives)
    assert kinds == {"all_to_all": 4, "all_reduce": 4, "all_gather": 2}
    assert all(not k.startswith("pp") for it in trace.iterations for k in it.comm_by_kind)
    assert {c.dimension for c in trace.collectives if c.kind == "all_to_all"} == {"ep"}


@pytest.mark.shared_data
def test_on_hta_set_b_the_collectives_are_its_21_nccl_kernels_with_their_bytes():
    trace = decode_trace(_hta("B_resnet_nccl_a100"))
    assert len(trace.collectives) == 21  # HTA's tests/test_nccl_parser (nccl_parser_config)
    assert Counter(c.kind for c in trace.collectives) == {"all_reduce": 15, "broadcast": 6}
    assert all(c.bytes and c.group == "default_pg" and c.group_size == 2 for c in trace.collectives)


def test_a_host_collective_on_another_thread_does_not_name_a_kernel_it_did_not_launch(tmp_path):
    other = {**_host("nccl:all_to_all", 100, 500, cat="user_annotation"), "tid": 2}
    events = [_host("ProfilerStep#1", 0, 1000, cat="user_annotation"), other, _launch(9, 200),
              _kernel(SENDRECV, 9, 300, 100)]
    (c,) = decode_trace(_write(events, tmp_path / "t.json.gz")).collectives
    assert c.kind == "send_recv"
