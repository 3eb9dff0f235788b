"""What a collective sweep measures: message sizes, group layouts and points (no torch).

A point is one (collective, group layout, dtype, size) the sampler times. Sizes follow
paraplan's ``Collective.bytes`` convention (nccl-tests'): the buffer of an all-reduce or a
broadcast, the TOTAL output of an all-gather, the input of a reduce-scatter, one rank's whole
send buffer of an all-to-all, the message of a send/recv. A size is rounded up to whole
elements, and for the collectives that split their buffer over the group to a whole number of
elements per rank, so the bytes recorded are the bytes moved.

Group layouts are ``nodes x gpus_per_node`` blocks of the job's ranks, as torchrun numbers
them (rank = node * LOCAL_WORLD_SIZE + local rank): within one node 2, 4, 8 ... ranks, across
nodes one rank per node and whole nodes, so the regressors see both links.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.inventory import CollectiveKind
from paraplan.specs import ConfigError, Precision
from paraplan.units import DTYPE_BYTES

__all__ = [
    "ALL_KINDS",
    "Layout",
    "Point",
    "auto_layouts",
    "parse_layouts",
    "sweep_points",
    "sweep_sizes",
]

#: Every collective the sampler times, in the order it times them.
ALL_KINDS = (
    CollectiveKind.ALL_REDUCE,
    CollectiveKind.ALL_GATHER,
    CollectiveKind.REDUCE_SCATTER,
    CollectiveKind.ALL_TO_ALL,
    CollectiveKind.BROADCAST,
    CollectiveKind.SEND_RECV,
)
_SPLIT = {CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_TO_ALL}


@dataclass(frozen=True, order=True)
class Layout:
    """A group of ``nodes`` x ``gpus_per_node`` ranks: the first ``gpus_per_node`` local
    ranks of each of the first ``nodes`` nodes."""

    nodes: int
    gpus_per_node: int

    @property
    def size(self) -> int:
        return self.nodes * self.gpus_per_node

    def ranks(self, local_world_size: int) -> list[int]:
        """Global ranks of the group when each node runs ``local_world_size`` ranks."""
        return [n * local_world_size + g for n in range(self.nodes) for g in range(self.gpus_per_node)]

    def __str__(self) -> str:
        return f"{self.nodes}x{self.gpus_per_node}"


@dataclass(frozen=True)
class Point:
    """One timing: ``kind`` on ``layout`` with ``bytes`` of ``dtype`` elements."""

    kind: CollectiveKind
    layout: Layout
    dtype: Precision
    bytes: int

    @property
    def key(self) -> tuple[str, int, int, str, int]:
        """What identifies the point in a journal (a restarted sweep skips these)."""
        return (self.kind.value, self.layout.nodes, self.layout.gpus_per_node, self.dtype.value, self.bytes)

    @property
    def elements(self) -> int:
        return self.bytes // int(DTYPE_BYTES[self.dtype.value])


def sweep_sizes(min_bytes: int, max_bytes: int, factor: float) -> list[int]:
    """``min_bytes``, ``min_bytes * factor``, ... up to ``max_bytes`` (included when the
    steps reach it), as whole bytes."""
    if min_bytes < 1:
        raise ConfigError(f"min bytes {min_bytes}: must be at least 1")
    if max_bytes < min_bytes:
        raise ConfigError(f"max bytes {max_bytes}: below min bytes {min_bytes}")
    if factor <= 1.0:
        raise ConfigError(f"factor {factor:g}: must be above 1")
    sizes, size = [], float(min_bytes)
    while size <= max_bytes * (1 + 1e-9):
        if not sizes or round(size) != sizes[-1]:
            sizes.append(round(size))
        size *= factor
    return sizes


def _rounded(kind: CollectiveKind, size: int, group: int, itemsize: int) -> int:
    unit = itemsize * (group if kind in _SPLIT else 1)
    return max(unit, -(-size // unit) * unit)


def _powers(limit: int) -> list[int]:
    out, k = [], 2
    while k < limit:
        out.append(k)
        k *= 2
    return [*out, limit] if limit >= 2 else out


def auto_layouts(nodes: int, local_world_size: int) -> list[Layout]:
    """The default groups: 2, 4, ... ranks within a node up to the whole node; across nodes
    2, 4, ... nodes up to all of them with one rank per node and with whole nodes."""
    layouts = {Layout(1, k) for k in _powers(local_world_size)}
    for m in _powers(nodes):
        layouts |= {Layout(m, 1), Layout(m, local_world_size)}
    return sorted(layouts)


def parse_layouts(text: str, nodes: int, local_world_size: int) -> list[Layout]:
    """``"auto"`` or a comma-separated list of ``NODESxGPUS`` (``1x8,2x8,2x1``), each within
    the job's ``nodes`` x ``local_world_size``."""
    if text.strip() == "auto":
        return auto_layouts(nodes, local_world_size)
    layouts = []
    for part in text.split(","):
        try:
            m, k = (int(v) for v in part.strip().lower().split("x"))
        except ValueError:
            raise ConfigError(f"layout {part.strip()!r}: expected NODESxGPUS, e.g. 1x8 or 2x8") from None
        if not (1 <= m <= nodes and 1 <= k <= local_world_size) or m * k < 2:
            raise ConfigError(
                f"layout {part.strip()!r}: needs at least 2 ranks within the job's "
                f"{nodes} node(s) x {local_world_size} rank(s) per node"
            )
        layouts.append(Layout(m, k))
    return sorted(set(layouts))


def sweep_points(
    kinds: list[CollectiveKind] | tuple[CollectiveKind, ...],
    layouts: list[Layout],
    dtype: Precision,
    sizes: list[int],
) -> list[Point]:
    """Every point of the sweep, group by group. A send/recv runs between two ranks, so it
    is timed on the two-rank layouts only (1x2 within a node, 2x1 across nodes)."""
    itemsize = int(DTYPE_BYTES[dtype.value])
    points, seen = [], set()
    for layout in layouts:
        for kind in kinds:
            if kind is CollectiveKind.SEND_RECV and layout.size != 2:
                continue
            for size in sizes:
                point = Point(kind, layout, dtype, _rounded(kind, size, layout.size, itemsize))
                if point.key not in seen:
                    seen.add(point.key)
                    points.append(point)
    return points
