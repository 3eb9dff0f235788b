"""PyTorch's asynchronous tensor parallelism as torch runs it (``parallel.async_tp``; torchtitan's
``enable_async_tensor_parallel``).

Which collectives are fused. Under torch.compile, inductor's micro-pipeline pass
(torch/_inductor/fx_passes/micro_pipeline_tp.py at pytorch/pytorch 5f65158,
``micro_pipeline_tp_pass``) runs on the forward and on the backward graph and fuses two patterns
only:

- ``fuse_all_gather_matmul``: an all-gather whose result is the left operand of matmuls
  (``_find_consumer_matmuls``) becomes one ``symm_mem.fused_all_gather_matmul`` over all of
  them. Forward (and the recomputed forward of full recompute, which lies in the backward
  graph): the sequence-parallel gather of the norm's output feeding Q, K, V and the MLP's gate
  and up projections. Backward: the gather of the output gradient of the attention output and
  the MLP down projection feeds their input-gradient matmul ``dY @ W``; their weight gradient
  reads the gathered ``dY`` transposed (not a left operand), so it runs whole after the fused op;
- ``fuse_matmul_reduce_scatter``: a reduce-scatter whose input a single matmul produces
  (``_find_producer_matmul``) becomes ``symm_mem.fused_matmul_reduce_scatter``. Forward: the
  attention output and the MLP down projection. Backward, the reduce-scatter of the layer
  input's gradient takes the *sum* of the Q, K, V (gate, up) input gradients, not a matmul: the
  pass leaves it an NCCL reduce-scatter ("no producer matmul found for reduce scatter"; the
  pass's author: "In the backward graph, the reduce-scatters are receiving as input the addition
  of various scaled_mms, so it's not what we are looking to fuse", pytorch/pytorch PR 149946,
  2025-03: before torchtitan's async-TP benchmark of 2025-06).

How a fused op runs (torch/distributed/_symmetric_memory/__init__.py at pytorch/pytorch
006b161):

- all-gather + matmul (``_fused_all_gather_matmul_impl`` ->
  ``_pipelined_multi_all_gather_and_consume``): a barrier, the copy of the rank's shard into
  its symmetric buffer ("mv") and a second barrier before the first matmul ("we are giving up
  the chance to overlap 'mv' and 'b' with the first shard_consumer"): exposed; then the local
  shard's matmuls, and for each of the tp - 1 peers a ``copy_`` of its shard from its buffer (a
  device-to-device copy: the copy engines; "cp from different streams cannot overlap") and
  that shard's matmuls, alternating the current stream and ``_get_backend_stream()``; a last
  barrier;
- matmul + reduce-scatter (``_fused_matmul_reduce_scatter_impl`` ->
  ``_pipelined_produce_and_all2all``): a barrier, then per step on alternating streams the
  matmul of 1/tp of the rows for one peer, a barrier, the peer's pull of it, a barrier; the
  local rows last, a final barrier, then ``reduce_partials`` sums the tp partials in one
  memory-bound kernel (exposed).

So a fused pass costs its decomposed matmuls (tp GEMMs of 1/tp of the rows each: lower on the
GEMM curve, ``launches`` of the operator, each reading the whole weight again), what of the tp -
1 copies and their barriers the matmuls after the first step do not hide (copies at the link's
peer-to-peer rate, ``p2p_efficiency``; a barrier at the link's latency), and the exposed
barriers, local copy or reduction. The copies are copy-engine transfers beside the matmuls, so
the GEMMs are not slowed by them (``overlap_slowdown`` is NCCL kernels' SM contention); their
HBM traffic beside the matmuls is not priced (no cited measurement). The two streams' matmuls
overlapping each other (the code's "computation/computation overlapping") is not modelled: the
decomposed matmuls are priced one after another. A collective the pass leaves alone runs as
the NCCL collective it is, exposed as without async TP. Not modelled: ``_fused_all_gather_matmul``
takes other paths at small gathered row counts (a multicast all-gather then whole matmuls at
<= 2048 rows when the gathered input is not returned; an opt-in native kernel at 2049-4096),
and the layout copy ``force_stride_order`` may add where the producer does not write the
scatter/gather dimension outermost.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from paraplan.costmodel import CostModel
from paraplan.costmodel.collectives import link_p2p_s
from paraplan.inventory import Collective, CollectiveKind, Op, OpKind
from paraplan.specs import Phase

if TYPE_CHECKING:
    from paraplan.prediction.stages import CommCosts

#: the layer GEMMs whose input a sequence-parallel all-gather feeds forward (QKV, MLP up) and
#: whose output a reduce-scatter takes (attention output, MLP down)
GATHER_SIDE = ("linear1", "linear3")
REDUCE_SIDE = ("linear2", "linear4")
ASYNC_TP_GEMMS = frozenset(GATHER_SIDE + REDUCE_SIDE)
_BACKWARD = (Phase.BWD_INPUT, Phase.BWD_WEIGHT)
#: (collective kind, backward) -> the GEMMs inductor fuses it with; a pair not listed is not
#: fused (the backward reduce-scatter of a sum of input gradients)
FUSED_WITH = {
    (CollectiveKind.ALL_GATHER, False): GATHER_SIDE,  # gathered input -> their forward GEMMs
    (CollectiveKind.REDUCE_SCATTER, False): REDUCE_SIDE,  # their forward output -> reduce-scatter
    (CollectiveKind.ALL_GATHER, True): REDUCE_SIDE,  # gathered output gradient -> their dY @ W
}
#: barriers a fused call waits on outside its pipelined steps (``symm_mem.barrier``): the
#: all-gather's before and after the local copy and at its end, the reduce-scatter's at its
#: start and end; the reduce-scatter's steps wait on two more each (before and after the pull)
_EXPOSED_BARRIERS = {CollectiveKind.ALL_GATHER: 3, CollectiveKind.REDUCE_SCATTER: 2}
_STEP_BARRIERS = {CollectiveKind.ALL_GATHER: 0, CollectiveKind.REDUCE_SCATTER: 2}


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
    GEMMs decomposed into tp GEMMs of 1/tp of the rows (forward: all four; backward: the input
    gradient of ``REDUCE_SIDE``, behind the gathered output gradient; the weight gradients,
    ``weight``, and ``GATHER_SIDE``'s input gradients run whole), and the exposed seconds of its
    TP communication forward and backward, each fused collective beside its own matmuls
    (``async_tp_exposed``), the backward reduce-scatter as NCCL runs it."""
    tp = comm.plan.tp
    f, b = list(fwd), list(bwd)
    matmul: dict[tuple[str, bool], float] = {}  # (GEMM name, backward) -> seconds of its fused matmul
    for i, op in enumerate(ops):
        if op.kind is OpKind.GEMM and op.name in ASYNC_TP_GEMMS:
            split = decomposed(op, tp)
            f[i] = cm.estimate_op_s(split, Phase.FWD)
            matmul[op.name, False] = matmul.get((op.name, False), 0.0) + f[i]
            if op.name in REDUCE_SIDE:
                dgrad = cm.estimate_op_s(split, Phase.BWD_INPUT)
                b[i] = dgrad + weight[i]
                matmul[op.name, True] = matmul.get((op.name, True), 0.0) + dgrad
    exposed = {False: 0.0, True: 0.0}
    for c in tp_colls:
        backward = c.phase in _BACKWARD
        side = FUSED_WITH.get((c.kind, backward), ())
        times = [matmul[name, backward] for name in side if (name, backward) in matmul]
        exposed[backward] += async_tp_exposed(times, c, cm, comm) if times else comm.seconds(c)
    return tuple(f), tuple(b), exposed[False], exposed[True]


def decomposed(op: Op, tp: int) -> Op:
    """``op`` as async TP issues it: tp GEMMs of 1/tp of its rows, each ramping up on its own
    and each reading the whole weight (the shard consumer and chunk producer call the matmul
    with the same B every step): tp - 1 more reads of it, forward and for the input gradient."""
    again = (tp - 1) * weight_bytes(op)
    return dataclasses.replace(op, launches=op.launches * tp, bytes=op.bytes + again, bwd_bytes=op.bwd_bytes + again)


def operand_bytes(op: Op) -> float:
    """Bytes per operand element of a GEMM (``inventory.layer.gemm``: an FP8 GEMM reads one-byte
    operands, an FP4 one half a byte; otherwise its traffic is e (mk + kn + mn))."""
    dims = dict(op.dims)
    m, k, n = dims["m"], dims["k"], dims["n"]
    return 0.5 if op.fp4 else 1.0 if op.fp8 else op.bytes / (m * k + k * n + m * n)


def weight_bytes(op: Op) -> float:
    """Bytes of one read of a GEMM's weight [k, n]."""
    dims = dict(op.dims)
    return operand_bytes(op) * dims["k"] * dims["n"]


def barrier_s(comm: CommCosts) -> float:
    """Seconds of one ``symm_mem.barrier`` (a signal to each peer and a wait for theirs): one
    latency of the link the TP group spans (the catalog's; the barrier kernel is not measured)."""
    link = comm.cm.cluster.intra_node
    return 0.0 if link is None else link.latency_s


def async_tp_exposed(matmuls_s: list[float], coll: Collective, cm: CostModel, comm: CommCosts) -> float:
    """Exposed seconds of the ``coll.count`` fused calls of ``coll`` (an all-gather or a
    reduce-scatter) beside their decomposed matmuls ``matmuls_s`` (one per call, in order;
    otherwise their sum shared evenly by the calls).

    A call moves tp - 1 shards of 1/tp of its size, one peer-to-peer copy each (the link's
    send/recv rate and latency), one after another, each of the reduce-scatter's behind two
    barriers; the matmuls of the steps after the first (tp - 1 of tp of the call's matmul) run
    beside them, so what is longer than those stays exposed, and the local shard's matmul hides
    nothing: a call never hides more than its own matmuls. An all-gather adds the copy of the
    shard into the symmetric buffer before its first matmul, a reduce-scatter the sum of its tp
    partials (reads tp shards, writes one), both on the memory curve, and each its barriers
    outside the steps (``_EXPOSED_BARRIERS``). A collective that is neither runs as it is."""
    tp = comm.plan.tp
    shard = coll.bytes / tp
    if coll.kind is CollectiveKind.ALL_GATHER:
        local = _memory_s(cm, "async_tp_shard_copy", 2.0 * shard)
    elif coll.kind is CollectiveKind.REDUCE_SCATTER:
        local = _memory_s(cm, "async_tp_reduce_partials", coll.bytes + shard)
    else:  # not fused: runs as the collective it is
        return comm.seconds(coll)
    # a symmetric-memory copy, not an NCCL send/recv: the link's rate, never the send/recv curve
    step = link_p2p_s(shard, comm.layouts[coll.dim], comm.cm.cluster)
    barrier = barrier_s(comm)
    copies = (tp - 1) * (step + _STEP_BARRIERS[coll.kind] * barrier)
    local += _EXPOSED_BARRIERS[coll.kind] * barrier
    n = coll.count
    each = matmuls_s if len(matmuls_s) == n else [sum(matmuls_s) / n] * n
    return sum(max(0.0, copies - m * (tp - 1) / tp) + local for m in each)


def _memory_s(cm: CostModel, name: str, traffic: float) -> float:
    op = Op(name=name, kind=OpKind.ELEMENTWISE, role=name, flops=0.0, bytes=traffic, bwd_flops=0.0, bwd_bytes=0.0)
    return cm.estimate_op_s(op, Phase.FWD)
