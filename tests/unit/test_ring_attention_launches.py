"""Context-parallel attention launched as the frameworks launch it (issue 27 item 4): Transformer
Engine's AttnFuncWithCPAndKVP2P and PyTorch's _templated_ring_attention run cp launches per pass,
one per K/V chunk (the own chunk's causal square, then half-squares under causal load balancing);
Transformer Engine's all-gather one wave of two launches side by side; the all-to-all one launch
over the whole sequence with heads / cp (``inventory.layer.context_parallel_core``)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.catalog import load_gpu, resolve_job
from paraplan.catalog.loader import load_model
from paraplan.costmodel.roofline import attention_tile_s, with_attention_kernel
from paraplan.inventory import Op, OpKind, count_job, shard_shape
from paraplan.inventory.layer import attention_core, context_parallel_core
from paraplan.inventory.traced_job import in_job
from paraplan.prediction.stages import context_comm
from paraplan.specs import AttentionKernel, Phase, Precision

MODEL = load_model("llama-3-8b")
CUDNN = with_attention_kernel(load_gpu("H100-SXM5-80GB"), AttentionKernel.CUDNN).efficiency.attention
PEAK = load_gpu("H100-SXM5-80GB").flops_for(Precision.BF16)
PHASES = (Phase.FWD, Phase.BWD_INPUT)


def _cores(cp: int, kernels: str = "ring", seq: int = 16384, tp: int = 1) -> list[Op]:
    model = MODEL.model_copy(update={"seq_length": seq})
    x = shard_shape(model, tp, cp, False, 1, Precision.BF16, cp_kernels=kernels)
    return [op for op in attention_core(model, x) if op.kind is OpKind.ATTENTION]


def _work(ops: list[Op], phase: Phase) -> tuple[float, float]:
    return sum(op.work(phase)[0] for op in ops), sum(op.work(phase)[1] for op in ops)


def test_a_ring_launches_the_own_chunk_s_causal_square_and_cp_minus_one_half_squares():
    own, ring = _cores(cp=4)  # 16,384 tokens: 4,096 a rank, chunks of 2,048
    assert dict(own.dims) == {"b": 1, "h": 32, "l": 4096, "l_kv": 4096, "d": 128}
    assert (own.launches, own.exec_fraction) == (1, 0.5)
    assert dict(ring.dims) == {"b": 1, "h": 32, "l": 2048, "l_kv": 4096, "d": 128, "ring": 1}
    assert (ring.launches, ring.exec_fraction) == (3, 1.0)
    # every launch runs the same FLOPs: half of one chunk-pair square
    assert own.work(Phase.FWD)[0] == pytest.approx(ring.work(Phase.FWD)[0] / ring.launches, rel=1e-12)


def test_the_ring_s_launches_execute_the_one_launch_s_flops_bytes_and_saved_tensors():
    (whole,) = _cores(cp=4, kernels="gathered")
    ring = _cores(cp=4)
    for phase in PHASES:
        assert _work(ring, phase) == pytest.approx(whole.work(phase), rel=1e-12)
    assert sum(op.saved_bytes for op in ring) == whole.saved_bytes
    with_sinks = dataclasses.replace(whole, params=64.0)  # gpt-oss's sinks sit on the core
    model = MODEL.model_copy(update={"seq_length": 16384})
    x = shard_shape(model, 1, 4, False, 1, Precision.BF16)
    assert sum(op.params for op in context_parallel_core(with_sinks, x)) == 64.0
    assert sum(op.kept_under_selective for op in ring) == whole.kept_under_selective


def test_transformer_engine_s_all_gather_is_one_wave_over_all_keys():
    (whole,) = _cores(cp=4, kernels="gathered")
    assert dict(whole.dims)["l_kv"] == 16384 and whole.launches == 1


def test_the_all_to_all_runs_one_launch_over_the_whole_sequence_with_heads_over_cp():
    (ulysses,) = _cores(cp=4, kernels="heads", tp=2)
    (whole,) = _cores(cp=4, kernels="gathered", tp=2)
    assert dict(ulysses.dims) == {"b": 1, "h": 4, "l": 16384, "l_kv": 16384, "d": 128}
    assert ulysses.work(Phase.FWD) == whole.work(Phase.FWD)


def test_without_context_parallelism_every_kind_leaves_the_core_one_launch():
    assert _cores(cp=1) == _cores(cp=1, kernels="heads") == _cores(cp=1, kernels="gathered")
    assert len(_cores(cp=1)) == 1


@settings(max_examples=40, deadline=None)
@given(blocks=st.integers(1, 32), cp=st.sampled_from([1, 2, 4, 8]), tp=st.sampled_from([1, 2, 4, 8]),
       kernels=st.sampled_from(["ring", "gathered", "heads"]))
def test_more_cp_never_raises_one_rank_s_attention_flops(blocks, cp, tp, kernels):
    seq = 512 * 16 * blocks  # divisible by 2 x 16 chunks
    fewer, more = _cores(cp, kernels, seq, tp), _cores(2 * cp, kernels, seq, tp)
    for phase in PHASES:
        assert _work(more, phase)[0] <= _work(fewer, phase)[0] * (1 + 1e-12)


def test_the_plan_s_exchange_picks_the_launches():
    def cores(kind: str, framework: str = "megatron") -> list[Op]:
        plan = {"cp": 4, "framework": framework, "global_batch_size": 16, "cp_comm_type": kind,
                **({"zero_stage": 3} if framework == "fsdp" else {})}
        job = resolve_job({"name": "cp", "model": {"name": "llama-3-8b", "seq_length": 16384},
                           "cluster": {"name": "dgx-h100", "num_nodes": 2}, "parallel": plan, "precision": "bf16"})
        return [op for op in count_job(job).stages[0].layer_ops if op.kind is OpKind.ATTENTION]

    assert [op.launches for op in cores("p2p")] == [1, 3]
    assert [op.launches for op in cores("allgather", "fsdp")] == [1, 3]  # PyTorch's ring, gathered first
    assert [op.launches for op in cores("alltoall", "fsdp")] == [1, 3]
    assert [op.launches for op in cores("allgather")] == [1]
    assert [dict(op.dims)["h"] for op in cores("a2a")] == [8]


def test_a_traced_core_is_launched_as_the_hand_written_one():
    model = MODEL.model_copy(update={"seq_length": 16384})
    x = shard_shape(model, 1, 4, False, 1, Precision.BF16)
    traced = [op for op in attention_core(model, dataclasses.replace(x, s_kv=x.s)) if op.kind is OpKind.ATTENTION]
    hand = _cores(cp=4)
    got = [op for op in in_job(tuple(traced), x) if op.kind is OpKind.ATTENTION]

    def key(op: Op) -> tuple:
        return op.flops, op.bwd_flops, op.exec_fraction, op.dims, op.launches, op.saved_bytes

    assert [key(op) for op in got] == [key(op) for op in hand]
    assert [op.bytes for op in got] == pytest.approx([op.bytes for op in hand], rel=1e-12)


def _tile_s(op: Op, phase: Phase) -> float:
    return attention_tile_s(op, phase, op.work(phase)[0] / op.launches, PEAK, CUDNN)


def _rectangle(queries: int, keys: int, ring: bool = False) -> Op:
    flops = 4.0 * 32 * queries * keys * 128
    dims = (("b", 1), ("h", 32), ("l", queries), ("l_kv", keys), ("d", 128), *((("ring", 1),) if ring else ()))
    return Op(name="flash_atten", kind=OpKind.ATTENTION, role="core", flops=flops, bytes=0.0,
              bwd_flops=2.5 * flops, bwd_bytes=0.0, dims=dims)


def test_the_backward_tiles_the_keys_and_the_forward_the_queries():
    tiles = CUDNN.tiles
    op = _rectangle(256, 8192)  # 2 query tiles a head, 64 key tiles a head

    def expected(phase: Phase, count: int, longest: float) -> float:
        rate = tiles.fwd if phase is Phase.FWD else tiles.bwd
        work = op.work(phase)[0] + count * rate.tile_work + tiles.sms * (rate.tile_work + longest)
        return work / (PEAK * rate.max_fraction)

    per_query, per_key = 4.0 * 8192 * 128, 2.5 * 4.0 * 256 * 128  # one row of the square, each pass
    assert _tile_s(op, Phase.FWD) == pytest.approx(expected(Phase.FWD, 32 * 2, 128 * per_query), rel=1e-12)
    assert _tile_s(op, Phase.BWD_INPUT) == pytest.approx(expected(Phase.BWD_INPUT, 32 * 64, 128 * per_key), rel=1e-12)


def test_a_ring_step_is_priced_as_the_slower_of_its_shape_and_the_transpose_another_rank_runs():
    for phase in PHASES:
        slower = max(_tile_s(_rectangle(2048, 4096), phase), _tile_s(_rectangle(4096, 2048), phase))
        assert _tile_s(_rectangle(2048, 4096, ring=True), phase) == pytest.approx(slower, rel=1e-12)
        assert _tile_s(_rectangle(4096, 2048, ring=True), phase) == pytest.approx(slower, rel=1e-12)


def test_cp_launches_over_chunks_take_longer_than_one_launch_over_all_keys_with_the_same_flops():
    (whole,) = _cores(cp=8, kernels="gathered")
    ring = _cores(cp=8)
    for phase in PHASES:
        one = _tile_s(whole, phase) * whole.launches
        launched = sum(_tile_s(op, phase) * op.launches for op in ring)
        assert launched > one


class _Comm:
    """A stand-in ``CommCosts``: every send takes ``send_s``, overlap slows nothing."""

    def __init__(self, plan, send_s: float) -> None:
        self.plan, self.slowdown, self.send_s = plan, 0.0, send_s

    def seconds(self, coll) -> float:
        return self.send_s * coll.count

    def total(self, colls, phases) -> float:
        return sum(self.seconds(c) for c in colls if c.phase in phases)


def _ring_exposed(framework: str, kind: str, own: float, step: float, send: float = 1.0) -> tuple[float, float]:
    plan = {"cp": 4, "framework": framework, "global_batch_size": 16, "cp_comm_type": kind,
            **({"zero_stage": 3} if framework == "fsdp" else {})}
    job = resolve_job({"name": "cp", "model": {"name": "llama-3-8b", "seq_length": 16384},
                       "cluster": {"name": "dgx-h100", "num_nodes": 2}, "parallel": plan, "precision": "bf16"})
    colls = tuple(c for c in count_job(job).stages[0].layer_collectives if c.dim.value == "cp")
    return context_comm((own, 3 * step), (own, 3 * step), colls, _Comm(job.parallel, send))


def test_each_send_hides_behind_the_launch_it_runs_beside():
    # forward: the first send beside the own chunk's launch, the second beside a ring step, the
    # third step sends nothing: an own launch of 1 s hides its send, ring steps of 0.25 s do not
    assert _ring_exposed("megatron", "p2p", own=1.0, step=0.25)[0] == pytest.approx(2 * 0.75)
    # backward: Transformer Engine runs the own chunk last, so its sends see only ring steps
    # (and the last dK/dV hop is exposed whole); PyTorch's ring runs the own chunk first
    te = _ring_exposed("megatron", "p2p", own=1.0, step=0.25)[1]
    torch = _ring_exposed("fsdp", "alltoall", own=1.0, step=0.25)[1]
    assert te == pytest.approx(3 * 0.75 + 1.0) and torch == pytest.approx(2 * 0.75 + 1.0)


def test_a_latent_attention_core_rings_its_chunks_with_every_head_s_keys_and_values():
    from paraplan.inventory.layer import attention_block_ops

    model = load_model("deepseek-v3").model_copy(update={"seq_length": 16384})

    def cores(cp: int, kernels: str) -> list[Op]:
        x = shard_shape(model, 8, cp, False, 1, Precision.BF16, cp_kernels=kernels)
        return [op for op in attention_block_ops(model, x) if op.kind is OpKind.ATTENTION]

    (whole,), (own, ring) = cores(4, "gathered"), cores(4, "ring")
    assert [own.launches, ring.launches] == [1, 3]
    for phase in PHASES:
        assert _work([own, ring], phase) == pytest.approx(whole.work(phase), rel=1e-12)
    # q and o once, each chunk's k and v over all 16 heads: the own launch moves 2 of 5 parts
    assert own.bytes == pytest.approx(whole.bytes * 2 / 5, rel=1e-12)
