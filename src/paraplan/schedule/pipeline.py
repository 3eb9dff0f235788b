"""Event simulation of GPipe, 1F1B, interleaved 1F1B and the zero-bubble schedules (ZB-H1,
ZB-V) with unequal stage times.

Each stage runs a fixed sequence of tasks (forward, backward, or for the zero-bubble
schedules input-gradient backward B and weight-gradient backward W, of one micro-batch on one
model chunk), in the order the frameworks issue them (``schedule.orders``). A task starts when
its stage is free and its input has arrived: the previous virtual stage's forward output, or
the next virtual stage's input gradient; a W waits for its own B only. Point-to-point
transfers are blocking, as in Megatron-LM and DeepSpeed, so a task occupies its stage for its
compute time plus its send time (none between two chunks of the same stage: ZB-V's V turns on
the last stage). With equal stages, no transfer time and 1F1B this gives the closed form
(m + p - 1) * (f + b), a bubble fraction of (p - 1) / (m + p - 1).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from paraplan.schedule import interleaved
from paraplan.schedule.graph import graph_ends, graph_levels
from paraplan.schedule.orders import B, F, W, placement, stage_order
from paraplan.schedule.steady import LONG, drift_bracket, extrapolate, extrapolate_many
from paraplan.specs import Schedule


@dataclass(frozen=True, slots=True)
class Task:
    """One forward (``backward=False``) or backward of micro-batch ``mb`` on ``chunk``; in a
    zero-bubble schedule a backward is the input gradient, or with ``weight`` the weight
    gradient."""

    stage: int
    chunk: int
    mb: int
    backward: bool
    start: float
    end: float
    weight: bool = False


@dataclass(frozen=True, slots=True)
class PipelineResult:
    makespan: float
    finish: tuple[float, ...]  # when each stage finishes its last task
    busy: tuple[float, ...]  # time each stage spends on tasks
    tasks: tuple[Task, ...] | None  # the timeline, when asked for
    # each stage's finish had every send been free, and had all communication been free (the
    # prediction's breakdown reads them: ``prediction.facade.stage_parts``; kept with the timeline)
    free_sends_finish: tuple[float, ...] | None = None
    compute_finish: tuple[float, ...] | None = None

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the busiest-finishing stage's time span."""
        worst = max(range(len(self.finish)), key=lambda i: self.finish[i] - self.busy[i])
        return (self.finish[worst] - self.busy[worst]) / self.makespan if self.makespan else 0.0


@functools.lru_cache(maxsize=64)
def _structure(schedule: Schedule, p: int, m: int, v: int) -> tuple[tuple[int, int, int, int, int, int], ...]:
    """The task graph in a topological order: (stage, chunk, kind, micro-batch, index of the
    stage's previous task, index of the task whose output it waits for). It depends only on
    the schedule's shape, never on durations, so it is built once."""
    orders = [stage_order(schedule, i, p, m, v) for i in range(p)]
    where_is = placement(schedule, p, v)
    at = [[schedule.virtual_stage(p, i, c) for c in range(v)] for i in range(p)]  # (stage, chunk) -> position
    last_vs = p * v - 1
    index: dict[tuple[int, int, int, int], int] = {}
    out: list[tuple[int, int, int, int, int, int]] = []
    pos, last = [0] * p, [-1] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for i in range(p):
            order, at_i = orders[i], at[i]
            while pos[i] < len(order):
                kind, c, j = order[pos[i]]
                s = at_i[c]
                if kind == F:
                    key = (*where_is[s - 1], F, j) if s > 0 else None
                elif kind == B:
                    key = (*where_is[s + 1], B, j) if s < last_vs else (i, c, F, j)
                else:
                    key = (i, c, B, j)
                dep = -1 if key is None else index.get(key, -2)
                if dep == -2:
                    break
                index[(i, c, kind, j)] = len(out)
                out.append((i, c, kind, j, last[i], dep))
                last[i] = len(out) - 1
                pos[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("simulate_pipeline: the schedule deadlocked (this is a bug)")
    return tuple(out)


@functools.lru_cache(maxsize=64)
def _flat_structure(schedule: Schedule, p: int, m: int, v: int) -> tuple[list[int], list[int], list[int]]:
    """_structure as three flat lists: duration index, previous task, awaited task."""
    structure = _structure(schedule, p, m, v)
    kinds = [(i * v + c) * 3 + kind for i, c, kind, _, _, _ in structure]
    return kinds, [t[4] for t in structure], [t[5] for t in structure]


@functools.lru_cache(maxsize=64)
def _last_task(schedule: Schedule, p: int, m: int, v: int) -> tuple[int, ...]:
    """Index of each stage's last task."""
    last = [0] * p
    for k, task in enumerate(_structure(schedule, p, m, v)):
        last[task[0]] = k
    return tuple(last)


@functools.lru_cache(maxsize=64)
def _stage0_done(schedule: Schedule, p: int, m: int, v: int) -> tuple[int, ...]:
    """Index of the task that finishes each micro-batch on the model's first chunk (stage
    0, chunk 0: its backward, or its weight gradient when split), in micro-batch order."""
    done = [0] * m
    final = W if schedule.splits_backward else B
    for k, (i, c, kind, j, _, _) in enumerate(_structure(schedule, p, m, v)):
        if i == 0 and c == 0 and kind == final:
            done[j] = k
    return tuple(done)


def _task_ends(
    dur: list[float], arrival: tuple[float, float, float], overlap_p2p: bool, schedule: Schedule, p: int, m: int, v: int
) -> list[float]:
    """When each task of ``_structure`` ends, given each (stage, chunk, kind)'s duration."""
    kinds, prevs, deps = _flat_structure(schedule, p, m, v)
    end = [0.0] * len(kinds)
    stage_of = 3 * v
    k = 0
    for kind, prev, dep in zip(kinds, prevs, deps, strict=True):
        t0 = end[prev] if prev >= 0 else 0.0
        if dep >= 0:
            t_dep = end[dep]
            # with asynchronous sends, an input from another stage arrives one transfer later
            if overlap_p2p and kinds[dep] // stage_of != kind // stage_of:
                t_dep += arrival[kind % 3]
            if t_dep > t0:
                t0 = t_dep
        end[k] = t0 + dur[kind]
        k += 1
    return end


def task_durations(schedule: Schedule, p: int, v: int, fwd_s, bwd_s, wgrad_s, send_bwd_s, send_fwd_s) -> list:
    """Each (stage, chunk, kind)'s duration, indexed (stage * v + chunk) * 3 + kind, from each
    stage's forward, whole backward and weight-gradient seconds (floats, or arrays of many
    plans). A task holds its stage for its compute and its blocking send: ``send_fwd_s`` after
    a forward, ``send_bwd_s`` after an input gradient, none out of the model's two ends and
    none between two chunks of one stage."""
    where_is = placement(schedule, p, v)
    last_vs = p * v - 1
    dur: list = [0.0] * (3 * p * v)
    for s, (i, c) in enumerate(where_is):
        sends_fwd = s < last_vs and where_is[s + 1][0] != i
        sends_bwd = s > 0 and where_is[s - 1][0] != i
        at = (i * v + c) * 3
        dur[at + F] = fwd_s[i] / v + (send_fwd_s if sends_fwd else 0.0)
        dur[at + B] = (bwd_s[i] - wgrad_s[i]) / v + (send_bwd_s if sends_bwd else 0.0)
        dur[at + W] = wgrad_s[i] / v
    return dur


def simulate_pipeline(
    fwd_s: list[float],
    bwd_s: list[float],
    p2p_s: float,
    num_microbatches: int,
    schedule: Schedule = Schedule.ONE_F_ONE_B,
    vpp: int = 1,
    keep_tasks: bool = False,
    fwd_extra_s: float = 0.0,
    overlap_p2p: bool = False,
    wgrad_s: list[float] | None = None,
) -> PipelineResult:
    """Simulate one iteration's pipeline.

    ``fwd_s[i]`` and ``bwd_s[i]`` are stage i's times for one micro-batch over all of its
    layers (all chunks together); a zero-bubble schedule runs the weight-gradient part of the
    backward, ``wgrad_s[i]`` of ``bwd_s[i]`` (none if not given), as a task of its own. ``p2p_s``
    is one activation (or gradient) transfer between neighbouring stages, and a forward send
    takes ``fwd_extra_s`` more (DeepSpeed's pipeline engine sends the attention mask with the
    activation). With ``overlap_p2p`` (Megatron-LM's overlap_p2p_comm, its interleaved schedule's default) sends are
    asynchronous: they no longer hold the sending stage, but a task still waits for its input
    to arrive. Returns the makespan and per-stage finish and busy times.
    """
    p, m = len(fwd_s), num_microbatches
    v = schedule.chunks(vpp)
    if len(bwd_s) != p or p < 1 or m < 1 or v < 1 or (wgrad_s is not None and len(wgrad_s) != p):
        raise ValueError("simulate_pipeline: need matching stage lists, m >= 1 and vpp >= 1")
    if p == 1 and not keep_tasks:  # no pipeline: the micro-batches run back to back
        total = m * (fwd_s[0] + bwd_s[0])
        return PipelineResult(makespan=total, finish=(total,), busy=(total,), tasks=None)
    split = schedule.splits_backward
    w_s = list(wgrad_s) if (split and wgrad_s is not None) else [0.0] * p
    blocking = 0.0 if overlap_p2p else 1.0
    dur = task_durations(schedule, p, v, fwd_s, bwd_s, w_s, blocking * p2p_s, blocking * (p2p_s + fwd_extra_s))
    busy = tuple(m * sum(dur[i * v * 3:(i + 1) * v * 3]) for i in range(p))
    arrival = (p2p_s + fwd_extra_s, p2p_s, 0.0) if overlap_p2p else (0.0, 0.0, 0.0)

    def run(k: int) -> tuple[tuple[float, ...], list[float]]:
        end = _task_ends(dur, arrival, overlap_p2p, schedule, p, k, v)
        last = _last_task(schedule, p, k, v)
        return tuple(end[last[i]] for i in range(p)), [end[t] for t in _stage0_done(schedule, p, k, v)]

    steady = None if keep_tasks else extrapolate(run, m, p)
    if steady is not None:
        return PipelineResult(makespan=max(steady), finish=steady, busy=busy, tasks=None)
    end = _task_ends(dur, arrival, overlap_p2p, schedule, p, m, v)
    last = _last_task(schedule, p, m, v)
    clock = tuple(end[last[i]] for i in range(p))
    tasks = None
    if keep_tasks:
        structure = _structure(schedule, p, m, v)
        tasks = tuple(
            Task(i, c, j, kind != F, end[k] - dur[(i * v + c) * 3 + kind], end[k], kind == W)
            for k, (i, c, kind, j, _, _) in enumerate(structure)
        )
    return PipelineResult(makespan=max(clock), finish=clock, busy=busy, tasks=tasks)


def ends_of_two(kinds: list[int], prevs: list[int], deps: list[int], dur_a: list[float], dur_b: list[float]):
    """When each node of a task graph in topological order ends (start at the later of its two
    predecessors' ends, -1: none; run for its duration, indexed by ``kinds``), for two sets of
    durations in one pass: (ends under ``dur_a``, ends under ``dur_b``), each as one
    simulation of it gives."""
    n = len(kinds)
    end_a, end_b = [0.0] * (n + 1), [0.0] * (n + 1)  # the last, never written, is "none" (-1)
    for k, (kind, prev, dep) in enumerate(zip(kinds, prevs, deps, strict=True)):
        a, x = end_a[prev], end_a[dep]
        end_a[k] = (a if a >= x else x) + dur_a[kind]
        b, y = end_b[prev], end_b[dep]
        end_b[k] = (b if b >= y else y) + dur_b[kind]
    return end_a, end_b


def free_sends_finish(
    passes: tuple[list[float], list[float]],
    compute: tuple[list[float], list[float]],
    num_microbatches: int,
    schedule: Schedule,
    vpp: int,
    wgrad_s: list[float],
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Each stage's finish with every send free, ``simulate_pipeline(..., p2p_s=0)``'s, for two
    sets of (forward, backward) stage times at once: ``passes`` and ``compute`` (the breakdown's
    runs without sends, and without any communication). One walk of the task graph times both;
    past ``LONG`` micro-batches each is extrapolated as ``simulate_pipeline`` does."""
    p, m, v = len(passes[0]), num_microbatches, schedule.chunks(vpp)
    if m > LONG or p == 1:
        return tuple(simulate_pipeline(f, b, 0.0, m, schedule, vpp, wgrad_s=wgrad_s).finish for f, b in (passes, compute))
    w_s = list(wgrad_s) if schedule.splits_backward else [0.0] * p
    dur_a = task_durations(schedule, p, v, *passes, w_s, 0.0, 0.0)
    dur_b = task_durations(schedule, p, v, *compute, w_s, 0.0, 0.0)
    kinds, prevs, deps = _flat_structure(schedule, p, m, v)
    end_a, end_b = ends_of_two(kinds, prevs, deps, dur_a, dur_b)
    last = _last_task(schedule, p, m, v)
    return tuple(end_a[t] for t in last), tuple(end_b[t] for t in last)


@functools.lru_cache(maxsize=64)
def _levels(schedule: Schedule, p: int, m: int, v: int, overlap_p2p: bool = False):
    """_structure in levels (``schedule.graph``); with ``overlap_p2p`` each task waits for an
    input from another stage one transfer longer (``_task_ends``): its delay is the duration
    row 3 p v + 1 (a forward's input) or 3 p v + 2 (a backward's), 3 p v (zero) otherwise."""
    if schedule is Schedule.INTERLEAVED:  # built in closed form (its nodes numbered its own way)
        return interleaved.levels(p, m, v, overlap_p2p)
    kinds, prevs, deps = _flat_structure(schedule, p, m, v)
    if not overlap_p2p:
        return graph_levels(kinds, prevs, deps)
    stage_of, base = 3 * v, 3 * p * v
    delays = [base + 1 + kind % 3 if dep >= 0 and kind % 3 != W and kinds[dep] // stage_of != kind // stage_of
              else base for kind, dep in zip(kinds, deps, strict=True)]
    return graph_levels(kinds, prevs, deps, delays)


def _graph_nodes(schedule: Schedule, p: int, m: int, v: int) -> tuple[list[int], list[int]]:
    """In ``_levels``' numbering: each stage's last task and the tasks that finish each
    micro-batch on the model's first chunk (``_last_task``, ``_stage0_done``)."""
    if schedule is Schedule.INTERLEAVED:
        return interleaved.last_tasks(p, m, v), interleaved.stage0_done(p, m, v)
    return list(_last_task(schedule, p, m, v)), list(_stage0_done(schedule, p, m, v))


def pipeline_finish(schedule: Schedule, p: int, m: int, v: int, dur, arrival=None):
    """Each stage's finish time for many plans of one shape (``p`` stages, ``m`` micro-batches,
    ``v`` chunks per stage) at once: ``dur`` is an array of shape (3 p v, plans) indexed as
    ``task_durations`` (blocking sends included). With ``arrival``, an array (2, plans) of
    a forward's and a backward's transfer, sends are asynchronous (``simulate_pipeline``'s
    ``overlap_p2p``: ``dur`` then holds no send, and an input from another stage arrives one
    transfer after its task ends). Returns an array of shape
    (p, plans), equal to ``simulate_pipeline``'s finish times up to ``batched_short(p) + 2 p``
    micro-batches. Past that the steady state is read off two short runs a cycle apart, so the
    search's cost stays flat in m: as the stages may still drift into a slower pace after the
    short run (a small rate difference eating a warm-up's slack), the finish is the middle of
    the bracket between that cycle repeated and the slowest stage's pace
    (``steady.drift_bracket``), within ``DRIFT_BOUND`` (0.1 %) of the simulation; a plan whose
    bracket is wider, or whose short run shows no cycle, is run in full."""
    import numpy as np

    overlap = arrival is not None
    if overlap:  # the delays' rows: none, a forward's input, a backward's
        dur = np.concatenate([dur, np.zeros((1, dur.shape[1])), arrival])
    short = batched_short(p)
    if m <= short + 2 * p:
        return _full(schedule, p, m, v, dur, overlap)

    def run(k: int, sel):
        levels, rows = _levels(schedule, p, k, v, overlap)
        last, done = _graph_nodes(schedule, p, k, v)
        end = graph_ends(levels, rows, dur[:, sel], last + done)
        return end[:p], end[p:]

    def settle(sel, start, then, whole: int, remaining: int):
        chord = (then - start) * (p / whole)  # the short run's last cycle, per p micro-batches
        return drift_bracket(p, v, start, start - chord, dur[:, sel], remaining // p)

    out, rest = extrapolate_many(run, m, p, short, dur.shape[1], settle)
    if rest.any():
        full = _full(schedule, p, m, v, dur[:, rest], overlap)
        if out is None:
            return full
        out[:, rest] = full
    return out


def batched_short(p: int) -> int:
    """Micro-batches of ``pipeline_finish``'s short runs for ``p`` stages: many times the
    warm-up, so that the middle half of the run is past it and past the slow drifts seen in
    zero-bubble schedules (ZB-V on 3 equal stages with a 0.01 s send changes pace after 55
    micro-batches; with 32 the screen was 0.22 % fast at 97)."""
    return max(128, 16 * p)


def _full(schedule: Schedule, p: int, m: int, v: int, dur, overlap: bool):
    """pipeline_finish from the whole task graph (one plan at a time, each extrapolated as
    ``simulate_pipeline`` does, past ``LONG`` micro-batches); ``dur`` with the delays' rows
    when ``overlap``."""
    if m > LONG:
        return _each(schedule, p, m, v, dur, overlap)
    levels, rows = _levels(schedule, p, m, v, overlap)
    return graph_ends(levels, rows, dur, _graph_nodes(schedule, p, m, v)[0])


def _each(schedule: Schedule, p: int, m: int, v: int, dur, overlap: bool):
    """pipeline_finish one plan at a time, each extrapolated from its steady state as
    ``simulate_pipeline`` does."""
    import numpy as np

    base = 3 * p * v
    columns = []
    for j in range(dur.shape[1]):
        column = [float(d) for d in dur[:base, j]]
        arrival = (float(dur[base + 1, j]), float(dur[base + 2, j]), 0.0) if overlap else (0.0, 0.0, 0.0)

        def run(k: int, column=column, arrival=arrival) -> tuple[tuple[float, ...], list[float]]:
            end = _task_ends(column, arrival, overlap, schedule, p, k, v)
            last = _last_task(schedule, p, k, v)
            return tuple(end[last[i]] for i in range(p)), [end[t] for t in _stage0_done(schedule, p, k, v)]

        steady = extrapolate(run, m, p)
        columns.append(steady if steady is not None else run(m)[0])
    return np.asarray(columns).T
