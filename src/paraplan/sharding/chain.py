"""The cheapest strategy per block over the block chain (issue 5, part 4).

Dynamic programming over the chain: the cost of a strategy sequence is the sum of each block's
time (:func:`~paraplan.sharding.strategies.block_cost`) and the resharding between neighbours.
The repeated segment (the layers) is costed once -- every repeat reuses the first occurrence's
block ids, so node and edge costs exist once per unique block -- and the DP then runs over the
expanded chain (a few numpy operations per position: 32 layers are 128 cheap steps). A memory budget is
met by Lagrangian relaxation: every block's time gets ``lam * memory`` added, and ``lam`` is
bisected until the plan fits (the plan with the smallest time among those found that fit).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from paraplan.sharding.graph import Graph, ParallelBlock, Segments, dataflow
from paraplan.sharding.strategies import (
    BlockCost,
    Mesh,
    Relation,
    Shape,
    Strategy,
    block_cost,
    reshard,
    shape_of,
    strategies,
)


@dataclass
class ChainCosts:
    """Per unique block: its shape, strategies and their costs (node time, memory); per
    neighbouring pair: the resharding seconds (edges)."""

    options: dict[int, list[Strategy]]
    time: dict[int, np.ndarray]
    memory: dict[int, np.ndarray]
    edge: dict[tuple[int, int], np.ndarray]
    shapes: dict[int, Shape]
    details: dict[int, list[BlockCost]]
    relations: dict[tuple[int, int], Relation]


def relations(graph: Graph, blocks: list[ParallelBlock], order: list[int]) -> dict[tuple[int, int], Relation]:
    """Per neighbouring pair of unique block ids in ``order``: how the two relate in the
    dataflow (:class:`~paraplan.sharding.strategies.Relation`), read at the pair's first
    occurrence in the chain (``blocks``: every block, in the chain's order)."""
    source, joins = dataflow(graph, blocks)
    out: dict[tuple[int, int], Relation] = {}
    for pos, pair in enumerate(itertools.pairwise(order)):
        if pair in out:
            continue
        p, q = blocks[pos], blocks[pos + 1]
        sibling = source[q.index] != p.index and source[q.index] == source[p.index]
        out[pair] = Relation("sibling" if sibling else "direct", (p.index, q.index) in joins)
    return out


def chain_costs(blocks: list[ParallelBlock], mesh: Mesh, peak_flops: float,
                pairs: dict[tuple[int, int], Relation]) -> ChainCosts:
    """Node and edge costs of the unique ``blocks`` for the neighbouring ``pairs`` (with their
    dataflow relation; a plain set of pairs means every one is ``direct``)."""
    if not isinstance(pairs, dict):
        pairs = {pair: Relation() for pair in pairs}
    options, time, memory, edge, shapes, details = {}, {}, {}, {}, {}, {}
    for b in blocks:
        shapes[b.index] = shape_of(b)
        options[b.index] = strategies(shapes[b.index], mesh)
        details[b.index] = [block_cost(shapes[b.index], s, mesh, peak_flops) for s in options[b.index]]
        time[b.index] = np.array([c.total_s for c in details[b.index]])
        memory[b.index] = np.array([c.memory_bytes for c in details[b.index]])
    for (a, b), rel in pairs.items():
        edge[a, b] = np.array([[reshard(p, q, shapes[b], mesh, rel)[0] for q in options[b]] for p in options[a]])
    return ChainCosts(options, time, memory, edge, shapes, details, dict(pairs))


def solve(order: list[int], costs: ChainCosts, lam: float = 0.0) -> tuple[float, list[int]]:
    """Exact minimum of sum(node + lam * memory) + sum(edges) over the chain ``order`` (block
    ids; repeats allowed), and the chosen strategy index per position."""
    node = {b: costs.time[b] + lam * costs.memory[b] for b in set(order)}
    best = node[order[0]].copy()
    back = []
    for prev, cur in itertools.pairwise(order):
        total = best[:, None] + costs.edge[prev, cur] + node[cur][None, :]
        back.append(total.argmin(axis=0))
        best = total.min(axis=0)
    choice = [int(best.argmin())]
    for arg in reversed(back):
        choice.append(int(arg[choice[-1]]))
    return float(best.min()), choice[::-1]


def expand(seg: Segments) -> list[int]:
    """The whole chain of block ids with the segment repeated (each repeat reuses the first
    occurrence's ids, so its costs are computed once)."""
    return list(seg.prefix) + list(seg.segment) * max(seg.repeats, 1 if seg.segment else 0) + list(seg.suffix)


def pairs_of(order: list[int]) -> set[tuple[int, int]]:
    return set(itertools.pairwise(order))


@dataclass
class Plan:
    strategies: list[Strategy]  # per position of the chain
    choice: list[int]  # the strategy index per position
    time_s: float
    memory_bytes: float  # per device, the sum over blocks
    fits: bool


def search(order: list[int], costs: ChainCosts, memory_budget: float | None = None) -> Plan:
    """The fastest strategy chain (within ``memory_budget`` bytes per device if given)."""

    def plan_for(lam: float) -> Plan:
        _, choice = solve(order, costs, lam)
        time = sum(costs.time[b][c] for b, c in zip(order, choice, strict=True))
        time += sum(costs.edge[a, b][i, j] for (a, b), (i, j) in zip(itertools.pairwise(order),
                                                                 itertools.pairwise(choice), strict=True))
        mem = sum(costs.memory[b][c] for b, c in zip(order, choice, strict=True))
        return Plan([costs.options[b][c] for b, c in zip(order, choice, strict=True)], choice, float(time), float(mem),
                    memory_budget is None or mem <= memory_budget)

    best = plan_for(0.0)
    if best.fits:
        return best
    lo, hi = 0.0, 1e-9
    while not plan_for(hi).fits and hi < 1e6:
        hi *= 10
    found = plan_for(hi)
    if not found.fits:
        return found
    for _ in range(40):
        mid = (lo + hi) / 2
        p = plan_for(mid)
        if p.fits:
            hi, found = mid, (p if p.time_s < found.time_s else found)
        else:
            lo = mid
    return found
