"""Sharding strategies of a ParallelBlock and what each costs, analytically (issue 5, parts 2-3).

A block's entry contraction is ``y[B, M, N] = x[B, M, K] @ W[B, K, N]`` (B: batch dimensions
of the contraction, shared by the activation and the weight -- the experts of an MoE layer;
M: the activation's other free dimensions -- batch and sequence; K: the contracted dimensions;
N: the weight's other dimensions). A strategy puts each mesh axis on B, M, K, N or nowhere
(replicated), where the axes on a dimension must divide its *outer factor* (the batch for M,
the heads for a K or N that a reshape splits into heads -- head alignment). What each placement
costs per training step (forward and backward, Megatron/GSPMD conventions), one collective
over the group of all the axes on that dimension:

- axes on M (data parallel): the weight gradient is a partial sum -> all-reduce of dW,
  overlapped with the block's backward compute (as Megatron-LM and DDP bucket it): only what
  outlasts the backward is exposed;
- axes on K (row parallel): y is a partial sum -> all-reduce of y (forward);
- axes on N (column parallel): the input gradient dx is a partial sum -> all-reduce of dx
  (backward);
- axes on B (expert parallel): nothing -- each device owns its experts' weights;
- replicated: no communication; the work is repeated.

Compute is the contraction's FLOPs (forward 2BMKN, backward twice that) divided over the axes
that split it, through the roofline of the mesh's GPU; communication goes through paraplan's
collective cost model on the mesh's links (the last mesh axis is innermost, so it stays inside a
node when it fits). Memory per device: the weight with its gradient and Adam state, split over
the axes on B, K and N, plus the block's saved input ``x`` split over the axes on B, M and K.
Between blocks, the next block's input moves from the layout the previous block leaves to the
one it wants (:func:`reshard`). Bytes are counted as XLA's collectives report them: the size of
each collective's result on one device (``comm_bytes``), so that a compiled plan can be diffed
against them (:mod:`paraplan.sharding.verify`).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from paraplan.costmodel.collectives import estimate_collective_s
from paraplan.inventory import Collective, CollectiveKind, GroupLayout, ParallelDim
from paraplan.sharding.graph import ParallelBlock
from paraplan.specs import ClusterSpec, Phase

DIMS = ("B", "M", "K", "N")
ADAM_BYTES = 8.0  # two fp32 moments per parameter

Strategy = tuple[str | None, ...]  # per mesh axis: "B", "M", "K", "N" or None


@dataclass(frozen=True)
class Mesh:
    """Named mesh axes (outermost first) on a cluster; device ``i`` (row-major over the axes)
    sits in scale-up domain ``i // domain_size`` (a node, or an NVLink domain of several)."""

    axes: tuple[tuple[str, int], ...]
    cluster: ClusterSpec

    @property
    def size(self) -> int:
        return math.prod(n for _, n in self.axes)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.axes)

    def layout(self, axis: str) -> GroupLayout:
        """Where a group along one axis lies."""
        return self.group_layout((self.names.index(axis),))

    def group_layout(self, axes: tuple[int, ...]) -> GroupLayout:
        """Where the group spanned by the mesh axes at positions ``axes`` lies (the group of
        device 0; every group of a row-major mesh on equal nodes looks the same)."""
        return _group_layout(tuple(n for _, n in self.axes), tuple(sorted(axes)), self.cluster.domain_size)


@functools.lru_cache(maxsize=1024)
def _group_layout(sizes: tuple[int, ...], axes: tuple[int, ...], gpus_per_node: int) -> GroupLayout:
    strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    members = [sum(c * strides[a] for c, a in zip(coords, axes, strict=True))
               for coords in itertools.product(*(range(sizes[a]) for a in axes))]
    nodes = np.bincount(np.asarray(members) // gpus_per_node)
    return GroupLayout(size=len(members), nodes=int((nodes > 0).sum()), per_node=int(nodes.max()))


@dataclass(frozen=True)
class Shape:
    """A block's contraction sizes, the outer factor a split must divide per dimension, and the
    element size in bytes."""

    m: int
    k: int
    n: int
    b: int = 1
    m_outer: int | None = None  # None: the whole dimension
    k_outer: int | None = None
    n_outer: int | None = None
    itemsize: int = 4
    weight_splittable: bool = True  # False when the weight is reshaped before use (it stays whole)
    needs_dx: bool = True  # False when the input does not depend on parameters (no input gradient)

    def outer(self, dim: str) -> int:
        whole = {"B": self.b, "M": self.m, "K": self.k, "N": self.n}[dim]
        part = {"B": None, "M": self.m_outer, "K": self.k_outer, "N": self.n_outer}[dim]
        return whole if part is None else part

    @property
    def flops(self) -> float:
        """Forward and backward FLOPs of the contraction: 2BMKN, and 2BMKN for each of dW and
        (when the input needs a gradient) dx."""
        return (6.0 if self.needs_dx else 4.0) * self.b * self.m * self.k * self.n

    @property
    def x_bytes(self) -> float:
        return float(self.b * self.m * self.k * self.itemsize)

    @property
    def y_bytes(self) -> float:
        return float(self.b * self.m * self.n * self.itemsize)


def splits(strategy: Strategy, mesh: Mesh) -> dict[str, int]:
    """How many ways each dimension is split."""
    return {d: math.prod(n for (_, n), c in zip(mesh.axes, strategy, strict=True) if c == d) for d in DIMS}


def strategies(shape: Shape, mesh: Mesh) -> list[Strategy]:
    """Every placement of the mesh axes on B, M, K, N or nowhere whose split divides the
    dimensions' outer factors (B only for contractions with batch dimensions; only M or nowhere
    for a weight that is reshaped before use, which the plan cannot shard)."""
    dims = DIMS if shape.b > 1 else DIMS[1:]
    if not shape.weight_splittable:
        dims = ("M",)
    out = []
    for combo in itertools.product((*dims, None), repeat=len(mesh.axes)):
        split = splits(combo, mesh)
        if all(shape.outer(d) % split[d] == 0 for d in DIMS):
            out.append(combo)
    return out


@dataclass(frozen=True)
class BlockCost:
    compute_s: float
    comm_s: float
    comm_bytes: dict[str, float]  # XLA collective name -> bytes of results per device per step
    memory_bytes: float
    flops: float  # on one device, forward and backward

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s


def _coll(kind: CollectiveKind, nbytes: float, layout: GroupLayout, cluster: ClusterSpec) -> float:
    return estimate_collective_s(Collective("sharding", kind, ParallelDim.TP, nbytes, Phase.FWD), layout, cluster)


def _axes_on(strategy: Strategy, dim: str | None) -> tuple[int, ...]:
    return tuple(i for i, c in enumerate(strategy) if c == dim)


def block_cost(shape: Shape, strategy: Strategy, mesh: Mesh, peak_flops: float) -> BlockCost:
    split = splits(strategy, mesh)
    b, m, k, n = (shape.b / split["B"], shape.m / split["M"], shape.k / split["K"], shape.n / split["N"])
    gpu = mesh.cluster.gpu
    flops = (6.0 if shape.needs_dx else 4.0) * b * m * k * n  # forward, dW (and dx) on this device's shard
    compute = flops / (peak_flops * gpu.efficiency.gemm.max_fraction)
    comm, volume = 0.0, {}
    for dim, partial in (("M", k * n), ("K", m * n), ("N", m * k)):  # dW, y, dx: partial sums
        axes = _axes_on(strategy, dim)
        if axes and (dim != "N" or shape.needs_dx):
            buffer = b * partial * shape.itemsize
            seconds = _coll(CollectiveKind.ALL_REDUCE, buffer, mesh.group_layout(axes), mesh.cluster)
            if dim == "M":  # the gradient all-reduce overlaps the block's backward compute
                seconds = max(0.0, seconds - compute * 4.0 / 6.0)
            comm += seconds
            volume["all-reduce"] = volume.get("all-reduce", 0.0) + buffer
    weights = shape.b * shape.k * shape.n / (split["B"] * split["K"] * split["N"]) * (2 * shape.itemsize + ADAM_BYTES)
    activations = b * m * k * shape.itemsize
    return BlockCost(compute, comm, volume, weights + activations, flops)


def _output_layout(strategy: Strategy) -> tuple[str | None, ...]:
    """Which dimension of the next block's x[B, M, K] each axis splits as this block leaves its
    y[B, M, N] (N becomes the next K; partial sums over K are reduced inside the block)."""
    return tuple({"B": "B", "M": "M", "N": "K"}.get(c) if c else None for c in strategy)


def _input_layout(strategy: Strategy) -> tuple[str | None, ...]:
    """Which dimension of x[B, M, K] each axis must split for the block."""
    return tuple(c if c in ("B", "M", "K") else None for c in strategy)


def move(have: tuple[str | None, ...], want: tuple[str | None, ...], nbytes: float,
         mesh: Mesh) -> tuple[float, dict[str, float]]:
    """Seconds (forward and backward) and result bytes to bring a tensor of ``nbytes`` (whole)
    from layout ``have`` to ``want`` (per mesh axis, the dimension it splits). Axes dropped are
    all-gathered (forward; the backward is a free slice), axes added are sliced (free; the
    backward all-gathers the gradient), axes moved to another dimension are an all-to-all both
    ways (timed as an all-gather of the local piece: the same bytes cross the links)."""
    local = nbytes / math.prod(n for (_, n), h in zip(mesh.axes, have, strict=True) if h)
    dropped = tuple(i for i, (h, w) in enumerate(zip(have, want, strict=True)) if h and not w)
    added = tuple(i for i, (h, w) in enumerate(zip(have, want, strict=True)) if w and not h)
    moved = tuple(i for i, (h, w) in enumerate(zip(have, want, strict=True)) if h and w and h != w)
    seconds, volume = 0.0, {}
    if moved:
        seconds += 2 * _coll(CollectiveKind.ALL_GATHER, local, mesh.group_layout(moved), mesh.cluster)
        volume["all-to-all"] = 2 * local
    if dropped:
        gathered = local * math.prod(mesh.axes[i][1] for i in dropped)
        seconds += _coll(CollectiveKind.ALL_GATHER, gathered, mesh.group_layout(dropped), mesh.cluster)
        volume["all-gather"] = gathered
        local = gathered
    if added:
        seconds += _coll(CollectiveKind.ALL_GATHER, local, mesh.group_layout(added), mesh.cluster)  # backward
        volume["all-gather"] = volume.get("all-gather", 0.0) + local
    return seconds, volume


def add_volume(volume: dict[str, float], extra: dict[str, float]) -> None:
    """Add ``extra``'s bytes per collective into ``volume``."""
    for k, v in extra.items():
        volume[k] = volume.get(k, 0.0) + v


def enter(stream: tuple[str | None, ...], strategy: Strategy, x: Shape, mesh: Mesh) -> tuple[float, dict[str, float]]:
    """Seconds and bytes for a block to read its input from the residual stream's layout."""
    return move(stream, _input_layout(strategy), x.x_bytes, mesh)


@dataclass(frozen=True)
class Relation:
    """How the next block of the chain relates to the previous one in the dataflow: its input
    comes from the previous block's output (``direct``) or from the same value as the previous
    block's input (``sibling``: Q and K/V, gate and up); ``join``: their outputs meet in one
    operator (q and k in attention, SwiGLU's product), so they must share a layout;
    ``glue_bytes``: the path from one to the other runs through a contraction without
    parameters (attention), and a layout change on it is costed on the largest tensor there
    (the scores), which is where GSPMD tends to put it."""

    kind: str = "direct"
    join: bool = False
    glue_bytes: float | None = None  # direct through attention-like glue: its largest tensor
    reads_stream: bool = False  # the next block reads the residual stream
    writes_stream: bool = False  # the previous block's output is added into the residual stream


def reshard(prev: Strategy, nxt: Strategy, x_next: Shape, mesh: Mesh, relation: Relation = Relation(),
            stream: tuple[str | None, ...] | None = None, y_prev: Shape | None = None) -> tuple[float, dict[str, float]]:
    """Seconds and result bytes of moving data between two neighbouring blocks of the chain:
    the next block's input x into the layout it wants (from the previous block's output, or
    from the layout the previous block read the same value in), and, for a join, the next
    block's output into the previous one's."""
    if stream is not None and relation.reads_stream:  # through the residual stream's layout
        seconds, volume = enter(stream, nxt, x_next, mesh)
        if relation.writes_stream and y_prev is not None:
            extra_s, extra = move(_output_layout(prev), stream, y_prev.y_bytes, mesh)
            seconds += extra_s
            add_volume(volume, extra)
    else:
        have = _input_layout(prev) if relation.kind == "sibling" else _output_layout(prev)
        nbytes = max(x_next.x_bytes, relation.glue_bytes or 0.0)
        seconds, volume = move(have, _input_layout(nxt), nbytes, mesh)
    if relation.join:
        extra_s, extra = move(_output_layout(nxt), _output_layout(prev), x_next.y_bytes, mesh)
        seconds += extra_s
        add_volume(volume, extra)
    return seconds, volume


def shape_of(block: ParallelBlock) -> Shape:
    """The contraction sizes of a block's entry, with the outer factors the graph found."""
    eqn = block.entry
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    w = block.weight_operand
    x_shape, w_shape = eqn.in_shapes[1 - w], eqn.in_shapes[w]
    x_contract, w_contract = (lc, rc)[1 - w], (lc, rc)[w]
    x_batch, w_batch = (lb, rb)[1 - w], (lb, rb)[w]
    x_free = [d for d in range(len(x_shape)) if d not in x_contract and d not in x_batch]
    w_free = [d for d in range(len(w_shape)) if d not in w_contract and d not in w_batch]
    return Shape(
        m=math.prod(x_shape[d] for d in x_free),
        k=math.prod(w_shape[d] for d in w_contract),
        n=math.prod(w_shape[d] for d in w_free),
        b=math.prod(w_shape[d] for d in w_batch),
        m_outer=x_shape[x_free[0]] if x_free else None,
        k_outer=math.gcd(block.k_outer or 0, w_shape[w_contract[0]]),
        n_outer=math.gcd(block.n_outer or 0, w_shape[w_free[0]]) if w_free else None,
        itemsize=eqn.in_itemsize[w] if eqn.in_itemsize else 4,
        weight_splittable=block.weight_dims is not None,
        needs_dx=block.needs_dx,
    )
