"""Decode one rank's trace into iterations, and each iteration into components.

One pass over the events keeps, per thread, only (start, end, label) of each duration event (the
label from the rules in `rules.py`, decided once per name and category; names, arguments and
flow events are dropped as they stream by), in arrays: a 1 GB trace holds millions of events.
Then, per thread, a sweep gives every instant to the innermost event's class (or to the
outermost claiming one), and each iteration window is cut out of those segments:

    iteration_s = compute_s + exposed communication + memory_s + idle_s

where compute is the union of compute segments, communication the union of communication
segments (on any thread: gloo works on its own threads, NCCL on its own streams), exposed
communication the part of it that no compute overlaps, memory the memory copies and sets
(class "memory") that neither compute nor communication overlaps, and idle the rest. Compute
by class is each class's union across every stream (thread), an instant that kernels of k
classes share on different streams counting 1/k to each (``intervals.shares``): the classes add
up to compute, never more, so an iteration's parts never exceed it. This is
HolisticTraceAnalysis's temporal breakdown (hta/analyzers/breakdown_analysis.py,
`get_temporal_breakdown`: computation = union of computation kernels, non-compute = union of all
kernels less computation, i.e. communication and memory; idle = span less the union of all).
On a GPU trace (kernels present) the segments are the device's kernels; on a CPU trace, the
host's operators.

On a GPU trace an iteration is the GPU's, not the host's: each kernel, memcpy and memset belongs
to the step (ProfilerStep window) that holds the runtime call that launched it (the
`cuda_runtime`/`cuda_driver` event of the same `args.correlation`; a kernel without one belongs
where it ran), and the iteration is the span of that work, first start to last end: when the host
runs ahead of the GPU, its windows cut the GPU's iterations anywhere. A last step that launched
nothing, or whose kernels are missing (the trace ended before they ran), is dropped, with a note.
HolisticTraceAnalysis attributes kernels to steps the same way (../shared/data/traces/README.md).
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from paraplan.traces import intervals as iv
from paraplan.traces.comm_link import HostComm, from_host, host_collectives
from paraplan.traces.gpu_steps import NO_CORRELATION, gpu_windows
from paraplan.traces.reader import TraceFileError, iter_events, read_header
from paraplan.traces.rules import (
    COMPUTE_CLASSES,
    DTYPE_BYTES,
    EP_KINDS,
    KERNEL_CATEGORIES,
    P2P_KINDS,
    RUNTIME_CATEGORIES,
    STEP_MARKER,
    TRAIN_STEP_REGIONS,
    classify,
    collective_kind,
    group_dimension,
)

_DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_SKIP_CATEGORIES = frozenset({"Trace", "fwdbwd", "ac2g", "gpu_user_annotation"})
#: A runtime call that launches a kernel (cudaLaunchKernel, cuLaunchKernel, hipExtModuleLaunchKernel,
#: cudaGraphLaunch, ...): one whose kernel is missing from the trace was cut off by its end.
_LAUNCH = re.compile(r"launch", re.I)
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.I)


@dataclass(frozen=True)
class Collective:
    """One communication operation as the trace shows it (the transfer, waiting included)."""

    step: int
    kind: str  # all_reduce, all_gather, reduce_scatter, send, recv, ...
    dimension: str  # tp, pp, dp, cp, ep or unknown
    group: str
    bytes: int | None  # the input's bytes (None when the trace did not record shapes)
    group_size: int | None
    start_us: float
    duration_s: float


@dataclass(frozen=True)
class Iteration:
    """One iteration on one rank; compute + exposed communication + memory + idle = iteration_s."""

    step: int
    start_us: float
    iteration_s: float
    compute_s: float
    compute_by_class: dict[str, float]
    comm_by_dimension: dict[str, float]  # busy time (union) of each dimension's communication
    exposed_by_dimension: dict[str, float]  # ... of it with no compute beneath
    comm_by_kind: dict[str, float]  # "dp all_reduce" -> busy seconds
    overlap_s: float  # communication hidden under compute
    idle_s: float
    memory_s: float = 0.0  # memory copies/sets beneath neither compute nor communication

    @property
    def comm_s(self) -> float:
        return sum(self.comm_by_dimension.values()) if self.comm_by_dimension else 0.0

    @property
    def exposed_comm_s(self) -> float:
        return sum(self.exposed_by_dimension.values())


@dataclass(frozen=True)
class RankTrace:
    path: Path
    rank: int | None
    world_size: int | None
    backend: str | None
    device: str  # "gpu" (kernels present) or "cpu"
    iteration_source: str  # "ProfilerStep" or the train-step region's name
    iterations: tuple[Iteration, ...]
    collectives: tuple[Collective, ...] = field(repr=False)
    events: int = 0
    notes: tuple[str, ...] = ()  # what the decoder decided that the reader should know
    # the whole trace's compute kernels (not communication, copies or sets): their seconds, and
    # per signature those of the kernels no rule of the kernel table names (class "other")
    kernel_s: float = 0.0
    unclassified_s: dict[str, float] = field(default_factory=dict, repr=False)


def decode_trace(path: Path) -> RankTrace:
    """Read one rank's trace file and decode it. Raises TraceFileError when it cannot."""
    path = Path(path)
    header = read_header(path)
    info = header.get("distributedInfo") or {}
    events = _Events(_Groups(info))
    count = events.read(path)
    if not events.markers and not events.regions:
        raise TraceFileError(f"{path}: no iterations (no ProfilerStep#N markers nor a train-step region)")
    device = "gpu" if events.device else "cpu"
    timeline = events.device if events.device else events.host
    windows, source = _windows(events.markers, events.regions)
    host_windows, notes = windows, ()
    if events.device:
        events.link_collectives()
        windows, notes = gpu_windows(list(events.device.values()), events.runtime_ids, events.runtime_ts,
                                     events.runtime_launches, host_windows, source)
    edges = frozenset(t for _, start, end in windows for t in (start, end))
    segments = [_sweep(timeline.pop(key), events.classes, edges) for key in list(timeline)]
    iterations = tuple(_iteration(step, start, end, segments) for step, start, end in windows)
    rank = info.get("rank")
    if rank is None:
        found = _RANK_IN_NAME.search(path.name)
        rank = int(found.group(1)) if found else None
    return RankTrace(
        path=path,
        rank=rank,
        world_size=info.get("world_size"),
        backend=info.get("backend"),
        device=device,
        iteration_source=source,
        iterations=iterations,
        collectives=tuple(_collectives(events.pending, host_windows, {w[0] for w in windows},
                                       events.launch_times())),
        events=count,
        notes=notes,
        kernel_s=events.kernel_us * 1e-6,
        unclassified_s={name: us * 1e-6 for name, us in events.unclassified.items()},
    )


class _Thread:
    """One thread's duration events, compactly (a 1 GB trace holds millions): start and end
    (microseconds), the index of each one's (label, claims) in `_Events.classes`, and (on the
    device) each one's correlation id."""

    __slots__ = ("classes", "correlations", "ends", "starts")

    def __init__(self) -> None:
        self.starts, self.ends, self.classes = array("d"), array("d"), array("i")
        self.correlations = array("q")


# What an event (by its name and category) is to the decoder.
_SKIP, _MARKER, _REGION, _COMM, _SPAN = range(5)


class _Events:
    """One pass over a trace's events: iteration markers, train-step regions, communication
    transfers, and every other duration event in its thread's `_Thread`."""

    def __init__(self, groups: _Groups) -> None:
        self.groups = groups
        self.host: dict[Any, _Thread] = {}  # (pid, tid) -> its events
        self.device: dict[Any, _Thread] = {}  # kernels, memcpy and memset
        self.markers: list[tuple[int, float, float, Any]] = []
        self.regions: list[tuple[str, float, float]] = []
        self.pending: list[tuple[float, float, str, str, str, int | None, int | None, int]] = []
        # a GPU communication kernel's own kind and arguments, where it sits (thread, position),
        # and its index in `pending` (-1: none); the host's communication events and annotations
        self.device_comms: list[tuple[str, dict, Any, int, int]] = []
        self.host_comms: list[tuple[Any, float, float, HostComm]] = []
        self.annotations: list[int] = []  # `pending` indices of host annotations of GPU transfers
        # each runtime call's thread, an index into `_thread_keys` (a GB trace has millions)
        self.runtime_threads = array("i")
        self._thread_keys: dict[Any, int] = {}
        # runtime calls (cudaLaunchKernel, ...): correlation id, start, whether it launches a kernel
        self.runtime_ids, self.runtime_ts, self.runtime_launches = array("q"), array("d"), array("b")
        self._launch_names: dict[str, bool] = {}
        self.classes: list[tuple[str | None, bool]] = []  # (label, claims), by index
        self._class_index: dict[tuple[str | None, bool], int] = {}
        self._roles: dict[tuple[str, str], tuple[int, Any, bool]] = {}  # names repeat: decided once
        self.kernel_us = 0.0  # compute kernels' time
        self.unclassified: dict[str, float] = {}  # a kernel no rule names -> its time (us)
        self._unclassified_keys: set[tuple[str, str]] = set()

    def read(self, path: Path) -> int:
        """Take in every event of the file; return how many there were."""
        count = 0
        roles = self._roles
        for ev in iter_events(path):
            count += 1
            if ev.get("ph") != "X" or "dur" not in ev:
                continue
            cat = ev.get("cat") or ""
            if cat in _SKIP_CATEGORIES:
                continue
            if cat in RUNTIME_CATEGORIES:
                self._runtime(ev)
                continue
            name = ev.get("name") or ""
            role = roles.get((name, cat))
            if role is None:
                role = roles[(name, cat)] = self._role(name, cat)
            what, value, on_device = role
            ts, dur = float(ev.get("ts", 0.0)), float(ev["dur"])
            key = (ev.get("pid"), ev.get("tid"))
            if what == _MARKER:
                self.markers.append((value, ts, ts + dur, key))
                continue
            if what == _REGION:
                self.regions.append((name, ts, ts + dur))
                continue
            correlation = _correlation(ev) if on_device else NO_CORRELATION
            threads = self.device if on_device else self.host
            thread = threads.get(key)
            if thread is None:
                thread = threads[key] = _Thread()
            if what == _SPAN:
                index = value
                if on_device and cat in KERNEL_CATEGORIES:
                    self.kernel_us += dur
                    if (name, cat) in self._unclassified_keys:
                        self.unclassified[name] = self.unclassified.get(name, 0.0) + dur
            else:
                index = self._comm(value, ev, ts, dur, correlation, key, len(thread.starts), on_device)
            thread.starts.append(ts)
            thread.ends.append(ts + dur)
            thread.classes.append(index)
            if on_device:
                thread.correlations.append(correlation)
        return count

    def _runtime(self, ev: dict) -> None:
        correlation = _correlation(ev)
        if correlation == NO_CORRELATION:
            return
        name = ev.get("name") or ""
        launches = self._launch_names.get(name)
        if launches is None:
            launches = self._launch_names[name] = bool(_LAUNCH.search(name))
        self.runtime_ids.append(correlation)
        key = (ev.get("pid"), ev.get("tid"))
        thread = self._thread_keys.get(key)
        if thread is None:
            thread = self._thread_keys[key] = len(self._thread_keys)
        self.runtime_threads.append(thread)
        self.runtime_ts.append(float(ev.get("ts", 0.0)))
        self.runtime_launches.append(launches)

    def launch_times(self) -> dict[int, float]:
        """Correlation id -> start of the runtime call that launched it (the first, if repeated),
        for the communication transfers' ids only (a dict of every call would be large)."""
        wanted = {p[-1] for p in self.pending} - {NO_CORRELATION}
        times: dict[int, float] = {}
        if wanted:
            for c, t in zip(self.runtime_ids, self.runtime_ts, strict=True):
                if c in wanted and c not in times:
                    times[c] = t
        return times

    def _role(self, name: str, cat: str) -> tuple[int, Any, bool]:
        """(what, value, on the device): a marker's step, a span's class index, a comm verdict."""
        m = STEP_MARKER.match(name)
        if m:
            return _MARKER, int(m.group(1)), False
        if any(r.match(name) for r in TRAIN_STEP_REGIONS):
            return _REGION, name, False
        verdict = classify(name, cat)
        on_device = cat in _DEVICE_CATEGORIES
        if verdict.klass == "comm":
            return _COMM, verdict, on_device
        if verdict.klass is None and cat in KERNEL_CATEGORIES:
            self._unclassified_keys.add((name, cat))
        return _SPAN, self._class(verdict.klass, verdict.claims), on_device

    def _comm(self, verdict, ev: dict, ts: float, dur: float, correlation: int, key, position: int,
              on_device: bool) -> int:
        """A communication event's class index (its label names the dimension and kind, from
        its arguments); a transfer is also kept as a collective."""
        args = ev.get("args") or {}
        kind = verdict.collective or _kind_from_args(args)
        dim, group, size = self.groups.dimension(kind, args)
        if not on_device:
            # an annotation of a GPU transfer (`nccl:all_to_all`) records its input tensor
            names = (*_COMM_ARGS, "Input Dims", "Input type") if verdict.annotation else _COMM_ARGS
            carried = {k: args[k] for k in names if k in args}
            self.host_comms.append((key, ts, ts + dur, HostComm(kind, carried)))
        if verdict.transfer:
            if verdict.annotation and not on_device:
                self.annotations.append(len(self.pending))
            elif on_device:
                own = {k: args[k] for k in _COMM_ARGS if k in args}  # not the whole dict: kernels are many
                self.device_comms.append((verdict.collective or "other", own, key, position, len(self.pending)))
            self.pending.append((ts, dur, kind, dim, group, _bytes(args), size, correlation))
        return self._class(f"comm {dim} {kind}", verdict.claims)

    def link_collectives(self) -> None:
        """On a GPU trace: each communication kernel takes the kind, process group and bytes of
        the host collective that launched it (`paraplan.traces.comm_link`), and the host's
        annotations of those transfers (`nccl:all_reduce`) are no transfers themselves."""
        drop = set(self.annotations)
        if self.device_comms:
            launches = zip(self.runtime_threads, self.runtime_ts, self.runtime_ids, strict=True)
            wanted = {self.pending[i][-1] for *_, i in self.device_comms}
            comms = [(self._thread_keys.get(key, -1), *rest) for key, *rest in self.host_comms]
            around = host_collectives(launches, comms, wanted)
            for own_kind, own_args, key, position, i in self.device_comms:
                ts, dur, _, _, _, _, _, correlation = self.pending[i]
                kind, args = from_host(own_kind, own_args, around.get(correlation, []))
                if kind == "other":
                    kind = _kind_from_args(args)
                dim, group, size = self.groups.dimension(kind, args)
                self.pending[i] = (ts, dur, kind, dim, group, _bytes(args), size, correlation)
                thread = self.device[key]
                claims = self.classes[thread.classes[position]][1]
                thread.classes[position] = self._class(f"comm {dim} {kind}", claims)
        if drop:
            self.pending = [p for i, p in enumerate(self.pending) if i not in drop]

    def _class(self, label: str | None, claims: bool) -> int:
        index = self._class_index.get((label, claims))
        if index is None:
            index = self._class_index[(label, claims)] = len(self.classes)
            self.classes.append((label, claims))
        return index


def _windows(markers, regions) -> tuple[list[tuple[int, float, float]], str]:
    if markers:
        # the thread with the most markers is the training loop's (a trace has one)
        per_thread: dict[Any, int] = defaultdict(int)
        for *_, key in markers:
            per_thread[key] += 1
        main = max(per_thread, key=per_thread.__getitem__)
        return sorted((s, a, b) for s, a, b, k in markers if k == main), "ProfilerStep"
    name = regions[0][0]
    spans = sorted((a, b) for n, a, b in regions if n == name)
    return [(i, a, b) for i, (a, b) in enumerate(spans)], name


class _Segments:
    """One thread's time cut into classified pieces, in order: starts, ends and labels. A piece
    that continues the last one's class lengthens it (most do: nine in ten on real traces),
    except at an iteration's edge (where a 0 s iteration would then find a piece to cut)."""

    __slots__ = ("edges", "ends", "labels", "starts")

    def __init__(self, edges: frozenset[float]) -> None:
        self.starts, self.ends, self.labels = array("d"), array("d"), []
        self.edges = edges

    def add(self, start: float, end: float, label: str) -> None:
        if self.labels and self.ends[-1] == start and self.labels[-1] == label and start not in self.edges:
            self.ends[-1] = end
            return
        self.starts.append(start)
        self.ends.append(end)
        self.labels.append(label)


def _in_time_order(thread: _Thread) -> zip:
    """The thread's (start, end, class index) by start, the longer first at equal starts (a
    stable sort: equal events keep the file's order)."""
    starts = np.frombuffer(thread.starts, dtype=np.float64)
    ends = np.frombuffer(thread.ends, dtype=np.float64)
    order = np.lexsort((-ends, starts))
    classes = np.frombuffer(thread.classes, dtype=np.intc)
    return zip(array("d", starts[order].tobytes()), array("d", ends[order].tobytes()),
               array("i", classes[order].tobytes()), strict=True)


def _sweep(thread: _Thread, classes: list[tuple[str | None, bool]], edges: frozenset[float]) -> _Segments:
    """Give every instant of one thread to a class: the outermost claiming event's, else the
    innermost classified one's. An event that outlives its parent closes the parent."""
    out = _Segments(edges)
    add = out.add
    stack: list[tuple[float, str, bool]] = []  # (end, effective label, claims)
    cursor = 0.0
    for ts, end, index in _in_time_order(thread):
        label, claims = classes[index]
        while stack and (stack[-1][0] <= ts or end > stack[-1][0]):
            top_end, top_label, _ = stack.pop()
            stop = min(top_end, ts) if top_end > ts else top_end
            if stop > cursor:
                add(cursor, stop, top_label)
            cursor = max(cursor, stop)
        if stack:
            if ts > cursor:
                add(cursor, ts, stack[-1][1])
            parent_label, parent_claims = stack[-1][1], stack[-1][2]
            effective = parent_label if parent_claims else (label or parent_label)
            claims = claims or parent_claims
        else:
            effective = label or "other"
        stack.append((end, effective, claims))
        cursor = ts
    while stack:
        top_end, top_label, _ = stack.pop()
        if top_end > cursor:
            add(cursor, top_end, top_label)
        cursor = max(cursor, top_end)
    return out


def _iteration(step: int, start: float, end: float, segments: list[_Segments]) -> Iteration:
    compute: dict[str, list] = defaultdict(list)
    comm_dim: dict[str, list] = defaultdict(list)
    comm_kind: dict[str, list] = defaultdict(list)
    memory: list = []
    for segs in segments:
        starts, ends, labels = segs.starts, segs.ends, segs.labels
        for i in range(bisect_right(ends, start), len(labels)):
            s = starts[i]
            if s >= end:
                break
            e, label = ends[i], labels[i]
            piece = (max(s, start), min(e, end))
            if label.startswith("comm "):
                _, dim, kind = label.split(" ", 2)
                comm_dim[dim].append(piece)
                comm_kind[f"{dim} {kind}"].append(piece)
            elif label == "memory":
                memory.append(piece)
            else:
                compute[label].append(piece)
    by_class = {c: iv.union(compute[c]) for c in COMPUTE_CLASSES if c in compute}
    busy = iv.union(p for pieces in by_class.values() for p in pieces)
    comm_all = iv.union(p for pieces in comm_dim.values() for p in pieces)
    exposed: dict[str, float] = {}
    covered = busy
    for dim in sorted(comm_dim, key=_DIM_ORDER.index):
        mine = iv.union(comm_dim[dim])
        exposed[dim] = iv.length(iv.subtract(mine, covered)) * 1e-6
        covered = iv.union([*covered, *mine])
    memory_s = iv.length(iv.subtract(iv.union(memory), covered)) * 1e-6
    span = end - start
    return Iteration(
        step=step,
        start_us=start,
        iteration_s=span * 1e-6,
        compute_s=iv.length(busy) * 1e-6,
        compute_by_class={c: v * 1e-6 for c, v in iv.shares(by_class).items()},
        comm_by_dimension={d: iv.length(iv.union(comm_dim[d])) * 1e-6 for d in sorted(comm_dim, key=_DIM_ORDER.index)},
        exposed_by_dimension=exposed,
        comm_by_kind={k: iv.length(iv.union(v)) * 1e-6 for k, v in sorted(comm_kind.items())},
        overlap_s=iv.length(iv.intersect(comm_all, busy)) * 1e-6,
        idle_s=max(0.0, span - iv.length(iv.union([*busy, *comm_all, *memory]))) * 1e-6,
        memory_s=memory_s,
    )


_DIM_ORDER = ["tp", "cp", "ep", "pp", "dp", "unknown"]


def _collectives(pending, windows, kept: set[int], launched: dict[int, float]) -> list[Collective]:
    """Each transfer in the step (host window) that launched it (a host event: that holds it)."""
    starts = [a for _, a, _ in windows]
    out = []
    for ts, dur, kind, dim, group, nbytes, size, correlation in sorted(pending, key=lambda p: p[:5]):
        when = launched.get(correlation, ts)
        i = bisect_right(starts, when) - 1
        if i < 0 or when >= windows[i][2] or windows[i][0] not in kept:
            continue
        out.append(Collective(windows[i][0], kind, dim, group, nbytes, size, ts, dur * 1e-6))
    return out


def _correlation(ev: dict) -> int:
    value = (ev.get("args") or {}).get("correlation")
    if type(value) is not int or not 0 <= value < 2**63:
        return NO_CORRELATION
    return value


#: The arguments of a host collective (`record_param_comms`, PyTorch 2.x) that tell its kind, bytes
#: and process group.
_COMM_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size",
              "Process Group Name", "Process Group Description", "Process Group Ranks")


def _kind_from_args(args: dict) -> str:
    return collective_kind(str(args.get("Collective name", ""))) if args.get("Collective name") else "other"


def _bytes(args: dict) -> int | None:
    """Input bytes: NCCL's `In msg nelems` x dtype, or gloo's recorded `Input Dims` x type."""
    if "In msg nelems" in args:
        size = DTYPE_BYTES.get(str(args.get("dtype")))
        return int(args["In msg nelems"]) * size if size else None
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not dims or not types:
        return None
    size = DTYPE_BYTES.get(str(types[0]))
    if size is None or not isinstance(dims[0], list):
        return None
    n = 1
    for d in dims[0]:
        n *= int(d)
    return n * size


class _Groups:
    """Which parallel dimension a communication event belongs to."""

    def __init__(self, info: dict) -> None:
        self.config = {str(g.get("pg_name")): g for g in info.get("pg_config") or []}
        self.single = len(self.config) <= 1

    def dimension(self, kind: str, args: dict) -> tuple[str, str, int | None]:
        size = args.get("Group size")
        name = str(args.get("Process Group Name", ""))
        if not name and self.single and self.config:
            name = next(iter(self.config))  # gloo names no group: with one, it is that one
        config = self.config.get(name, {})
        desc = str(args.get("Process Group Description", "") or config.get("pg_desc", ""))
        group = desc or name or "world"
        dim = group_dimension(desc) or group_dimension(name)
        if dim is None:
            if kind in P2P_KINDS:
                dim = "pp"
            elif kind in EP_KINDS:
                dim = "ep"
            elif self.single or desc == "default_pg":
                # one process group: the collectives are data parallel's (DDP, FSDP, ZeRO)
                dim = "dp"
            else:
                dim = "unknown"
        if size is None:
            size = config.get("pg_size")
        return dim, group, int(size) if size is not None else None
