"""Time one collective point on an initialised ``torch.distributed`` job (torch imported by
the caller's process; this module imports it inside functions).

Every rank of the job takes part in every point, in the same order, so no rank runs ahead:
the group's members warm up, then for each repeat pass a barrier on the group and time
``iters`` back-to-back calls (a CUDA synchronise closes the timing on GPUs); the ranks outside
the group contribute zeros. An all-reduce MAX over the job then gives, for each repeat, the
SLOWEST member's time: a collective is as slow as its last rank. The median of the repeats is
recorded.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from paraplan.inventory import CollectiveKind
from paraplan.profile.sweep import Layout, Point

__all__ = ["CommGroups", "Timing", "TimingSettings", "time_point", "torch_dtype"]

#: A call longer than this in the warm-up is timed once per repeat, not ``iters`` times.
LONG_CALL_S = 0.01


@dataclass(frozen=True)
class TimingSettings:
    warmup: int = 2
    repeats: int = 5
    iters: int = 5


@dataclass(frozen=True)
class Timing:
    """The slowest rank's seconds per call, one per repeat, and the median recorded."""

    repeats_s: tuple[float, ...]

    @property
    def time_s(self) -> float:
        return statistics.median(self.repeats_s)


def torch_dtype(name: str) -> Any:
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


class CommGroups:
    """The process group of each layout, created once, by every rank, in the same order."""

    def __init__(self, local_world_size: int) -> None:
        self.local_world_size = local_world_size
        self._groups: dict[Layout, Any] = {}

    def get(self, layout: Layout) -> Any:
        import torch.distributed as dist

        if layout not in self._groups:
            ranks = layout.ranks(self.local_world_size)
            self._groups[layout] = None if len(ranks) == dist.get_world_size() else dist.new_group(ranks)
        return self._groups[layout]


def _call(point: Point, group: Any, ranks: list[int], device: Any) -> Callable[[], None]:
    """The collective of ``point`` on its buffers, as a function of no arguments."""
    import torch
    import torch.distributed as dist

    dtype = torch_dtype(point.dtype.value)
    n = len(ranks)
    full = torch.ones(point.elements, dtype=dtype, device=device)
    kind = point.kind
    if kind is CollectiveKind.ALL_REDUCE:
        return lambda: dist.all_reduce(full, group=group)
    if kind is CollectiveKind.BROADCAST:
        return lambda: dist.broadcast(full, src=ranks[0], group=group)
    if kind is CollectiveKind.ALL_TO_ALL:
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full, group=group)
    part = torch.ones(point.elements // n, dtype=dtype, device=device)
    if kind is CollectiveKind.ALL_GATHER:  # bytes = the whole output
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(full, part, group=group)
    if kind is CollectiveKind.REDUCE_SCATTER:  # bytes = the whole input
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(part, full, group=group)
    # send/recv: the message from the group's first rank to its last
    src, dst = ranks[0], ranks[-1]
    if dist.get_rank() == src:
        return lambda: dist.send(full, dst=dst, group=group)
    return lambda: dist.recv(full, src=src, group=group)


def time_point(
    point: Point,
    groups: CommGroups,
    device: Any,
    settings: TimingSettings,
    hook: Callable[[Point, int], None] | None = None,
) -> Timing:
    """Time ``point`` (every rank of the job calls this for every point, in the same order).
    ``hook(point, rank)``, for tests, runs on every member inside each timed region."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    ranks = point.layout.ranks(groups.local_world_size)
    group = groups.get(point.layout)
    member = rank in ranks and (point.kind is not CollectiveKind.SEND_RECV or rank in (ranks[0], ranks[-1]))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    warm = torch.zeros(1, dtype=torch.float64, device=device)
    if member:
        call = _call(point, group, ranks, device)
        start = time.perf_counter()
        for _ in range(settings.warmup):
            call()
        sync()
        warm[0] = (time.perf_counter() - start) / max(settings.warmup, 1)
    dist.all_reduce(warm, op=dist.ReduceOp.MAX)  # every member agrees on the calls per timing
    iters = 1 if warm.item() > LONG_CALL_S else settings.iters
    times = torch.zeros(settings.repeats, dtype=torch.float64, device=device)
    if member:
        for r in range(settings.repeats):
            dist.barrier(group=group)
            sync()
            start = time.perf_counter()
            for _ in range(iters):
                call()
            sync()
            if hook is not None:
                hook(point, rank)
            times[r] = (time.perf_counter() - start) / iters
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the slowest rank of the group, per repeat
    return Timing(tuple(float(t) for t in times.tolist()))
