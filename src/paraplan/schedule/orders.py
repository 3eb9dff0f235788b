"""The order in which each pipeline stage issues its tasks, and where each chunk lives.

A task is ``(kind, chunk, micro-batch)`` with kind ``F`` (forward), ``B`` (backward: the
whole backward, or only the input gradient in a zero-bubble schedule) or ``W`` (the weight
gradient, zero-bubble schedules only). A model of ``p`` stages and ``v`` chunks per stage has
``p v`` virtual stages; micro-batches flow forward through them in order and back in reverse.

- GPipe: all forwards, then all backwards.
- 1F1B and interleaved 1F1B: Megatron-LM's ``forward_backward_pipelining_*`` (warm-up
  forwards, one forward one backward, cool-down backwards); chunk ``c`` of stage ``i`` is
  virtual stage ``c p + i``.
- ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv 2401.10241, Section 2.1,
  Figure 3 top): 1F1B's warm-up (p - i - 1 forwards on stage i) and its F, B steady state,
  with stage i's W passes lagging its B passes by i micro-batches, so that every stage holds p
  micro-batches and the delayed W passes fill the cool-down (PyTorch's
  ``_get_1f1b_rank_ops(..., num_1f1b_microbatches=rank, enable_zero_bubble=True)`` with one
  chunk per rank issues the same order).
- ZB-V (ibid. Section 6; PyTorch's ``ScheduleZBVZeroBubble._calculate_single_rank_operations``,
  torchtitan's ``ZBVZeroBubble``): two chunks per stage in a V, chunk 0 of stage i is virtual
  stage i and chunk 1 is virtual stage 2p - 1 - i, so the last stage holds the two middle
  virtual stages and stage 0 holds both ends of the model.
"""

from __future__ import annotations

from paraplan.specs import Schedule

F, B, W = 0, 1, 2

Order = list[tuple[int, int, int]]


def placement(schedule: Schedule, p: int, v: int) -> list[tuple[int, int]]:
    """(stage, chunk) of each virtual stage, in model order."""
    out = [(0, 0)] * (p * v)
    for i in range(p):
        for c in range(v):
            out[schedule.virtual_stage(p, i, c)] = (i, c)
    return out


def stage_order(schedule: Schedule, stage: int, p: int, m: int, v: int) -> Order:
    """The tasks stage ``stage`` issues, in order."""
    if schedule is Schedule.GPIPE:
        return [(F, 0, j) for j in range(m)] + [(B, 0, j) for j in range(m)]
    if schedule is Schedule.ZB_H1:
        return _zb_h1(stage, p, m)
    if schedule is Schedule.ZB_V:
        return _zb_v(stage, p, m)
    return _one_f_one_b(stage, p, m, v)


def _one_f_one_b(stage: int, p: int, m: int, v: int) -> Order:
    total = m * v

    def fwd(k: int) -> tuple[int, int, int]:
        return F, (k // p) % v, (k // (p * v)) * p + k % p

    def bwd(k: int) -> tuple[int, int, int]:
        return B, v - 1 - (k // p) % v, (k // (p * v)) * p + k % p

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


def _zb_h1(stage: int, p: int, m: int) -> Order:
    warmup = min(p - stage - 1, m)
    order: Order = [(F, 0, j) for j in range(warmup)]
    done_w = 0
    for k in range(m):
        if warmup + k < m:
            order.append((F, 0, warmup + k))
        order.append((B, 0, k))
        if k >= stage:  # stage i lets its W passes lag i micro-batches behind its B passes
            order.append((W, 0, done_w))
            done_w += 1
    order += [(W, 0, j) for j in range(done_w, m)]
    return order


def _zb_v(stage: int, p: int, m: int) -> Order:
    """ScheduleZBVZeroBubble's order for one rank; with fewer than 2p - 1 micro-batches the
    order of 2p - 1 is issued without the missing ones, as PyTorch does."""
    n = max(2 * p - 1, m)
    order: Order = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (p - stage) - 1):
        order.append((F, 0, f0))
        f0 += 1
    for _ in range(stage):
        order += [(F, 1, f1), (F, 0, f0)]
        f1 += 1
        f0 += 1
    for _ in range(p - stage):
        order += [(F, 1, f1), (B, 1, b1), (W, 1, b1)]
        f1 += 1
        b1 += 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            order.append((F, 0, f0))
            f0 += 1
        order += [(B, 0, b0), (W, 0, b0), (F, 1, f1), (B, 1, b1), (W, 1, b1)]
        f1 += 1
        b0 += 1
        b1 += 1
    w0, w1 = b0, b1
    for _ in range(stage):
        order += [(B, 0, b0), (B, 1, b1)]
        b0 += 1
        b1 += 1
    for _ in range(p - stage):
        order += [(B, 0, b0), (W, 0, w0)]
        b0 += 1
        w0 += 1
    order += [(W, 1, j) for j in range(w1, b1)]
    order += [(W, 0, j) for j in range(w0, b0)]
    return [t for t in order if t[2] < m]


def peak_in_flight(schedule: Schedule, stage: int, p: int, m: int, v: int) -> float:
    """Most micro-batches whose activations stage ``stage`` holds at once (in units of its
    whole layer stack: a chunk counts 1/v), counting a micro-batch from its forward until its
    last backward task on that chunk (W when the schedule defers it: the weight gradient
    needs the saved inputs of the layer's GEMMs; the whole micro-batch is counted, an upper
    bound)."""
    held = peak = 0
    for kind, _, _ in stage_order(schedule, stage, p, m, v):
        if kind == F:
            held += 1
            peak = max(peak, held)
        elif kind == W or not schedule.splits_backward:
            held -= 1
    return peak / v
