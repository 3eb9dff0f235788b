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


# the expert groups: a mixture-of-experts model's only, laid out in the rank order tp-ep-dp-pp
_EXPERT_DIMS = (ParallelDim.EP, ParallelDim.ETP, ParallelDim.EDP)
# the groups whose straddling a prediction reports (PP's neighbour pairs and the amax group
# follow from these)
_STRADDLE_DIMS = (ParallelDim.TP, ParallelDim.CP, ParallelDim.EP, ParallelDim.ETP, ParallelDim.DP,
                  ParallelDim.EDP, ParallelDim.DP_REPLICATE)


def straddle_notes(plan: ParallelPlan, domain: int, world: int, moe: bool = False) -> tuple[str, ...]:
    """One note per parallel group that straddles a scale-up domain of ``domain`` GPUs under the
    rank order (a span of consecutive ranks that neither tiles the domain nor is tiled by it:
    64 of a 72-GPU NVL72 rack), with how many of its groups do (one period of the layout) and
    the link it is priced at (``group_layout``: the inter-domain link, the slowest group's
    fewest ranks on one side). None on a single-domain cluster or where groups tile domains;
    the expert groups only for a mixture-of-experts model (``moe``)."""
    if world <= domain:
        return ()
    notes = []
    for dim in _STRADDLE_DIMS:
        if not moe and dim in _EXPERT_DIMS:
            continue
        n, stride = _size(dim, plan), _stride(dim, plan)
        span = n * stride
        if n < 2 or stride >= domain or not (span % domain and domain % span):
            continue
        period = math.lcm(span, domain)
        blocks = [(b * span, b * span + span - 1) for b in range(period // span)]
        crossing = sum(1 for lo, hi in blocks if lo // domain != hi // domain)
        side = group_layout(dim, plan, domain).per_node
        notes.append(
            f"{dim.value.upper()} group of {n} GPUs straddles the {domain}-GPU scale-up domain: in the rank "
            f"order {'tp-ep-dp-pp' if dim in _EXPERT_DIMS else 'tp-cp-dp-pp'} "
            f"{crossing} of every {len(blocks)} blocks of {span} consecutive ranks cross two domains, so its "
            f"collectives are priced at the inter-domain link with {side} GPUs on the smaller side (a "
            f"launcher placing each group inside one domain would keep it on the scale-up link)"
        )
    return tuple(notes)
