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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

# Micro-batches beyond which a schedule is extrapolated instead of simulated task by task.
LONG = 2048
SIMULATED = 1024


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
