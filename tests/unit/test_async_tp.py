"""PyTorch's asynchronous tensor parallelism (``parallel.async_tp``, torchtitan's
enable_async_tensor_parallel) costed as torch's fused symmetric-memory operators run it."""

from __future__ import annotations

import dataclasses

import pytest

from paraplan.catalog import resolve_job
from paraplan.costmodel import AnalyticalCostModel
from paraplan.inventory import CollectiveKind, ParallelDim, count_job
from paraplan.prediction import predict
from paraplan.prediction.async_tp import ASYNC_TP_GEMMS, async_tp_exposed
from paraplan.prediction.stages import CommCosts, LayerCost
from paraplan.specs import Phase


def _job(tp=8, **parallel):
    return resolve_job({
        "model": "llama-3-8b",
        "cluster": {"name": "dgx-h100", "num_nodes": 1},
        "parallel": {"framework": "fsdp", "tp": tp, "pp": 1, "zero_stage": 3, "sequence_parallel": tp > 1,
                     "micro_batch_size": 2, "global_batch_size": 16 // tp * 2, **parallel},
        "precision": "bf16",
    })


def _layer(job):
    inv = count_job(job)
    cm = AnalyticalCostModel(job.cluster, job.precision)
    comm = CommCosts(inv, cm)
    block = inv.stages[0].blocks[0]
    return block, cm, comm, LayerCost.of(block, cm, comm)


def test_async_tp_s_decomposed_matmuls_run_at_the_efficiency_of_1_over_tp_row_gemms():
    block, cm, _, plain = _layer(_job())
    _, _, _, fused = _layer(_job(async_tp=True))
    seen = 0
    for i, op in enumerate(block.ops):
        if op.name in ASYNC_TP_GEMMS:
            split = dataclasses.replace(op, launches=8)  # 8 GEMMs of 1/8 of the rows
            assert fused.fwd[i] == pytest.approx(cm.estimate_op_s(split, Phase.FWD))
            assert fused.fwd[i] > plain.fwd[i]  # lower on the GEMM curve than the whole GEMM
            weight = cm.estimate_op_s(op, Phase.BWD_WEIGHT)  # the weight gradient runs whole
            assert fused.bwd[i] == pytest.approx(cm.estimate_op_s(split, Phase.BWD_INPUT) + weight)
            seen += 1
        else:
            assert (fused.fwd[i], fused.bwd[i]) == (plain.fwd[i], plain.bwd[i])
    assert seen == 4
    assert fused.tp_fwd < plain.tp_fwd and fused.tp_bwd < plain.tp_bwd


def test_async_tp_never_hides_more_than_its_matmuls():
    block, _, _, _ = _layer(_job(async_tp=True))
    _, cm, comm, _ = _layer(_job(async_tp=True))
    for coll in (c for c in block.collectives if c.dim is ParallelDim.TP):
        step = dataclasses.replace(coll, kind=CollectiveKind.SEND_RECV, bytes=coll.bytes / 8, count=1)
        copies = 7 * comm.seconds(step)
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
