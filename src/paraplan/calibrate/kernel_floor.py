"""The GPU-side duration floor of a kernel, from a profiler trace's kernels: ``kernel_overhead_s``.

A kernel whose work is negligible (a fill, a copy or an element-wise op of a few hundred KiB
or less) still runs for about a microsecond on the GPU: its blocks are scheduled, started and
retired. The cost model prices a kernel as ``max(compute, memory) + kernel_overhead_s``, the
memory side ``(bytes + half_work) / (HBM rate x max_fraction)`` (``costmodel.roofline``); the
curves are fitted to operators far above that floor, so the floor is what the overhead adds.

From the trace's streaming operators that recorded their shapes (``FLOOR_OPS``), each kernel
launched alone by its operator call and moving at most ``NEGLIGIBLE_BYTES`` is a point; the
fitted overhead is the median over those kernels of (measured - the catalog's memory curve at
the kernel's bytes, without overhead). A median, not a mean: a kernel slowed by a concurrent
stream is an outlier. The kernels' own durations (``cat: kernel`` events) are read, never the
host's launch time (a separate, host-side effect). Only operator-level data: no iteration
time is looked at.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

import numpy as np

from paraplan.costmodel import estimate_op_s
from paraplan.inventory import Op, OpKind
from paraplan.specs import ConfigError, GpuSpec, Phase, Precision
from paraplan.traces.ops import ELEMENT_BYTES, MEMORY_OPS, KernelCall, operator_kernels
from paraplan.traces.reader import iter_events
from paraplan.traces.rules import RUNTIME_CATEGORIES

#: Streaming operators whose kernels' bytes the shapes give: the element-wise ones the memory
#: curve prices, and fills (which write their output and read nothing).
FILL_OPS = frozenset({"aten::fill_", "aten::zero_"})
FLOOR_OPS = MEMORY_OPS | FILL_OPS
#: A kernel moving at most this many bytes does negligible work: at 3.35 TB/s a MiB streams in
#: 0.3 us, a fraction of the microsecond-scale floor measured on Hopper and Ampere.
NEGLIGIBLE_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class KernelFloor:
    """The floor measured on one GPU's trace(s) and the overhead it gives."""

    gpu: str
    files: tuple[Path, ...]
    kernels: int  # negligible-work kernels read
    shapes: int  # distinct (operator, shapes, element type) among them
    seconds: tuple[float, ...]  # their measured durations
    curve_s: float  # the median of the memory curve's time at their bytes, no overhead
    overhead_s: float  # fitted kernel_overhead_s: median of (measured - curve)
    before_s: float  # the catalog's kernel_overhead_s
    resolution_s: float  # the traces' time resolution (1e-6 when every duration is whole us)

    @property
    def min_s(self) -> float:
        return min(self.seconds)

    @property
    def median_s(self) -> float:
        return float(np.median(self.seconds))

    def quartiles_s(self) -> tuple[float, float]:
        lo, hi = np.percentile(self.seconds, [25, 75])
        return float(lo), float(hi)


def kernel_bytes(call: KernelCall) -> float | None:
    """Bytes one streaming kernel moves, from its operator's input shapes: every input read and
    one output written (``calibrate.trace``'s memory operators), a fill only its output; None
    for an element type of unknown size."""
    e = ELEMENT_BYTES.get(call.dtype)
    if e is None or not call.dims:
        return None
    elems = [math.prod(d) for d in call.dims]
    if call.op in FILL_OPS:
        return float(e * max(elems))
    return float(e * (sum(elems) + max(elems)))


def negligible_kernels(calls: Sequence[KernelCall], limit: float = NEGLIGIBLE_BYTES
                       ) -> list[tuple[KernelCall, float]]:
    """(kernel, bytes) of the calls that ran alone for their operator and moved at most ``limit``."""
    out = []
    for call in calls:
        traffic = kernel_bytes(call)
        if call.siblings == 1 and traffic is not None and traffic <= limit and call.seconds > 0.0:
            out.append((call, traffic))
    return out


def memory_curve_s(traffic: float, gpu: GpuSpec) -> float:
    """The cost model's time for a streaming kernel of ``traffic`` bytes on ``gpu``, without the
    per-kernel overhead."""
    eff = gpu.efficiency.model_copy(update={"kernel_overhead_s": 0.0})
    bare = gpu.model_copy(update={"efficiency": eff})
    op = Op(name="floor", kind=OpKind.ELEMENTWISE, role="floor", flops=0.0, bytes=traffic, bwd_flops=0.0,
            bwd_bytes=0.0)
    return estimate_op_s(op, Phase.FWD, bare, gpu.flops_for(Precision.BF16), Precision.BF16)


def fit_kernel_floor(files: Sequence[Path], gpu: GpuSpec, limit: float = NEGLIGIBLE_BYTES) -> KernelFloor:
    """``gpu``'s kernel overhead from the negligible-work kernels of the rank traces ``files``."""
    files = tuple(Path(f) for f in files)
    points: list[tuple[KernelCall, float]] = []
    for path in files:
        points.extend(negligible_kernels(operator_kernels(path, FLOOR_OPS), limit))
    if not points:
        raise ConfigError(f"{files[0]}: no kernel of a streaming operator with recorded shapes moved at most "
                          f"{limit:,.0f} bytes (record the trace with record_shapes=True)")
    seconds = np.array([call.seconds for call, _ in points])
    curve = np.array([memory_curve_s(traffic, gpu) for _, traffic in points])
    overhead = max(0.0, float(np.median(seconds - curve)))
    whole_us = bool(np.allclose(seconds * 1e6, np.round(seconds * 1e6), atol=1e-6))
    shapes = len({(call.op, call.dims, call.dtype) for call, _ in points})
    return KernelFloor(gpu.name, files, len(points), shapes, tuple(seconds.tolist()), float(np.median(curve)),
                       overhead, gpu.efficiency.kernel_overhead_s, 1e-6 if whole_us else 1e-9)


#: A kernel counts as queued when its launch call returned this long before the previous
#: kernel on its stream ended: the GPU had it in hand, so the gap between them is the GPU's.
QUEUED_MARGIN_S = 5e-6


@dataclasses.dataclass(frozen=True)
class KernelBoundary:
    """Two kernels one after the other on one stream: the idle time between them and whether
    the GPU already had the second when the first ended."""

    gap_s: float  # the second's start - the first's end (timestamps subtracted exactly)
    before: str  # the first kernel's name
    next_s: float  # the second kernel's duration
    # how long before the first kernel ended the second's launch call returned (negative: after
    # it, the GPU waited on the host); None where the trace has no launch call for the second
    ahead_s: float | None

    @property
    def queued(self) -> bool:
        """The second kernel was launched at least ``QUEUED_MARGIN_S`` before the first ended."""
        return self.ahead_s is not None and self.ahead_s > QUEUED_MARGIN_S


def kernel_boundaries(path: Path) -> list[KernelBoundary]:
    """Every pair of consecutive kernels on each stream of the trace ``path``, by stream then
    start. Timestamps are read exactly (``iter_events(exact=True)``): an epoch-based trace's
    microseconds lose a quarter of a microsecond in a float, as much as the gaps it holds."""
    returned: dict[object, Decimal] = {}
    streams: dict[object, list[tuple[Decimal, Decimal, object, str]]] = {}
    for ev in iter_events(path, exact=True):
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        args = ev.get("args") or {}
        corr = args.get("correlation")
        if ev.get("cat") in RUNTIME_CATEGORIES and corr is not None:
            returned[corr] = Decimal(ev["ts"]) + Decimal(ev["dur"])
        elif ev.get("cat") == "kernel":
            streams.setdefault(args.get("stream"), []).append(
                (Decimal(ev["ts"]), Decimal(ev["dur"]), corr, str(ev.get("name", ""))))
    out = []
    for kernels in streams.values():
        kernels.sort(key=lambda k: k[0])
        for (ts, dur, _, name), (nts, ndur, corr, _) in itertools.pairwise(kernels):
            back = returned.get(corr)
            out.append(KernelBoundary(float(nts - ts - dur) * 1e-6, name, float(ndur) * 1e-6,
                                      None if back is None else float(ts + dur - back) * 1e-6))
    return out


def queued_gaps(path: Path) -> list[float]:
    """Seconds between the end of a kernel and the start of the next on the same stream, for
    every next kernel already queued (its launch call returned ``QUEUED_MARGIN_S`` before the
    previous kernel ended): the GPU-side time between back-to-back kernels, which no kernel's
    duration holds (under a profiler: CUPTI's own per-kernel work may be part of it)."""
    return [b.gap_s for b in kernel_boundaries(path) if b.queued]
