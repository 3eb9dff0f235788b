"""The backward tensor-parallel communication of a sequence-parallel column-parallel linear as
Megatron-LM and Transformer Engine run it without a TP-overlap library (no ``tp_comm_overlap``,
no async TP): the re-gather of the saved input shard (``inventory.sp_comm.SAVED_REGATHER``) is
issued before the input-gradient GEMM and waited for after it, and the reduce-scatter of the
input gradient is issued before the weight-gradient GEMM and waited for after it
(``megatron/core/tensor_parallel/layers.py``
``LinearWithGradAccumulationAndAsyncCommunication.backward``, both ``async_op=True``, ordered
by ``CUDA_DEVICE_MAX_CONNECTIONS=1``; Transformer Engine 0.8-2.x ``_LayerNormLinear.backward``
and ``_LayerNormMLP.backward`` alike: ``gather_along_first_dim(ln_out, ..., async_op=True)``
before the dgrad GEMM, ``reduce_scatter_along_first_dim(dgrad, ..., async_op=True)`` before
the wgrad GEMM). Each collective runs on NCCL's stream beside its one GEMM, the GEMM slowing
while they share the GPU (``schedule.overlap.overlapped_s`` with the GPU's ``overlap_slowdown``); what
the GEMM does not cover waits at ``handle.wait()``. The other backward TP collectives (the
output gradient's all-gather before the row-parallel linears' input gradient, MLA's latent
reduce-scatters, which autograd runs between modules) wait on the compute stream: exposed."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from paraplan.inventory import Collective, CollectiveKind, Op, OpKind
from paraplan.inventory.sp_comm import SAVED_REGATHER, saves_shard
from paraplan.inventory.tp_plan import COLWISE
from paraplan.schedule import exposed_beside
from paraplan.specs import Phase

if TYPE_CHECKING:
    from paraplan.prediction.stages import CommCosts

#: the hand-written layer's column-parallel linears whose backward runs the two collectives
#: beside its GEMMs (QKV, the MLP's first linear)
_COLUMN_LINEARS = ("linear1", "linear3")
# a traced GEMM's tensor-parallel style, as ``inventory.tp_plan`` writes it into the role
_STYLE = re.compile(r"\[(\w+) / \d+\]")
# the backward reduce-scatter of a column-parallel linear's input gradient (inventory.layer)
_DGRAD_RS = "tp_reducescatter"
_BACKWARD = (Phase.BWD_INPUT, Phase.BWD_WEIGHT)


def runs_async_linears(comm: CommCosts) -> bool:
    """Whether the layer's backward TP collectives are priced beside the linears' GEMMs here:
    the plan's linears keep their input shard (``saves_shard``) and neither PyTorch's async TP
    nor a userbuffers configuration prices them instead. Under ``tp_comm_overlap`` without a
    configuration these two are Transformer Engine's default ``bulk`` overlaps
    (``module/base.py`` ``initialize_ub``: ``qkv_dgrad``, ``qkv_wgrad``, ``fc1_dgrad``,
    ``fc1_wgrad``), each a whole collective beside one GEMM as here."""
    plan = comm.plan
    return saves_shard(plan) and not plan.async_tp and not (plan.tp_comm_overlap and plan.tp_comm_overlap_cfg)


def async_linears_backward(ops: tuple[Op, ...], bwd: tuple[float, ...], weight: tuple[float, ...],
                           tp_colls: tuple[Collective, ...], comm: CommCosts) -> tuple[float, float]:
    """(exposed seconds of the backward TP calls that run beside a linear's GEMM, seconds of the
    layer's other backward TP calls): each saved shard's re-gather beside its linear's input-gradient
    GEMM (``bwd - weight`` of it), each input-gradient reduce-scatter beside its weight-gradient
    GEMM, one call per column-parallel group the layer has (``_column_groups``). The others are
    exposed, each call whole (the caller may hide their sum under ``tp_comm_overlap``'s chunked
    overlap)."""
    regathered = sum(c.count for c in tp_colls if c.name == SAVED_REGATHER and c.phase in _BACKWARD)
    # backward order; a layer re-gathering one input (a MoE layer's attention, MLA's MLP)
    # re-gathers its last
    groups = _column_groups(ops, bwd, weight)[::-1]
    linears = groups[-regathered:] if regathered else []
    exposed = others = 0.0
    regathers = rscatters = 0
    for c in tp_colls:
        if c.phase not in _BACKWARD:
            continue
        each = comm.seconds(c) / c.count
        for _ in range(c.count):
            if c.name == SAVED_REGATHER and regathers < len(linears):
                dgrad, _ = linears[regathers]
                regathers += 1
                exposed += exposed_beside(dgrad, each, 0.0, comm.slowdown)
            elif (c.name == _DGRAD_RS and c.kind is CollectiveKind.REDUCE_SCATTER
                  and rscatters < len(linears)):
                _, wgrad = linears[rscatters]
                rscatters += 1
                exposed += exposed_beside(wgrad, each, 0.0, comm.slowdown)
            else:
                others += comm.call_s(c)
    return exposed, others


def _column_groups(ops: tuple[Op, ...], bwd: tuple[float, ...],
                   weight: tuple[float, ...]) -> list[tuple[float, float]]:
    """(input-gradient seconds, weight-gradient seconds) of each group of column-parallel GEMMs
    reading one gathered input, in forward order: the hand-written layer's ``linear1`` (QKV) and
    ``linear3`` (the MLP's first linear); a traced layer's GEMMs its tensor-parallel plan splits
    column-wise (``inventory.tp_plan``: the role's ``[colwise / tp]``; ``local_colwise`` experts
    gather nothing), grouped by their module (``self_attn``, ``mlp``)."""
    groups: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        if op.kind is not OpKind.GEMM:
            continue
        style = _STYLE.search(op.role)
        if op.name in _COLUMN_LINEARS:
            groups.setdefault(op.name, []).append(i)
        elif style and style.group(1) in COLWISE and style.group(1) != "local_colwise":
            groups.setdefault(op.name.rsplit(".", 1)[0], []).append(i)
    return [(sum(bwd[i] - weight[i] for i in ix), sum(weight[i] for i in ix)) for ix in groups.values()]


__all__ = ["async_linears_backward", "runs_async_linears"]
