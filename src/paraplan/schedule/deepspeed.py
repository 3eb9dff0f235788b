"""DeepSpeed's pipeline engine: the TrainSchedule's step order, with rendezvous sends.

DeepSpeed's ``PipelineEngine`` runs no schedule of Megatron-LM's kind. Every stage walks
through ``2 (m + p - 1)`` steps of ``deepspeed/runtime/pipe/schedule.py::TrainSchedule``;
in each step it first exchanges with one neighbour, then computes one forward or backward:

- a forward step sends the gradient of the *previous* step's backward to the stage before
  (``SendGrad``), then receives this micro-batch's activation (``RecvActivation``);
- a backward step receives this micro-batch's gradient from the stage after (``RecvGrad``),
  then sends the activation of the *previous* step's forward (``SendActivation``).

This is the order since DeepSpeed 0.9 (PR #2862, March 2023, which put each send before the
receive to stop the receive overwriting a buffer still in use); before it the receive came
first, which times the same (both transfers of a step go to the same neighbour). An output
therefore leaves its stage one step late, at the start of the stage's next step, not right
after it was computed as in Megatron-LM's 1F1B.

Every transfer is ``torch.distributed.send``/``recv`` over NCCL: the compute stream waits
for it, and a large message completes only when both ends have posted it. So a transfer is a
rendezvous: it starts when the later of the two stages reaches it and holds both for its
duration. (The runs this was written for also synchronise the device around every
checkpointed layer, so their host follows the same order.) The data loads, the tied-weight
and gradient reductions and the optimizer step are costed outside the pipeline.
"""

from __future__ import annotations

import functools

from paraplan.schedule.graph import graph_ends, graph_levels
from paraplan.schedule.pipeline import PipelineResult, Task, ends_of_two
from paraplan.schedule.steady import LONG, extrapolate

# command kinds
FWD, BWD, SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD = range(6)


def _micro_batch(step: int, stage: int, p: int) -> tuple[int, bool]:
    """TrainSchedule._step_to_micro_batch: (micro-batch id, is_forward) of a step."""
    if step % 2 == stage % 2:  # even stages run forwards on even steps, odd ones on odd steps
        return (step - stage % 2) // 2 - stage // 2, True
    if step % 2 == 0:  # an odd stage on an even step
        return step // 2 - p + (stage + 1) // 2, False
    return (step - 1) // 2 - p + 1 + stage // 2, False  # an even stage on an odd step


def train_schedule(stage: int, p: int, m: int) -> list[tuple[int, int]]:
    """(command, micro-batch) in the order stage ``stage`` of ``p`` runs them for ``m``
    micro-batches: TrainSchedule.steps() without loads and the end-of-batch reductions."""
    cmds: list[tuple[int, int]] = []
    prev = -1
    valid = range(m).__contains__
    for step in range(2 * (m + p - 1)):
        mb, forward = _micro_batch(step, stage, p)
        if forward:
            if valid(prev) and stage > 0:
                cmds.append((SEND_GRAD, prev))
            if valid(mb) and stage > 0:
                cmds.append((RECV_ACT, mb))
            if valid(mb):
                cmds.append((FWD, mb))
        else:
            if valid(mb) and stage < p - 1:
                cmds.append((RECV_GRAD, mb))
            if valid(prev) and stage < p - 1:
                cmds.append((SEND_ACT, prev))
            if valid(mb):
                cmds.append((BWD, mb))
        prev = mb
    return cmds


# A send on one stage and the receive it pairs with on the neighbour.
_PARTNER = {SEND_ACT: (1, RECV_ACT), SEND_GRAD: (-1, RECV_GRAD), RECV_ACT: (-1, SEND_ACT), RECV_GRAD: (1, SEND_GRAD)}


@functools.lru_cache(maxsize=64)
def _graph(p: int, m: int) -> tuple[tuple[int, int, int, int, int], ...]:
    """The steps of all stages as one graph in a topological order. A node is a compute
    (stage, FWD or BWD, micro-batch, previous node of the stage, -1) or a transfer
    (sending stage, SEND_ACT or SEND_GRAD, micro-batch, previous node of the sender, previous
    node of the receiver). Durations never change it, so it is built once per shape."""
    orders = [train_schedule(i, p, m) for i in range(p)]
    pos, last = [0] * p, [-1] * p
    nodes: list[tuple[int, int, int, int, int]] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for i in range(p):
            while pos[i] < len(orders[i]):
                kind, mb = orders[i][pos[i]]
                if kind in (FWD, BWD):
                    nodes.append((i, kind, mb, last[i], -1))
                    last[i] = len(nodes) - 1
                    pos[i] += 1
                    remaining -= 1
                else:
                    step, want = _PARTNER[kind]
                    j = i + step
                    if pos[j] >= len(orders[j]) or orders[j][pos[j]] != (want, mb):
                        break  # the neighbour has not reached the matching call yet
                    sender, receiver = (i, j) if kind in (SEND_ACT, SEND_GRAD) else (j, i)
                    send_kind = kind if kind in (SEND_ACT, SEND_GRAD) else want
                    nodes.append((sender, send_kind, mb, last[sender], last[receiver]))
                    last[i] = last[j] = len(nodes) - 1
                    pos[i] += 1
                    pos[j] += 1
                    remaining -= 2
                progressed = True
        if not progressed:
            raise RuntimeError("simulate_deepspeed_pipeline: the schedule deadlocked (this is a bug)")
    return tuple(nodes)


@functools.lru_cache(maxsize=64)
def _flat(p: int, m: int) -> tuple[list[int], list[int], list[int], tuple[int, ...]]:
    """_graph as flat lists (duration index, first and second predecessor) and each stage's
    last node. Durations are indexed stage * 4 + (0 forward, 1 backward, 2 activation send,
    3 gradient send)."""
    graph = _graph(p, m)
    column = {FWD: 0, BWD: 1, SEND_ACT: 2, SEND_GRAD: 3}
    kinds = [stage * 4 + column[kind] for stage, kind, _, _, _ in graph]
    last = [-1] * p
    for k, (stage, kind, _, _, _) in enumerate(graph):
        last[stage] = k
        if kind == SEND_ACT:
            last[stage + 1] = k
        elif kind == SEND_GRAD:
            last[stage - 1] = k
    return kinds, [g[3] for g in graph], [g[4] for g in graph], tuple(last)


@functools.lru_cache(maxsize=64)
def _stage0_done(p: int, m: int) -> tuple[int, ...]:
    """Node of each micro-batch's backward on stage 0, in micro-batch order."""
    done = [0] * m
    for k, (stage, kind, mb, _, _) in enumerate(_graph(p, m)):
        if stage == 0 and kind == BWD:
            done[mb] = k
    return tuple(done)


def _node_ends(dur, p: int, m: int) -> list[float]:
    """When each node of ``_graph`` ends, given the durations indexed as in ``_flat``."""
    kinds, first, second, _ = _flat(p, m)
    end = [0.0] * len(kinds)
    for k, (kind, a, b) in enumerate(zip(kinds, first, second, strict=True)):
        t0 = end[a] if a >= 0 else 0.0
        if b >= 0 and end[b] > t0:
            t0 = end[b]
        end[k] = t0 + dur[kind]
    return end


def _finish_of(p: int, m: int, dur) -> tuple[float, ...]:
    """Each stage's finish for one plan's durations (``dur`` as in ``_flat``)."""
    fwd, bwd = [float(dur[4 * i]) for i in range(p)], [float(dur[4 * i + 1]) for i in range(p)]
    send_grad = float(dur[3])
    return simulate_deepspeed_pipeline(fwd, bwd, send_grad, m, fwd_extra_s=float(dur[2]) - send_grad).finish


def transfer_s(stage: int, p: int, m: int, p2p_s: float, fwd_extra_s: float = 0.0) -> float:
    """Seconds stage ``stage`` of ``p`` spends in transfers over ``m`` micro-batches: a
    rendezvous holds both ends, so every activation and gradient in or out of it counts."""
    neighbours = (stage > 0) + (stage < p - 1)
    return neighbours * m * (2 * p2p_s + fwd_extra_s)


def simulate_deepspeed_pipeline(
    fwd_s: list[float],
    bwd_s: list[float],
    p2p_s: float,
    num_microbatches: int,
    *,
    keep_tasks: bool = False,
    fwd_extra_s: float = 0.0,
) -> PipelineResult:
    """One iteration of DeepSpeed's TrainSchedule.

    ``fwd_s[i]``/``bwd_s[i]`` are stage i's compute seconds for one micro-batch; an
    activation send takes ``p2p_s + fwd_extra_s`` (DeepSpeed also sends the attention mask),
    a gradient send ``p2p_s``. Busy time counts compute and the transfers the stage takes
    part in (a rendezvous holds both ends); waiting is the rest of each stage's span."""
    p, m = len(fwd_s), num_microbatches
    if len(bwd_s) != p or p < 1 or m < 1:
        raise ValueError("simulate_deepspeed_pipeline: need matching stage lists and m >= 1")
    dur = []
    for i in range(p):
        dur += [fwd_s[i], bwd_s[i], p2p_s + fwd_extra_s, p2p_s]
    busy = tuple(m * (fwd_s[i] + bwd_s[i]) + transfer_s(i, p, m, p2p_s, fwd_extra_s) for i in range(p))

    def run(k: int) -> tuple[tuple[float, ...], list[float]]:
        end = _node_ends(dur, p, k)
        return tuple(end[n] for n in _flat(p, k)[3]), [end[n] for n in _stage0_done(p, k)]

    steady = None if keep_tasks else extrapolate(run, m, p)
    if steady is not None:
        return PipelineResult(makespan=max(steady), finish=steady, busy=busy, tasks=None)
    end = _node_ends(dur, p, m)
    kinds = _flat(p, m)[0]
    finish = tuple(end[k] for k in _flat(p, m)[3])
    tasks = None
    if keep_tasks:
        tasks = tuple(
            Task(stage, 0, mb, kind == BWD, end[k] - dur[kinds[k]], end[k])
            for k, (stage, kind, mb, _, _) in enumerate(_graph(p, m))
            if kind in (FWD, BWD)
        )
    return PipelineResult(makespan=max(finish), finish=finish, busy=busy, tasks=tasks)


def deepspeed_free_sends_finish(
    passes: tuple[list[float], list[float]], compute: tuple[list[float], list[float]], num_microbatches: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Each stage's finish with every transfer free, ``simulate_deepspeed_pipeline(...,
    p2p_s=0)``'s, for two sets of (forward, backward) stage times at once (``pipeline.free_sends_finish``)."""
    p, m = len(passes[0]), num_microbatches
    if m > LONG:
        return tuple(simulate_deepspeed_pipeline(f, b, 0.0, m).finish for f, b in (passes, compute))
    durs = [[x for i in range(p) for x in (f[i], b[i], 0.0, 0.0)] for f, b in (passes, compute)]
    kinds, first, second, last = _flat(p, m)
    end_a, end_b = ends_of_two(kinds, first, second, *durs)
    return tuple(end_a[n] for n in last), tuple(end_b[n] for n in last)


@functools.lru_cache(maxsize=64)
def _levels(p: int, m: int):
    """_graph in levels (``schedule.graph``) and each stage's last node."""
    kinds, first, second, last = _flat(p, m)
    levels, rows = graph_levels(kinds, first, second)
    return levels, last, rows


def deepspeed_finish(p: int, m: int, dur):
    """Each stage's finish time for many plans of one shape (``p`` stages, ``m``
    micro-batches) at once: ``dur`` is an array of shape (4 p, plans) indexed as in
    ``simulate_deepspeed_pipeline`` (stage * 4 + forward, backward, activation send, gradient
    send). Returns an array of shape (p, plans), equal to the simulation's finish times."""
    import numpy as np

    if m > LONG:  # each plan on its own, extrapolated from its steady state
        columns = [_finish_of(p, m, dur[:, j]) for j in range(dur.shape[1])]
        return np.asarray(columns).T
    levels, last, rows = _levels(p, m)
    return graph_ends(levels, rows, dur, list(last))
