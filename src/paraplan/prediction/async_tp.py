"""PyTorch's asynchronous tensor parallelism as torch runs it (``parallel.async_tp``; torchtitan's
``enable_async_tensor_parallel``).

Under torch.compile, inductor's micro-pipeline pass (torch/_inductor/fx_passes/micro_pipeline_tp.py)
replaces each sequence-parallel all-gather feeding matmuls with
``torch.ops.symm_mem.fused_all_gather_matmul`` and each matmul feeding a reduce-scatter with
``fused_matmul_reduce_scatter``. Their implementation (torch/distributed/_symmetric_memory/
__init__.py at pytorch/pytorch 006b161: ``_pipelined_multi_all_gather_and_consume``,
``_fused_all_gather_matmul_impl``, ``_pipelined_produce_and_all2all``,
``_fused_matmul_reduce_scatter_impl``):

- all-gather + matmul: each rank copies its shard into its symmetric-memory buffer and waits on a
  barrier (the "mv" and "b" the code leaves before the first matmul: exposed), multiplies its own
  shard first, then for each of the tp - 1 peers copies that peer's shard over NVLink
  (``copy_`` from the peer's buffer; "cp from different streams cannot overlap") and multiplies
  it, alternating two streams so that a copy runs beside the previous step's matmul;
- matmul + reduce-scatter: tp matmuls of 1/tp of the rows, each remote one's partial result
  pulled by its owner beside the next matmul, the local one last; then ``reduce_partials``
  sums the tp partials in one memory-bound kernel (exposed).

So a pass costs its decomposed matmuls (tp GEMMs of 1/tp of the rows each: lower on the GEMM
curve, ``launches`` of the operator), what of the tp - 1 copies per collective the matmuls after
the first step do not hide (copies at the link's peer-to-peer rate, ``p2p_efficiency``), and the
exposed local copy or reduction. The copies are copy-engine transfers beside the matmuls, so the
GEMMs are not slowed by them (``overlap_slowdown`` is NCCL kernels' SM contention). The two
streams' matmuls overlapping each other (the code's "computation/computation overlapping") is not
modelled: the decomposed matmuls are priced one after another.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from paraplan.costmodel import CostModel
from paraplan.inventory import Collective, CollectiveKind, Op, OpKind
from paraplan.specs import Phase

if TYPE_CHECKING:
    from paraplan.prediction.stages import CommCosts

#: the layer GEMMs whose input a sequence-parallel all-gather feeds forward (QKV, MLP up) and
#: whose output a reduce-scatter takes (attention output, MLP down); backward, the gradients'
#: collectives swap sides: the all-gathered output gradient feeds the second pair's input-gradient
#: GEMMs, the first pair's input gradients are reduce-scattered
GATHER_SIDE = ("linear1", "linear3")
REDUCE_SIDE = ("linear2", "linear4")
ASYNC_TP_GEMMS = frozenset(GATHER_SIDE + REDUCE_SIDE)
_BACKWARD = (Phase.BWD_INPUT, Phase.BWD_WEIGHT)


def runs_async_tp(comm: CommCosts) -> bool:
    """Whether the plan's TP collectives run as PyTorch's fused async-TP operators (tp > 1 and
    sequence parallelism: without it there is no all-gather or reduce-scatter to fuse)."""
    plan = comm.plan
    return bool(plan.async_tp) and plan.tp > 1 and plan.sequence_parallel


def async_tp_layer(
    ops: tuple[Op, ...],
    fwd: tuple[float, ...],
    bwd: tuple[float, ...],
    weight: tuple[float, ...],
    tp_colls: tuple[Collective, ...],
    cm: CostModel,
    comm: CommCosts,
) -> tuple[tuple[float, ...], tuple[float, ...], float, float]:
    """One layer under async TP: its operators' forward and backward seconds with the fused
    GEMMs decomposed into tp GEMMs of 1/tp of the rows (forward and input gradient; the weight
    gradient, ``weight``, runs whole on the gathered input), and the exposed seconds of its TP
    communication forward and backward, each collective beside its own matmuls
    (``async_tp_exposed``)."""
    tp = comm.plan.tp
    f, b = list(fwd), list(bwd)
    matmul: dict[tuple[str, bool], float] = {}  # (GEMM name, backward) -> seconds of its fused matmul
    for i, op in enumerate(ops):
        if op.kind is OpKind.GEMM and op.name in ASYNC_TP_GEMMS:
            split = decomposed(op, tp)
            f[i] = cm.estimate_op_s(split, Phase.FWD)
            dgrad = cm.estimate_op_s(split, Phase.BWD_INPUT)
            b[i] = dgrad + weight[i]
            matmul[op.name, False] = matmul.get((op.name, False), 0.0) + f[i]
            matmul[op.name, True] = matmul.get((op.name, True), 0.0) + dgrad
    exposed = {False: 0.0, True: 0.0}
    for c in tp_colls:
        backward = c.phase in _BACKWARD
        gathers = c.kind is CollectiveKind.ALL_GATHER
        side = GATHER_SIDE if gathers != backward else REDUCE_SIDE
        times = [matmul[name, backward] for name in side if (name, backward) in matmul]
        exposed[backward] += async_tp_exposed(times, c, cm, comm)
    return tuple(f), tuple(b), exposed[False], exposed[True]


def decomposed(op: Op, tp: int) -> Op:
    """``op`` as async TP issues it: tp GEMMs of 1/tp of its rows (each ramps up on its own)."""
    return dataclasses.replace(op, launches=op.launches * tp)


def async_tp_exposed(matmuls_s: list[float], coll: Collective, cm: CostModel, comm: CommCosts) -> float:
    """Exposed seconds of the ``coll.count`` fused calls of ``coll`` (an all-gather or a
    reduce-scatter) beside their decomposed matmuls ``matmuls_s`` (one per call, in order;
    otherwise their sum shared evenly by the calls).

    A call moves tp - 1 shards of 1/tp of its size, one peer-to-peer copy each (the link's
    send/recv rate and latency), one after another; the matmuls of the steps after the first
    (tp - 1 of tp of the call's matmul) run beside them, so what is longer than those stays
    exposed, and the local shard's matmul hides nothing: a call never hides more than its own
    matmuls. An all-gather adds the copy of the shard into the symmetric buffer before its first
    matmul, a reduce-scatter the sum of its tp partials (reads tp shards, writes one), both on
    the memory curve. A collective with no fused matmul (none of ``GATHER_SIDE``/``REDUCE_SIDE``
    in the layer) hides nothing."""
    tp = comm.plan.tp
    shard = coll.bytes / tp
    step = Collective(coll.name + "_p2p", CollectiveKind.SEND_RECV, coll.dim, shard, coll.phase)
    copies = (tp - 1) * comm.seconds(step)
    if coll.kind is CollectiveKind.ALL_GATHER:
        local = _memory_s(cm, "async_tp_shard_copy", 2.0 * shard)
    elif coll.kind is CollectiveKind.REDUCE_SCATTER:
        local = _memory_s(cm, "async_tp_reduce_partials", coll.bytes + shard)
    else:  # not fused: runs as the collective it is
        return comm.seconds(coll)
    n = coll.count
    each = matmuls_s if len(matmuls_s) == n else [sum(matmuls_s) / n] * n
    return sum(max(0.0, copies - m * (tp - 1) / tp) + local for m in each)


def _memory_s(cm: CostModel, name: str, traffic: float) -> float:
    op = Op(name=name, kind=OpKind.ELEMENTWISE, role=name, flops=0.0, bytes=traffic, bwd_flops=0.0, bwd_bytes=0.0)
    return cm.estimate_op_s(op, Phase.FWD)
