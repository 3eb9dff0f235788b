"""Sharding strategies of a ParallelBlock and what each costs, analytically (issue 5, part 2-3).

A block's entry contraction is ``y[M, N] = x[M, K] @ W[K, N]`` (M: every dimension of the
activation that is not contracted -- batch and sequence; K: the contracted dimensions; N: the
weight's other dimensions). A strategy puts each mesh axis on M, K, N or nowhere (replicated),
where the axes on a dimension must divide it. What each placement costs per step (forward and
backward, Megatron/GSPMD conventions):

- axis on M (data parallel): the weight gradient is a partial sum -> all-reduce of dW over it;
- axis on K (row parallel): y is a partial sum -> all-reduce of y (forward);
- axis on N (column parallel): the input gradient dx is a partial sum -> all-reduce of dx
  (backward);
- replicated: no communication; the work is repeated.

Compute is the contraction's FLOPs (forward 2MKN, backward twice that) divided over the axes
that split it, through the roofline of the mesh's GPU; communication goes through paraplan's
collective cost model on the mesh's links (the last mesh axis is innermost, so it stays inside a
node when it fits). Memory per device: the weight with its gradient and Adam state, split over
the axes on K and N, plus the block's saved activations (``x``) split over the axes on M and K.
Between blocks, the activation moves from the layout one block leaves to the one the next wants
(:func:`reshard_s`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from paraplan.costmodel.collectives import estimate_collective_s
from paraplan.inventory import Collective, CollectiveKind, GroupLayout, ParallelDim
from paraplan.sharding.graph import ParallelBlock
from paraplan.specs import ClusterSpec, Phase

DIMS = ("M", "K", "N")
BYTES = 4.0  # float32 activations and weights in the examples; Adam adds 8 bytes per parameter


@dataclass(frozen=True)
class Mesh:
    """Named mesh axes (outermost first) on a cluster."""

    axes: tuple[tuple[str, int], ...]
    cluster: ClusterSpec

    @property
    def size(self) -> int:
        return math.prod(n for _, n in self.axes)

    def layout(self, axis: str) -> GroupLayout:
        """Where a group along ``axis`` lies: axes after it are laid out inside it."""
        names = [a for a, _ in self.axes]
        i = names.index(axis)
        n = self.axes[i][1]
        stride = math.prod(m for _, m in self.axes[i + 1:])
        gpn = self.cluster.gpus_per_node
        per_node = min(n, max(1, gpn // stride)) if stride < gpn else 1
        return GroupLayout(size=n, nodes=-(-n // per_node), per_node=per_node)


@dataclass(frozen=True)
class Shape:
    m: int
    k: int
    n: int

    @classmethod
    def of(cls, block: ParallelBlock) -> Shape:
        eqn = block.entry
        (lc, rc), _batch = eqn.params["dimension_numbers"]
        w = block.weight_operand
        x_shape, w_shape = eqn.in_shapes[1 - w], eqn.in_shapes[w]
        x_contract = (lc, rc)[1 - w]
        w_contract = (lc, rc)[w]
        k = math.prod(w_shape[d] for d in w_contract)
        n = math.prod(s for d, s in enumerate(w_shape) if d not in w_contract)
        m = math.prod(s for d, s in enumerate(x_shape) if d not in x_contract)
        return cls(m, k, n)


Strategy = tuple[str | None, ...]  # per mesh axis: "M", "K", "N" or None


def strategies(shape: Shape, mesh: Mesh) -> list[Strategy]:
    """Every placement of the mesh axes on M, K, N or nowhere whose split divides the dims."""
    out = []
    for combo in itertools.product((*DIMS, None), repeat=len(mesh.axes)):
        split = {d: math.prod(n for (_, n), c in zip(mesh.axes, combo, strict=True) if c == d) for d in DIMS}
        if shape.m % split["M"] or shape.k % split["K"] or shape.n % split["N"]:
            continue
        out.append(combo)
    return out


@dataclass(frozen=True)
class BlockCost:
    compute_s: float
    comm_s: float
    comm_bytes: dict[str, float]  # collective kind -> bytes per device per step
    memory_bytes: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s


def _coll(kind: CollectiveKind, nbytes: float, layout: GroupLayout, cluster: ClusterSpec) -> float:
    return estimate_collective_s(Collective("sharding", kind, ParallelDim.TP, nbytes, Phase.FWD), layout, cluster)


def block_cost(shape: Shape, strategy: Strategy, mesh: Mesh, peak_flops: float) -> BlockCost:
    split = {d: math.prod(n for (_, n), c in zip(mesh.axes, strategy, strict=True) if c == d) for d in DIMS}
    m, k, n = shape.m / split["M"], shape.k / split["K"], shape.n / split["N"]
    gpu = mesh.cluster.gpu
    flops = 6.0 * m * k * n  # forward 2mkn + backward 4mkn, on this device's shard
    compute = flops / (peak_flops * gpu.efficiency.gemm.max_fraction)
    comm, volume = 0.0, {"all_reduce": 0.0}
    for (axis, _), c in zip(mesh.axes, strategy, strict=True):
        if c is None:
            continue
        buffer = {"M": k * n, "K": m * n, "N": m * k}[c] * BYTES  # dW, y or dx: the partial sum
        comm += _coll(CollectiveKind.ALL_REDUCE, buffer, mesh.layout(axis), mesh.cluster)
        volume["all_reduce"] += buffer
    weights = shape.k * shape.n / (split["K"] * split["N"]) * (BYTES * 2 + 8.0)
    activations = m * k * BYTES
    return BlockCost(compute, comm, volume, weights + activations)


def _output_layout(strategy: Strategy) -> tuple[str | None, ...]:
    """Which dimension of y[M, N] each axis splits after the block (K partial sums are reduced)."""
    return tuple(c if c in ("M", "N") else None for c in strategy)


def _input_layout(strategy: Strategy) -> tuple[str | None, ...]:
    """Which dimension of x[M, K] each axis must split for the block; K of x is N of the previous."""
    return tuple({"M": "M", "K": "N"}.get(c) if c else None for c in strategy)


def reshard_s(prev: Strategy, nxt: Strategy, shape_out: Shape, mesh: Mesh) -> tuple[float, dict[str, float]]:
    """Seconds (forward and backward) and bytes to move y of the previous block, [M, N], into
    the layout the next block's x wants: per axis, kept (free), dropped (all-gather; backward
    reduce-scatter), added (a slice, free; backward all-gather), or moved to the other
    dimension (all-to-all both ways, costed as an all-gather of 1/n of the tensor)."""
    have, want = _output_layout(prev), _input_layout(nxt)
    local = shape_out.m * shape_out.n * BYTES
    for (_, n), h in zip(mesh.axes, have, strict=True):
        if h:
            local /= n
    seconds, volume = 0.0, {"all_gather": 0.0, "all_to_all": 0.0}
    for (axis, n), h, w in zip(mesh.axes, have, want, strict=True):
        if h == w:
            continue
        layout = mesh.layout(axis)
        if h is not None and w is None:
            seconds += 2 * _coll(CollectiveKind.ALL_GATHER, local * n, layout, mesh.cluster)
            volume["all_gather"] += local * n
        elif h is None and w is not None:
            seconds += _coll(CollectiveKind.ALL_GATHER, local, layout, mesh.cluster)  # backward
            volume["all_gather"] += local
        else:
            seconds += 2 * _coll(CollectiveKind.ALL_GATHER, local, layout, mesh.cluster)
            volume["all_to_all"] += local
    return seconds, volume
