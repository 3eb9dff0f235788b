"""PyTorch's asynchronous tensor parallelism (``parallel.async_tp``, torchtitan's
enable_async_tensor_parallel) costed as torch's fused symmetric-memory operators run it."""

from __future__ import annotations

import pytest

from paraplan.catalog import resolve_job
from paraplan.costmodel import AnalyticalCostModel
from paraplan.costmodel.collectives import link_p2p_s
from paraplan.inventory import CollectiveKind, ParallelDim, count_job
from paraplan.prediction import async_tp, predict
from paraplan.prediction.async_tp import (
    ASYNC_TP_GEMMS,
    GATHER_SIDE,
    REDUCE_SIDE,
    async_tp_exposed,
    barrier_s,
    decomposed,
    weight_bytes,
)
from paraplan.prediction.stages import CommCosts, LayerCost
from paraplan.specs import Phase


def _plain(tp=8, **parallel):
    return {
        "model": "llama-3-8b",
        "cluster": {"name": "dgx-h100", "num_nodes": 1},
        "parallel": {"framework": "fsdp", "tp": tp, "pp": 1, "zero_stage": 3, "sequence_parallel": tp > 1,
                     "micro_batch_size": 2, "global_batch_size": 16 // tp * 2, **parallel},
        "precision": "bf16",
    }


def _job(tp=8, **parallel):
    return resolve_job(_plain(tp, **parallel))


def _layer(job):
    inv = count_job(job)
    cm = AnalyticalCostModel(job.cluster, job.precision)
    comm = CommCosts(inv, cm)
    block = inv.stages[0].blocks[0]
    return block, cm, comm, LayerCost.of(block, cm, comm)


def test_async_tp_decomposes_the_forward_gemms_and_only_the_input_gradients_behind_a_gathered_gradient():
    block, cm, _, plain = _layer(_job())
    _, _, _, fused = _layer(_job(async_tp=True))
    seen = 0
    for i, op in enumerate(block.ops):
        if op.name in ASYNC_TP_GEMMS:
            split = decomposed(op, 8)  # 8 GEMMs of 1/8 of the rows, each reading the weight
            assert split.launches == 8
            assert fused.fwd[i] == pytest.approx(cm.estimate_op_s(split, Phase.FWD))
            assert fused.fwd[i] > plain.fwd[i]  # lower on the GEMM curve than the whole GEMM
            weight = cm.estimate_op_s(op, Phase.BWD_WEIGHT)  # the weight gradient runs whole
            if op.name in REDUCE_SIDE:  # dY @ W is the gathered output gradient's consumer
                assert fused.bwd[i] == pytest.approx(cm.estimate_op_s(split, Phase.BWD_INPUT) + weight)
                assert fused.bwd[i] > plain.bwd[i]
            else:  # its input gradient feeds a sum, then an NCCL reduce-scatter: whole
                assert op.name in GATHER_SIDE
                assert fused.bwd[i] == plain.bwd[i]
            seen += 1
        else:
            assert (fused.fwd[i], fused.bwd[i]) == (plain.fwd[i], plain.bwd[i])
    assert seen == 4
    assert fused.tp_fwd < plain.tp_fwd and fused.tp_bwd < plain.tp_bwd


def test_the_backward_reduce_scatter_of_summed_input_gradients_stays_an_nccl_reduce_scatter():
    block, cm, comm, fused = _layer(_job(async_tp=True))
    _, _, _, plain = _layer(_job())
    tp = [c for c in block.collectives if c.dim is ParallelDim.TP]
    gather = next(c for c in tp if c.kind is CollectiveKind.ALL_GATHER and c.phase is Phase.BWD_INPUT)
    scatter = next(c for c in tp if c.kind is CollectiveKind.REDUCE_SCATTER and c.phase is Phase.BWD_INPUT)
    dgrads = [cm.estimate_op_s(decomposed(op, 8), Phase.BWD_INPUT) for op in block.ops if op.name in REDUCE_SIDE]
    assert fused.tp_bwd == pytest.approx(async_tp_exposed(dgrads, gather, cm, comm) + comm.seconds(scatter))
    assert fused.tp_bwd > comm.seconds(scatter) > 0.0
    assert plain.tp_bwd == pytest.approx(comm.seconds(gather) + comm.seconds(scatter))


@pytest.mark.parametrize("precision, per_element", [("bf16", 2), ("fp8", 1)])
def test_each_decomposed_gemm_reads_the_whole_weight_again(precision, per_element):
    job = resolve_job({**_plain(), "precision": precision})
    for op in (o for o in count_job(job).stages[0].blocks[0].ops if o.name in ASYNC_TP_GEMMS):
        dims = dict(op.dims)
        assert weight_bytes(op) == per_element * dims["k"] * dims["n"]
        split = decomposed(op, 8)
        assert split.bytes - op.bytes == pytest.approx(7 * weight_bytes(op))
        assert split.work(Phase.BWD_INPUT)[1] - op.work(Phase.BWD_INPUT)[1] == pytest.approx(7 * weight_bytes(op))
        assert split.work(Phase.BWD_WEIGHT) == op.work(Phase.BWD_WEIGHT)


def test_a_fused_call_s_barriers_outside_its_steps_stay_exposed_and_a_scatter_s_step_barriers_lengthen_its_copies(monkeypatch):
    block, cm, comm, _ = _layer(_job(async_tp=True))
    barrier = barrier_s(comm)
    assert barrier == _job().cluster.intra_node.latency_s > 0.0
    colls = [c for c in block.collectives if c.dim is ParallelDim.TP]
    hidden = [async_tp_exposed([1e3] * c.count, c, cm, comm) for c in colls]  # every copy hidden
    bare = [async_tp_exposed([0.0] * c.count, c, cm, comm) for c in colls]  # every copy exposed
    monkeypatch.setattr(async_tp, "barrier_s", lambda comm: 0.0)
    for coll, exposed, alone in zip(colls, hidden, bare, strict=True):
        gathers = coll.kind is CollectiveKind.ALL_GATHER
        outside = 3 if gathers else 2  # gather: before and after "mv", at the end; scatter: start, end
        steps = 0 if gathers else 7 * 2  # a scatter's step: a barrier before and after the pull
        without = async_tp_exposed([1e3] * coll.count, coll, cm, comm)
        assert exposed - without == pytest.approx(coll.count * outside * barrier)
        assert without > 0.0  # the local copy or the partials' sum
        alone_without = async_tp_exposed([0.0] * coll.count, coll, cm, comm)
        assert alone - alone_without == pytest.approx(coll.count * (outside + steps) * barrier)


def test_async_tp_never_hides_more_than_its_matmuls():
    block, _, _, _ = _layer(_job(async_tp=True))
    _, cm, comm, _ = _layer(_job(async_tp=True))
    for coll in (c for c in block.collectives if c.dim is ParallelDim.TP):
        # copy-engine copies at the link's p2p rate (not NCCL: never the send/recv curve)
        copies = 7 * link_p2p_s(coll.bytes / 8, comm.layouts[coll.dim], cm.cluster)
        for matmul in (0.0, copies / 2, copies, 10 * copies):
            exposed = async_tp_exposed([matmul] * coll.count, coll, cm, comm)
            assert exposed >= coll.count * (copies - matmul) - 1e-12
            assert exposed > 0.0  # the local shard's copy or the partials' sum is never hidden
        # with no matmul beside it every copy is exposed
        assert async_tp_exposed([0.0] * coll.count, coll, cm, comm) >= coll.count * copies


def test_with_tp_1_nothing_changes():
    plain, fused = predict(_job(tp=1)), predict(_job(tp=1, async_tp=True))
    assert fused.iteration_s == plain.iteration_s
    assert [m.total for m in fused.memory] == [m.total for m in plain.memory]


def test_async_tp_changes_time_but_not_memory_on_llama_3_8b_tp8():
    plain, fused = predict(_job()), predict(_job(async_tp=True))
    assert fused.iteration_s < plain.iteration_s
    assert [m.total for m in fused.memory] == [m.total for m in plain.memory]


@pytest.mark.parametrize("parallel, words", [
    ({"framework": "megatron"}, "framework megatron"),
    ({"tp_comm_overlap": True}, "set one"),
])
def test_async_tp_is_refused_outside_pytorch_and_beside_userbuffers(parallel, words):
    with pytest.raises(Exception, match=words):
        _job(async_tp=True, **parallel)


def _titan(model, nodes, local_batch, recompute, async_tp):
    return resolve_job({
        "model": model, "cluster": {"name": "dgx-h100", "num_nodes": nodes, "power_cap_w": 500},
        "parallel": {"framework": "fsdp", "zero_stage": 3, "tp": 8, "pp": 1, "sequence_parallel": True,
                     "micro_batch_size": local_batch, "global_batch_size": local_batch * nodes,
                     "recompute": recompute, "async_tp": async_tp},
        "precision": "bf16",
    })


@pytest.mark.parametrize("model, nodes, local_batch, recompute, before", [
    ("llama-3.1-70b", 32, 16, "full", 1.179),
    ("llama-3.1-8b", 8, 12, "op", 1.146),
])
def test_async_tp_s_gain_on_torchtitan_s_bf16_benchmarks_stays_below_what_the_unfused_backward_allowed(
        model, nodes, local_batch, recompute, before):
    """torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (500 W H100s, bf16)
    measured 1.09x (70B, FSDP 32 x TP 8, full AC, local batch 16) and 1.10x (8B, FSDP 8 x TP 8,
    per-op SAC, local batch 12); compared, never fitted. ``before``: the gain predicted while
    the backward reduce-scatter was taken as fused (it is not: the pass finds no producer matmul).
    Predicted now: 1.143x and 1.093x (per-op SAC gathers the sequence-parallel inputs again in
    the backward pass, fused or not: ``inventory.recompute._op_regathers``)."""
    plain = predict(_titan(model, nodes, local_batch, recompute, False)).iteration_s
    fused = predict(_titan(model, nodes, local_batch, recompute, True)).iteration_s
    assert 1.0 < plain / fused < before - 0.03


def test_async_tp_copies_take_the_links_rate_not_the_nccl_send_recv_curve():
    job = _job(async_tp=True)
    assert "send_recv" in job.cluster.intra_node.collectives  # XLA's measured permutes on H100
    link = job.cluster.intra_node.model_copy(update={"collectives": {
        k: c for k, c in job.cluster.intra_node.collectives.items() if k != "send_recv"}})
    bare = job.model_copy(update={"cluster": job.cluster.model_copy(update={"intra_node": link})})
    with_curve, without = _layer(job), _layer(bare)
    coll = next(c for c in with_curve[0].collectives if c.dim is ParallelDim.TP)
    assert async_tp_exposed([0.0] * coll.count, coll, with_curve[1], with_curve[2]) == pytest.approx(
        async_tp_exposed([0.0] * coll.count, coll, without[1], without[2]))
