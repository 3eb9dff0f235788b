"""Which GPUs a parallel group spans, for the Megatron-LM rank order tp-cp-dp-pp.

Ranks are laid out with tensor parallelism fastest, then context, data and pipeline
parallelism (Megatron-LM's default order, and DeepSpeed's (pipe, data, model) topology);
consecutive ranks share a node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from paraplan.inventory.ops import ParallelDim
from paraplan.specs import ParallelPlan


@dataclass(frozen=True, slots=True)
class GroupLayout:
    """A process group of ``size`` ranks over ``nodes`` nodes, ``per_node`` ranks on each."""

    size: int
    nodes: int
    per_node: int

    @property
    def crosses_nodes(self) -> bool:
        return self.nodes > 1


def _stride(dim: ParallelDim, plan: ParallelPlan) -> int:
    """Megatron-Core orders a stage's ranks tp-cp-dp for attention and, folding the expert
    groups into the same ranks, etp-ep-edp for the experts (``expert_tensor_model_pipeline``
    order ``tp-ep-dp-pp``): expert parallelism stays within a node first."""
    if dim is ParallelDim.TP or dim is ParallelDim.ETP or dim is ParallelDim.TP_DP:
        return 1
    if dim is ParallelDim.EP:
        return plan.etp
    if dim is ParallelDim.EDP:
        return plan.etp * plan.ep
    if dim is ParallelDim.CP or dim is ParallelDim.DP:
        return plan.tp
    if dim is ParallelDim.DP_REPLICATE:
        return plan.tp * plan.zero_shards
    return plan.tp * plan.cp * plan.dp


def _size(dim: ParallelDim, plan: ParallelPlan) -> int:
    """The DP group is the gradient group: Megatron-LM reduces gradients and shards the
    distributed optimizer over data x context parallel ranks (``with_context_parallel``).
    With hybrid sharding (``data_parallel_shard_degree``) it is the shard group, and the
    replicas of each shard form the DP_REPLICATE group."""
    if dim is ParallelDim.TP:
        return plan.tp
    if dim is ParallelDim.CP:
        return plan.cp
    if dim is ParallelDim.DP:
        return plan.zero_shards
    if dim is ParallelDim.PP:
        return plan.pp
    if dim is ParallelDim.DP_REPLICATE:
        return plan.grad_group // plan.zero_shards
    if dim is ParallelDim.EP:
        return plan.ep
    if dim is ParallelDim.ETP:
        return plan.etp
    if dim is ParallelDim.TP_DP:
        return plan.tp * plan.cp * plan.dp
    return plan.edp


def group_layout(
    dim: ParallelDim, plan: ParallelPlan, gpus_per_node: int, size: int | None = None
) -> GroupLayout:
    """Where the group of parallel dimension ``dim`` lies (``size`` overrides its size, e.g.
    2 for a send/recv between neighbouring pipeline stages)."""
    n = _size(dim, plan) if size is None else size
    stride = _stride(dim, plan)
    per_node = min(n, max(1, gpus_per_node // stride)) if stride < gpus_per_node else 1
    span = n * stride
    if stride < gpus_per_node and span % gpus_per_node and gpus_per_node % span:
        # groups that do not tile the domains (16 of a 72-GPU NVLink domain): some straddle two,
        # and the slowest group, with the fewest ranks on one side, sets the collective's time
        per_node = min(per_node, max(1, math.gcd(span, gpus_per_node) // stride))
    return GroupLayout(size=n, nodes=-(-n // per_node), per_node=per_node)
