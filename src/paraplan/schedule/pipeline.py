"""Event simulation of GPipe, 1F1B and interleaved 1F1B with unequal stage times.

Each stage runs a fixed sequence of tasks (forward or backward of one micro-batch on one
model chunk), in the order Megatron-LM's schedules issue them. A task starts when its stage
is free and its input has arrived: the previous chunk's forward output (``fwd`` of the stage
before), or the next chunk's input gradient (``bwd`` of the stage after). Point-to-point
transfers are blocking, as in Megatron-LM and DeepSpeed, so a task occupies its stage for its
compute time plus its send time. With equal stages, no transfer time and 1F1B this gives the
closed form (m + p - 1) * (f + b), a bubble fraction of (p - 1) / (m + p - 1).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from paraplan.schedule.steady import extrapolate
from paraplan.specs import Schedule


@dataclass(frozen=True, slots=True)
class Task:
    """One forward (``backward=False``) or backward of micro-batch ``mb`` on ``chunk``."""

    stage: int
    chunk: int
    mb: int
    backward: bool
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class PipelineResult:
    makespan: float
    finish: tuple[float, ...]  # when each stage finishes its last task
    busy: tuple[float, ...]  # time each stage spends on tasks
    tasks: tuple[Task, ...] | None  # the timeline, when asked for

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the busiest-finishing stage's time span."""
        worst = max(range(len(self.finish)), key=lambda i: self.finish[i] - self.busy[i])
        return (self.finish[worst] - self.busy[worst]) / self.makespan if self.makespan else 0.0


def _order(schedule: Schedule, stage: int, p: int, m: int, v: int) -> list[tuple[bool, int, int]]:
    """(backward, chunk, micro-batch) in the order stage ``stage`` issues them."""
    if schedule is Schedule.GPIPE:
        return [(False, 0, j) for j in range(m)] + [(True, 0, j) for j in range(m)]
    total = m * v

    def fwd(k: int) -> tuple[bool, int, int]:
        return False, (k // p) % v, (k // (p * v)) * p + k % p

    def bwd(k: int) -> tuple[bool, int, int]:
        return True, v - 1 - (k // p) % v, (k // (p * v)) * p + k % p

    if v == 1:
        warmup = min(p - stage - 1, m)
    else:
        warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)
    order = [fwd(k) for k in range(warmup)]
    for k in range(total - warmup):
        order.append(fwd(warmup + k))
        order.append(bwd(k))
    order += [bwd(k) for k in range(total - warmup, total)]
    return order


@functools.lru_cache(maxsize=64)
def _structure(schedule: Schedule, p: int, m: int, v: int) -> tuple[tuple[int, int, bool, int, int, int], ...]:
    """The task graph in a topological order: (stage, chunk, backward, micro-batch,
    index of the stage's previous task, index of the task whose output it waits for).
    It depends only on the schedule's shape, never on durations, so it is built once."""
    orders = [_order(schedule, i, p, m, v) for i in range(p)]
    where: dict[tuple[int, int, int, bool], int] = {}
    out: list[tuple[int, int, bool, int, int, int]] = []
    pos, last = [0] * p, [-1] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for i in range(p):
            order = orders[i]
            while pos[i] < len(order):
                backward, c, j = order[pos[i]]
                if not backward:
                    key = (i - 1, c, j, False) if i > 0 else (p - 1, c - 1, j, False) if c > 0 else None
                elif i < p - 1:
                    key = (i + 1, c, j, True)
                else:
                    key = (0, c + 1, j, True) if c < v - 1 else (i, c, j, False)
                dep = -1 if key is None else where.get(key, -2)
                if dep == -2:
                    break
                where[(i, c, j, backward)] = len(out)
                out.append((i, c, backward, j, last[i], dep))
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
    kinds = [(i * v + c) * 2 + int(backward) for i, c, backward, _, _, _ in structure]
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
    """Index of the task that finishes each micro-batch on stage 0 (its first chunk's
    backward), in micro-batch order."""
    done = [0] * m
    for k, (i, c, backward, j, _, _) in enumerate(_structure(schedule, p, m, v)):
        if i == 0 and c == 0 and backward:
            done[j] = k
    return tuple(done)


def _task_ends(
    dur: list[float], arrival: tuple[float, float], overlap_p2p: bool, schedule: Schedule, p: int, m: int, v: int
) -> list[float]:
    """When each task of ``_structure`` ends, given each (stage, chunk, direction)'s duration."""
    kinds, prevs, deps = _flat_structure(schedule, p, m, v)
    end = [0.0] * len(kinds)
    stage_of = 2 * v
    k = 0
    for kind, prev, dep in zip(kinds, prevs, deps, strict=True):
        t0 = end[prev] if prev >= 0 else 0.0
        if dep >= 0:
            t_dep = end[dep]
            # with asynchronous sends, an input from another stage arrives one transfer later
            if overlap_p2p and kinds[dep] // stage_of != kind // stage_of:
                t_dep += arrival[kind & 1]
            if t_dep > t0:
                t0 = t_dep
        end[k] = t0 + dur[kind]
        k += 1
    return end


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
) -> PipelineResult:
    """Simulate one iteration's pipeline.

    ``fwd_s[i]`` and ``bwd_s[i]`` are stage i's times for one micro-batch over all of its
    layers (all chunks together); ``p2p_s`` is one activation (or gradient) transfer between
    neighbouring stages, and a forward send takes ``fwd_extra_s`` more (DeepSpeed's pipeline
    engine sends the attention mask with the activation). With ``overlap_p2p`` (Megatron-LM's
    --overlap-p2p-communication) sends are asynchronous: they no longer hold the sending
    stage, but a task still waits for its input to arrive. Returns the makespan and per-stage
    finish and busy times.
    """
    p, m = len(fwd_s), num_microbatches
    v = vpp if schedule is Schedule.INTERLEAVED else 1
    if len(bwd_s) != p or p < 1 or m < 1 or v < 1:
        raise ValueError("simulate_pipeline: need matching stage lists, m >= 1 and vpp >= 1")
    if p == 1 and not keep_tasks:  # no pipeline: the micro-batches run back to back
        total = m * (fwd_s[0] + bwd_s[0])
        return PipelineResult(makespan=total, finish=(total,), busy=(total,), tasks=None)
    last_chunk = v - 1
    # A task's duration includes its blocking send (none out of the model's two ends).
    # Durations are indexed (stage * v + chunk) * 2 + backward, as in _flat_structure.
    blocking = 0.0 if overlap_p2p else 1.0
    dur = []
    for i in range(p):
        for c in range(v):
            dur.append(fwd_s[i] / v + (0.0 if (i == p - 1 and c == last_chunk) else blocking * (p2p_s + fwd_extra_s)))
            dur.append(bwd_s[i] / v + (0.0 if (i == 0 and c == 0) else blocking * p2p_s))
    busy = tuple(m * sum(dur[(i * v + c) * 2 + b] for c in range(v) for b in (0, 1)) for i in range(p))
    arrival = (p2p_s + fwd_extra_s, p2p_s) if overlap_p2p else (0.0, 0.0)

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
            Task(i, c, j, backward, end[k] - dur[(i * v + c) * 2 + backward], end[k])
            for k, (i, c, backward, j, _, _) in enumerate(structure)
        )
    return PipelineResult(makespan=max(clock), finish=clock, busy=busy, tasks=tasks)
