"""Many identical micro-batches: a schedule's steady state, so that cost stays flat in m.

Once its warm-up is over, a pipeline schedule with fixed stage times repeats itself: every
``c`` micro-batches (the cyclicity, often 1, a few when stages of unequal speed take turns
at being the bottleneck) every stage finishes ``c`` micro-batches' worth of seconds later.
``extrapolate`` simulates ``SIMULATED`` micro-batches once, reads the cyclicity and the
increment off the middle of that run (when stage 0 finished each micro-batch: the whole
middle half must repeat exactly, so a long transient is not mistaken for the steady state),
and extends to m the finish times of two more short runs a cycle apart, aligned with m's
remainder (GPipe's forward and backward phases each grow linearly, so this holds there too).
It returns None (the caller simulates every task) when m is short or no cycle shows up.

What it cannot see is a drift that begins after the simulated run: when a schedule's two
slowest cycles of dependencies differ by a small rate, the slower one can take hundreds of
micro-batches to use up the warm-up's slack and set the pace. The extrapolation is then
slightly fast (hypothesis found 1.7e-5 of the iteration with 1,024 simulated micro-batches;
repeating the last cycle of a run of 128, up to 1.1 %). Only the max-plus cycle mean of the
schedule's period graph (Karp) would give the eventual pace exactly; the search's task graphs
(``extrapolate_many``'s ``settle``) bound it instead: between that cycle repeated and the slowest
stage's pace, taking the middle where it is within ``DRIFT_BOUND`` (``drift_bracket``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

# Micro-batches beyond which a schedule is extrapolated instead of simulated task by task.
LONG = 2048
SIMULATED = 1024
#: The largest relative error a drift bracket's middle allows (``drift_bracket``; below the
#: search's 0.1 % between the screen and ``predict``).
DRIFT_BOUND = 1e-3


def extrapolate(
    run: Callable[[int], tuple[tuple[float, ...], Sequence[float]]], m: int, period: int
) -> tuple[float, ...] | None:
    """Each stage's finish time for ``m`` micro-batches. ``run(k)`` simulates ``k``
    micro-batches (k congruent to m modulo ``period``, which a schedule may require) and
    returns each stage's finish time and when stage 0 finished each micro-batch."""
    if m <= LONG:
        return None
    k = SIMULATED + (m - SIMULATED) % period
    _, marks = run(k)
    lo, hi = k // 4, 3 * k // 4
    for c in range(1, min(8 * period, (hi - lo) // 4) + 1):
        inc = marks[lo + c] - marks[lo]
        tol = 1e-9 * abs(inc)
        if inc > 0 and all(abs(marks[j + c] - marks[j] - inc) <= tol for j in range(lo, hi - c)):
            break
    else:
        return None
    c = c * period // math.gcd(c, period)  # a whole number of cycles that keeps m's remainder
    k += (m - k) % c
    start, _ = run(k)
    then, _ = run(k + c)
    cycles = (m - k) // c
    return tuple(a + cycles * (b - a) for a, b in zip(start, then, strict=True))


def extrapolate_many(run, m: int, period: int, k: int, n: int, settle=None):
    """``extrapolate`` for ``n`` plans of one shape at once, from short runs of about ``k``
    micro-batches: ``run(k, sel)`` returns, for the plans of the boolean mask ``sel``, each
    stage's finish time (stages, plans) and when stage 0 finished each micro-batch (k, plans).
    Returns (each stage's finish for ``m`` micro-batches, (stages, n); a mask of the plans
    with no cycle in the middle half of the short run, whose finish is NaN: the caller runs
    them in full). With ``settle(sel, start, then, whole)`` (the finish at k' >= k micro-batches
    and ``whole`` more, for the plans of ``sel``), the finish at m is what it returns, where its
    mask keeps it, instead of the repeat of that last cycle; the others are run in full."""
    import numpy as np

    k += (m - k) % period
    every = np.ones(n, dtype=bool)
    _, marks = run(k, every)
    lo, hi = k // 4, 3 * k // 4
    cycle = np.zeros(n, dtype=np.int64)
    for c in range(1, min(8 * period, (hi - lo) // 4) + 1):
        inc = marks[lo + c] - marks[lo]
        steps = marks[lo + c:hi] - marks[lo:hi - c]
        found = (cycle == 0) & (inc > 0) & np.all(np.abs(steps - inc) <= 1e-9 * np.abs(inc), axis=0)
        cycle[found] = c
    out = None
    for c in np.unique(cycle[cycle > 0]).tolist():
        sel = cycle == c
        whole = c * period // math.gcd(c, period)  # a whole number of cycles that keeps m's remainder
        k_c = k + (m - k) % whole
        if k_c > m:  # m is too short for this cycle: run in full
            cycle[sel] = 0
            continue
        start, _ = run(k_c, sel)
        then, _ = run(k_c + whole, sel)
        if out is None:
            out = np.full((start.shape[0], n), np.nan)
        if settle is None:
            out[:, sel] = start + (m - k_c) // whole * (then - start)
            continue
        done, keep = settle(sel, start, then, whole, m - k_c)
        at = np.flatnonzero(sel)
        out[:, at[keep]] = done[:, keep]
        cycle[at[~keep]] = 0
    return out, cycle == 0


def drift_bracket(p: int, v: int, top, before, dur, periods):
    """Each stage's finish (p, plans) of plans ``periods`` periods of p micro-batches past a run
    of k whose columns (``dur``: each plan's, rows as ``pipeline.task_durations``) may still
    drift, from their finish at k (``top``) and at k - p (``before``), and which of them to
    keep: (finish, mask).

    Where a slower stage takes over the pace only as the lead the warm-up gave the others is
    used up, each period of p micro-batches takes longer than the last (as Megatron-LM's 1F1B,
    ``one_f_one_b.one_f_one_b_finish``). Past the run the finish lies between the run's last
    period repeated (the chord) and the slowest stage's busy time per period (its forwards,
    backwards and weight gradients, held sends included, of p micro-batches on every chunk); the
    middle of that bracket is taken where its half-width is within ``DRIFT_BOUND`` (0.1 %) and
    the chord does not exceed the pace, the rest take a longer run. Not proven as a repeat is:
    checked against ``simulate_pipeline`` by tests (interleaved 1F1B, the zero-bubble schedules,
    1F1B with asynchronous sends)."""
    import numpy as np

    chord = top - before
    work = dur[:3 * p * v].reshape(p, v * 3, dur.shape[1]).sum(axis=1)
    pace = p * work.max(axis=0)
    low = top + periods * chord
    high = top + periods * pace
    narrow = np.all(chord <= pace * (1 + 1e-12), axis=0) & np.all(high - low <= 2 * DRIFT_BOUND * low, axis=0)
    return (low + high) / 2, narrow
