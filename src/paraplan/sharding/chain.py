"""The cheapest strategy per block over the block chain (issue 5, part 4).

Dynamic programming over the chain: the cost of a strategy sequence is the sum of each block's
time (:func:`~paraplan.sharding.strategies.block_cost`) and the resharding between neighbours.
The repeated segment (the layers) is costed once -- every repeat reuses the first occurrence's
block ids, so node and edge costs exist once per unique block -- and the DP then runs over the
expanded chain (a few numpy operations per position: 32 layers are 128 cheap steps).

A memory budget makes the problem a constrained shortest path. It is solved exactly in two
steps: Lagrangian relaxation (every block's time gets ``lam * memory`` added, ``lam`` bisected
until the plan fits) gives a good plan that fits quickly; then a dynamic programme over
Pareto fronts of (memory, time) per position and strategy finds the optimum, pruning every
partial plan that cannot fit (its memory plus the least memory the rest can take) or cannot
beat the Lagrangian plan (its time plus the rest's unconstrained optimum). Tests compare both
with brute force.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from paraplan.sharding.graph import Dataflow, ParallelBlock, Segments
from paraplan.sharding.strategies import (
    BlockCost,
    Mesh,
    Relation,
    Shape,
    Strategy,
    block_cost,
    enter,
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
    stream: tuple[str | None, ...] | None = None  # the residual stream's layout the edges assume
    entry: np.ndarray | None = None  # per strategy of the first position: reading the step's input


def relations(flow: Dataflow, blocks: list[ParallelBlock], order: list[int]) -> dict[tuple[int, int], Relation]:
    """Per neighbouring pair of unique block ids in ``order``: how the two relate in the
    dataflow ``flow`` (:class:`~paraplan.sharding.strategies.Relation`), read at the pair's
    first occurrence in the chain (``blocks``: every block, in the chain's order)."""
    source, joins, glue = flow.source, flow.joins, flow.glue_bytes
    out: dict[tuple[int, int], Relation] = {}
    for pos, pair in enumerate(itertools.pairwise(order)):
        if pair in out:
            continue
        p, q = blocks[pos], blocks[pos + 1]
        sibling = source[q.index] != p.index and source[q.index] == source[p.index]
        through = glue.get(p.index) if not sibling and source[q.index] == p.index else None
        out[pair] = Relation("sibling" if sibling else "direct", (p.index, q.index) in joins, through,
                             q.index in flow.readers, p.index in flow.writers and not sibling)
    return out


def chain_costs(blocks: list[ParallelBlock], mesh: Mesh, peak_flops: float,
                pairs: dict[tuple[int, int], Relation], stream: tuple[str | None, ...] | None = None) -> ChainCosts:
    """Node and edge costs of the unique ``blocks`` for the neighbouring ``pairs`` (with their
    dataflow relation; a plain set of pairs means every one is ``direct``); with ``stream``
    (the residual stream's layout per mesh axis), edges into its readers go through it."""
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
        edge[a, b] = np.array([[reshard(p, q, shapes[b], mesh, rel, stream, shapes[a])[0] for q in options[b]]
                               for p in options[a]])
    return ChainCosts(options, time, memory, edge, shapes, details, dict(pairs), stream)


def set_stream(costs: ChainCosts, mesh: Mesh, stream: tuple[str | None, ...], order: list[int],
               reads: set[int]) -> None:
    """Recost the edges with the residual stream in layout ``stream`` (per mesh axis "M" or
    None): every block reading the stream takes its input from that layout, every block added
    into it brings its output to it; the first block (``order[0]``), if it reads the step's
    input (``reads``: the blocks reading the stream), pays for that too."""
    costs.stream = stream
    first = order[0] if order else None
    if first is not None and first in reads:
        costs.entry = np.array([enter(stream, q, costs.shapes[first], mesh)[0] for q in costs.options[first]])
    for (a, b), rel in costs.relations.items():
        costs.edge[a, b] = np.array([[reshard(p, q, costs.shapes[b], mesh, rel, stream, costs.shapes[a])[0]
                                      for q in costs.options[b]] for p in costs.options[a]])


def solve(order: list[int], costs: ChainCosts, lam: float = 0.0) -> tuple[float, list[int]]:
    """Exact minimum of sum(node + lam * memory) + sum(edges) over the chain ``order`` (block
    ids; repeats allowed), and the chosen strategy index per position."""
    node = {b: costs.time[b] + lam * costs.memory[b] for b in set(order)}
    best = node[order[0]] + (costs.entry if costs.entry is not None else 0.0)
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
        return plan_for_choice(order, costs, solve(order, costs, lam)[1], memory_budget)

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
    exact = _pareto_search(order, costs, memory_budget, found.time_s)
    return plan_for_choice(order, costs, exact, memory_budget) if exact is not None else found


def plan_for_choice(order: list[int], costs: ChainCosts, choice: list[int], memory_budget: float | None) -> Plan:
    time = sum(costs.time[b][c] for b, c in zip(order, choice, strict=True))
    time += costs.entry[choice[0]] if costs.entry is not None else 0.0
    time += sum(costs.edge[a, b][i, j] for (a, b), (i, j) in zip(itertools.pairwise(order),
                                                             itertools.pairwise(choice), strict=True))
    mem = sum(costs.memory[b][c] for b, c in zip(order, choice, strict=True))
    return Plan([costs.options[b][c] for b, c in zip(order, choice, strict=True)], list(choice), float(time),
                float(mem), memory_budget is None or mem <= memory_budget)


def _pareto_search(order: list[int], costs: ChainCosts, budget: float, upper: float) -> list[int] | None:
    """The fastest chain within ``budget`` (exact), or None if none beats ``upper``."""
    n = len(order)
    node_t = [costs.time[b] for b in order]
    node_m = [costs.memory[b] for b in order]
    edges = [costs.edge[a, b] for a, b in itertools.pairwise(order)]
    # least time and memory the positions after p can add (unconstrained), given p's strategy
    to_go_t = [np.zeros(len(node_t[-1]))]
    for p in range(n - 2, -1, -1):
        to_go_t.append((edges[p] + (node_t[p + 1] + to_go_t[-1])[None, :]).min(axis=1))
    to_go_t.reverse()
    mins = [float(m.min()) for m in node_m]
    to_go_m = np.concatenate([np.cumsum(mins[::-1])[::-1][1:], [0.0]])
    slack = 1e-12 * max(upper, 1e-30)
    # fronts[p][k] = (memory, time, previous strategy, index in its front), memory ascending
    fronts: list[list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]] = []
    for p in range(n):
        row = []
        for k in range(len(node_t[p])):
            if p == 0:
                start = costs.entry[k] if costs.entry is not None else 0.0
                mem, tim = np.array([node_m[0][k]]), np.array([node_t[0][k] + start])
                prev, idx = np.array([-1]), np.array([-1])
            else:
                parts = [(f[0] + node_m[p][k], f[1] + edges[p - 1][j, k] + node_t[p][k], np.full(len(f[0]), j),
                          np.arange(len(f[0]))) for j, f in enumerate(fronts[-1]) if len(f[0])]
                if not parts:
                    row.append((np.empty(0), np.empty(0), np.empty(0, int), np.empty(0, int)))
                    continue
                mem, tim, prev, idx = (np.concatenate(x) for x in zip(*parts, strict=True))
            keep = (mem + to_go_m[p] <= budget) & (tim + to_go_t[p][k] <= upper + slack)
            mem, tim, prev, idx = mem[keep], tim[keep], prev[keep], idx[keep]
            order_ = np.lexsort((tim, mem))
            mem, tim, prev, idx = mem[order_], tim[order_], prev[order_], idx[order_]
            best_before = np.minimum.accumulate(np.concatenate([[np.inf], tim[:-1]])) if len(tim) else tim
            pareto = tim < best_before
            row.append((mem[pareto], tim[pareto], prev[pareto], idx[pareto]))
        fronts.append(row)
    finals = [(f[1].min(), k, int(f[1].argmin())) for k, f in enumerate(fronts[-1]) if len(f[1])]
    if not finals:
        return None
    _, k, i = min(finals)
    choice = [k]
    for p in range(n - 1, 0, -1):
        _, _, prev, idx = fronts[p][k]
        k, i = int(prev[i]), int(idx[i])
        choice.append(k)
    return choice[::-1]
