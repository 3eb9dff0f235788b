"""Pipeline finish times and in-flight micro-batches for many plans at once, per stage class.

The search's screen (``search.screen``) costs a whole space of plans as numpy arrays. Every
plan's stages fall in three classes, stage 0 (the embedding), the middle stages (all equal)
and the last stage (the LM head), so a plan's pipeline is given by each class's forward ``f``,
backward ``b`` and (zero-bubble schedules) weight-gradient ``w`` seconds per micro-batch, as
dicts from class to arrays over plans, and its send times. The simulators beside this module
(``schedule.pipeline``, ``schedule.deepspeed``) are the exact reference:

- Megatron-LM's 1F1B takes ``schedule.one_f_one_b``: a proven closed form where the last stage
  paces the pipeline, else runs of its task graph shared by every m: equal to ``predict`` up to
  8 ``periodic_short(p)`` micro-batches and past them where the steady state repeats, else
  within 0.1 % (``DRIFT_BOUND``); the closed form below stays for pp = 1;
- interleaved 1F1B takes its task graph (``schedule.interleaved_runs.interleaved_finish``), its
  sends held by the sending stage or, with overlap_p2p_comm, each an arrival delay: one run
  per (p, v) and duration column serves every m, past it the run's repeat where proven (equal
  to ``predict``), else the middle of a drift bracket within ``DRIFT_BOUND``, else a longer run;
- GPipe takes a closed form that is exact (two flow shops), and pp = 1 its sum; the closed
  forms ``(m + p - 1)(f + b)`` for 1F1B and ``m (f + b) + (p - 1)(f + b) / v`` interleaved,
  exact for equal stages without sends, generalised to the unequal first and last stages and
  the blocking sends (``_closed_form_finish``), are replaced by the task graphs where pp > 1;
- the zero-bubble schedules (ZB-H1, ZB-V) and DeepSpeed's TrainSchedule have no closed form
  that holds once the last stage carries the LM head: their task graphs are evaluated for all
  plans of a (schedule, pp, micro-batches) shape at once, equal to the simulation (zero-bubble
  past ``batched_short(p) + 2 p`` micro-batches: the middle of a drift bracket within
  ``DRIFT_BOUND``, else the whole graph; ``pipeline.pipeline_finish``).

``in_flight`` is ``prediction.memory``'s micro-batches in flight per stage, in closed form
(``schedule.peak_in_flight`` counts them from the orders).
"""

from __future__ import annotations

import numpy as np

from paraplan.schedule.deepspeed import deepspeed_finish
from paraplan.schedule.interleaved_runs import interleaved_finish
from paraplan.schedule.one_f_one_b import distinct_columns, one_f_one_b_finish
from paraplan.schedule.pipeline import pipeline_finish, task_durations
from paraplan.specs import Schedule

#: A plan's schedule as an integer code (its index here) in the screen's plan arrays.
SCHEDULES = tuple(Schedule)  # a plan's schedule code is its index here
FIRST, MID, LAST = 0, 1, 2  # stage classes: stage 0, stage 1 (middle), stage pp - 1


def runs(sched, *schedules: Schedule):
    """Which plans (schedule codes ``sched``) run one of ``schedules`` (none: no plan)."""
    return np.isin(sched, [SCHEDULES.index(schedule) for schedule in schedules])


def runs_where(sched, prop: str):
    """Which plans (schedule codes ``sched``) run a schedule with the property ``prop`` (a
    ``Schedule`` property such as ``splits_backward``): the screen asks for properties, never names."""
    return runs(sched, *(schedule for schedule in SCHEDULES if getattr(schedule, prop)))


def chunks_per_stage(sched, vpp):
    """Model chunks per stage of each plan that the closed forms see (``v``): vpp for the
    interleaved schedule, else 1 (ZB-V's two chunks are its task graph's own)."""
    return np.where(runs_where(sched, "uses_vpp"), np.maximum(vpp, 1), 1).astype(np.float64)


def stage_in_flight(schedule: Schedule, stage, p, m, vpp):
    """Micro-batches whose activations stage ``stage`` of ``p`` holds at its peak under
    ``schedule``, in units of its whole layer stack (interleaving holds more, smaller chunks
    of ``vpp``), for ``m`` micro-batches: numbers or numpy arrays. ``prediction.memory`` calls
    it for one stage of a plan, the screen for a stage class of many plans; it equals
    ``schedule.peak_in_flight``, counted on the schedule's order (a test checks). ZB-H1 holds
    min(p, m) on every stage (stage i defers i W passes, each keeping its micro-batch's
    activations: an upper bound, the W pass needs only its GEMMs' inputs), the same peak as
    1F1B's stage 0; ZB-V min(2p, m + min(m, i + 1)) half-stage chunks, at most p micro-batches,
    also 1F1B's peak (Qi et al. 2023, Sections 2.1 and 6)."""
    if schedule is Schedule.GPIPE:
        return m
    if schedule is Schedule.INTERLEAVED:
        return np.minimum((p - stage - 1) * 2 + (vpp - 1) * p + 1, m * vpp) / vpp
    if schedule is Schedule.ZB_H1:
        return np.minimum(p, m)
    if schedule is Schedule.ZB_V:
        return np.minimum(2 * p, m + np.minimum(m, stage + 1)) / 2
    return np.minimum(p - stage, m)


def paired_share(schedule: Schedule, p, m, vpp):
    """Share of a stage's forward passes (and as many backward passes) that Megatron-Core's
    --overlap-moe-expert-parallel-comm runs as a pair, one micro-batch's forward beside another's
    backward (``combined_1f1b``), for ``m`` micro-batches on ``p`` stages of ``vpp`` chunks:
    numbers or numpy arrays. The pairs are the schedule's steady 1F1B steps; the warmup's
    forwards and the cooldown's backwards run alone and their all-to-alls stay exposed.

    - pp = 1 (``combined_1f1b_schedule_for_no_pipelining``): the first micro-batch's forward and
      the last one's backward run alone, m - 1 pairs;
    - interleaved (``forward_backward_pipelining_with_interleaving``): of the m vpp chunk passes,
      rank r runs 2 (p - r - 1) + (vpp - 1) p + 1 forwards first (``get_pp_rank_microbatches``:
      the usual warmup with a micro-batch group of p, plus one so that every pair's forward and
      backward are independent), as many backwards last; the mean over the ranks, p - 1 +
      (vpp - 1) p + 1, is taken for every stage;
    - any other schedule with pp > 1 (Megatron-LM's plain 1F1B never calls the combined step,
      and its config asserts vpp when pp > 1): no pairs.

    Source: NVIDIA/Megatron-LM megatron/core/pipeline_parallel/combined_1f1b.py @ 00caa53,
    schedules.py ``get_pp_rank_microbatches`` @ 00611e6."""
    p = np.asarray(p, dtype=np.float64)
    m = np.asarray(m, dtype=np.float64)
    if schedule is Schedule.INTERLEAVED:
        total = m * vpp
        alone = np.minimum(p - 1 + (vpp - 1) * p + 1, total)
    else:
        total, alone = m, np.where(p == 1, np.minimum(1.0, m), m)
    share = np.where(total > 0, (total - alone) / np.maximum(total, 1.0), 0.0)
    return float(share) if share.ndim == 0 else share


def paired_shares(p, m, v, sched):
    """``paired_share`` per plan, ``sched`` the plans' schedule codes and ``v`` their
    ``chunks_per_stage``."""
    share = np.zeros(len(sched))
    for code in np.unique(sched).tolist():
        share = np.where(sched == code, paired_share(SCHEDULES[code], p, m, v), share)
    return share


def in_flight(c: int, p, m, v, sched):
    """``stage_in_flight`` of stage class ``c`` (stage 0, 1 or p - 1) per plan, ``sched`` the
    plans' schedule codes and ``v`` their ``chunks_per_stage``. Stage 1 holds the most of the
    middle stages except under ZB-V, whose later stages hold more, but never more than its
    last stage, so the worst stage is the same."""
    stage = np.where(c == LAST, p - 1, float(c))
    flight = np.zeros(len(sched))
    for code in np.unique(sched).tolist():
        flight = np.where(sched == code, stage_in_flight(SCHEDULES[code], stage, p, m, v), flight)
    return flight


def finish_by_class(f, b, w, x, xf, pp, m, v, sched, lockstep: bool = False, overlap_p2p=None):
    """When stage 0, the middle stages (the latest of them) and the last stage finish their
    last task, per plan: ``f``, ``b`` and ``w`` dicts from class to arrays (``w`` is read for
    the zero-bubble plans only), ``x`` a backward send, ``xf`` a forward send (with
    DeepSpeed's attention mask), ``pp``, ``m`` and ``v`` (``chunks_per_stage``) arrays and
    ``sched`` the schedule codes; ``lockstep``: the 1F1B plans run DeepSpeed's TrainSchedule;
    ``overlap_p2p`` (a boolean array, or None: none): the plans whose sends are asynchronous
    (Megatron-LM's overlap_p2p_comm), timed by their task graph with each send an arrival delay."""
    p = pp.astype(np.float64)
    finish = _closed_form_finish(f, b, x, m, p, v, runs_where(sched, "forwards_all_first"), xf)
    zero_bubble = runs_where(sched, "splits_backward") & (pp > 1)
    if zero_bubble.any():
        _zero_bubble_finish(finish, f, b, w, x, xf, pp, m, sched, zero_bubble)
    one_f_one_b = runs(sched, Schedule.ONE_F_ONE_B) & (pp > 1)
    if lockstep:  # DeepSpeed's 1F1B: its step graph, evaluated exactly for each shape
        _lockstep_finish(finish, f, b, x, xf, pp, m, one_f_one_b)
    elif one_f_one_b.any():  # Megatron-LM's 1F1B: its task graph, periodic past a short run
        _one_f_one_b_finish(finish, f, b, x, xf, pp, m, one_f_one_b)
    asynchronous = (pp > 1) & (False if overlap_p2p is None else overlap_p2p)
    if asynchronous.any():  # Megatron-LM's overlap_p2p_comm: each send an arrival delay
        _interleaved_finish(finish, f, b, x, xf, pp, m, v, asynchronous, asynchronous=True)
    if (blocking := runs(sched, Schedule.INTERLEAVED) & (pp > 1) & ~asynchronous).any():  # sends hold their stage
        _interleaved_finish(finish, f, b, x, xf, pp, m, v, blocking, asynchronous=False)
    return finish


def _interleaved_finish(finish, f, b, x, xf, pp, m, v, which, asynchronous: bool) -> None:
    """Replace ``finish`` of the interleaved plans in ``which`` with their task graph
    (``schedule.interleaved_runs.interleaved_finish``), evaluated for all plans of a (pp, chunks)
    shape at once whatever their micro-batches, for the distinct columns of class times and
    sends. ``asynchronous`` (Megatron-LM's overlap_p2p_comm): a send holds no stage, the task
    waiting for it starts one transfer after its input's task ends (``arrival``), as
    ``simulate_pipeline`` with ``overlap_p2p`` times it; else each send holds its stage."""
    idx = np.flatnonzero(which)
    shapes = np.stack([pp[idx], v[idx].astype(np.int64)])
    for p, chunks in np.unique(shapes, axis=1).T.tolist():
        sel = idx[(shapes[0] == p) & (shapes[1] == chunks)]
        key = np.stack([f[FIRST][sel], f[MID][sel], f[LAST][sel], b[FIRST][sel], b[MID][sel], b[LAST][sel],
                        x[sel], xf[sel]])
        kept, column = distinct_columns(key)
        key = key[:, kept]
        stages = [FIRST if i == 0 else LAST if i == p - 1 else MID for i in range(p)]
        none = np.zeros(len(kept))
        held = 0.0 if asynchronous else 1.0
        dur = task_durations(Schedule.INTERLEAVED, p, chunks, [key[c] for c in stages],
                             [key[3 + c] for c in stages], [none] * p, held * key[6], held * key[7])
        dur = np.asarray([np.broadcast_to(d, none.shape) for d in dur], dtype=np.float64)
        done = interleaved_finish(p, chunks, m[sel].astype(np.int64), dur, column,
                                  key[[7, 6]] if asynchronous else None)
        finish[FIRST][sel] = done[0]
        finish[LAST][sel] = done[p - 1]
        if p > 2:
            finish[MID][sel] = done[1:p - 1].max(axis=0)


def _one_f_one_b_finish(finish, f, b, x, xf, pp, m, which) -> None:
    """Replace ``finish`` of the Megatron-LM 1F1B plans in ``which`` with their task graph
    (``schedule.one_f_one_b.one_f_one_b_finish``), evaluated for all plans of a pipeline depth
    at once whatever their micro-batches, each stage costed as its class (stage 0, middle,
    last): plans with the same class times and sends share a column of durations."""
    idx = np.flatnonzero(which)
    for p in np.unique(pp[idx]).tolist():
        sel = idx[pp[idx] == p]
        key = np.stack([f[FIRST][sel], f[MID][sel], f[LAST][sel], b[FIRST][sel], b[MID][sel], b[LAST][sel],
                        x[sel], xf[sel]])
        kept, column = distinct_columns(key)
        key = key[:, kept]
        stages = [FIRST if i == 0 else LAST if i == p - 1 else MID for i in range(p)]
        dur = task_durations(Schedule.ONE_F_ONE_B, p, 1, [key[c] for c in stages], [key[3 + c] for c in stages],
                             [np.zeros(len(kept))] * p, key[6], key[7])
        done = one_f_one_b_finish(p, m[sel].astype(np.int64), np.asarray(dur, dtype=np.float64), column)
        finish[FIRST][sel] = done[0]
        finish[LAST][sel] = done[p - 1]
        if p > 2:
            finish[MID][sel] = done[1:p - 1].max(axis=0)


def _lockstep_finish(finish, f, b, x, xf, pp, m, which) -> None:
    """Replace ``finish`` of the plans in ``which`` with DeepSpeed's TrainSchedule
    (``schedule.deepspeed``): the step graph of each (pp, micro-batches) shape evaluated once
    for all of its plans, each stage costed as its class (stage 0, middle, last)."""
    idx = np.flatnonzero(which)
    if len(idx) == 0:
        return
    shapes = np.stack([pp[idx], m[idx].astype(np.int64)])
    for p, mb in np.unique(shapes, axis=1).T.tolist():
        sel = idx[(shapes[0] == p) & (shapes[1] == mb)]
        dur = np.empty((4 * p, len(sel)))
        for stage in range(p):
            c = FIRST if stage == 0 else LAST if stage == p - 1 else MID
            dur[4 * stage] = f[c][sel]
            dur[4 * stage + 1] = b[c][sel]
            dur[4 * stage + 2] = xf[sel]
            dur[4 * stage + 3] = x[sel]
        done = deepspeed_finish(p, mb, dur)
        finish[FIRST][sel] = done[0]
        finish[LAST][sel] = done[p - 1]
        if p > 2:
            finish[MID][sel] = done[1:p - 1].max(axis=0)


def _zero_bubble_finish(finish, f, b, w, x, xf, pp, m, sched, which) -> None:
    """Replace ``finish`` of the zero-bubble plans in ``which`` with their task graph
    (``schedule.pipeline_finish``) evaluated for all plans of a (schedule, pp, micro-batches)
    shape at once, each stage costed as its class (stage 0, middle, last): equal to
    ``predict``'s simulation. (No closed form is exact once the last stage carries the LM
    head: Qi et al.'s m (F + B + W) + (p - 1)(F + B - W) charges the slowest stage's bubble
    p - 1 times, 16 % too slow for llama-3-8b on 8 stages.)"""
    idx = np.flatnonzero(which)
    if len(idx) == 0:
        return
    shapes = np.stack([sched[idx], pp[idx], m[idx].astype(np.int64)])
    for code, p, mb in np.unique(shapes, axis=1).T.tolist():
        sel = idx[(shapes[0] == code) & (shapes[1] == p) & (shapes[2] == mb)]
        schedule = SCHEDULES[code]
        stages = [FIRST if i == 0 else LAST if i == p - 1 else MID for i in range(p)]
        dur = task_durations(schedule, p, schedule.chunks(1), [f[c][sel] for c in stages],
                             [b[c][sel] for c in stages], [w[c][sel] for c in stages], x[sel], xf[sel])
        done = pipeline_finish(schedule, p, mb, schedule.chunks(1), np.asarray(dur))
        finish[FIRST][sel] = done[0]
        finish[LAST][sel] = done[p - 1]
        if p > 2:
            finish[MID][sel] = done[1:p - 1].max(axis=0)


def _closed_form_finish(f, b, x, m, p, v, gpipe, xf):
    """When stage 0, stage 1 and the last stage finish their last task, from each class's
    forward ``f`` and backward ``b`` seconds per micro-batch and the send times: ``xf``
    forward (with DeepSpeed's attention mask), ``x`` backward.

    A task holds its stage for its compute and its blocking send (none out of the model's
    ends), as in ``schedule.simulate_pipeline``. GPipe is two flow shops of identical jobs:
    forwards end at sum(F) + (m - 1) max(F), backwards from the last stage down to stage i add
    sum(B[i:]) + (m - 1) max(B[i:]) (exact). 1F1B and interleaved: every stage's work once plus
    m v - 1 chunk-periods of the slowest stage; a stage finishes when the last backward has
    yet to cross the stages before it. Exact for equal stages without sends; with unequal
    ends and sends it is an estimate (the search's shortlist absorbs the difference).
    """
    mid = p - 2  # middle stages (all equal)
    has_mid = mid > 0
    one = p == 1
    Fs = {FIRST: f[FIRST] + xf, MID: f[MID] + xf, LAST: f[LAST]}
    Bs = {FIRST: b[FIRST], MID: b[MID] + x, LAST: b[LAST] + x}
    neg = -np.inf
    # GPipe
    f_max = np.maximum(np.maximum(Fs[FIRST], Fs[LAST]), np.where(has_mid, Fs[MID], neg))
    t_fwd = Fs[FIRST] + mid * Fs[MID] + Fs[LAST] + (m - 1) * f_max
    max_from_mid = np.where(has_mid, np.maximum(Bs[MID], Bs[LAST]), Bs[LAST])
    g = {
        LAST: t_fwd + m * Bs[LAST],
        MID: t_fwd + mid * Bs[MID] + Bs[LAST] + (m - 1) * max_from_mid,
        FIRST: t_fwd + Bs[FIRST] + mid * Bs[MID] + Bs[LAST] + (m - 1) * np.maximum(max_from_mid, Bs[FIRST]),
    }
    # 1F1B (v = 1) and interleaved: per micro-batch and stage, compute plus 2v - 1 or 2v sends
    s = {
        FIRST: f[FIRST] + b[FIRST] + v * xf + (v - 1) * x,
        MID: f[MID] + b[MID] + v * (xf + x),
        LAST: f[LAST] + b[LAST] + (v - 1) * xf + v * x,
    }
    s_max = np.maximum(np.maximum(s[FIRST], s[LAST]), np.where(has_mid, s[MID], neg))
    t = (s[FIRST] + mid * s[MID] + s[LAST]) / v + (m - 1 / v) * s_max
    b0 = b[FIRST] / v
    k = {FIRST: t, MID: t - b0, LAST: t - b0 - mid * (b[MID] / v + x)}
    out = {}
    for c in (FIRST, MID, LAST):
        out[c] = np.where(gpipe, g[c], k[c])
    out[FIRST] = np.where(one, m * (f[FIRST] + b[FIRST]), out[FIRST])
    return out
