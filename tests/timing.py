"""Timing bounds as ratios measured in the same run, never absolute seconds (a machine shared by
other jobs runs everything slower, but it slows a test and its reference alike).

A bound says "this costs no more than ``factor`` times that", where "that" is a reference the
same test measures next to it: the same work on a small input (for a claim about scaling), or the
ordinary path the hostile input must not be much slower than. Each is timed ``repeat`` times,
interleaved (a, b, a, b, ...) so a load that comes and goes falls on both, and the fastest run of
each is compared: the minimum leaves out the runs the machine interrupted.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def best_times(*fns: Callable[[], object], repeat: int = 5) -> list[float]:
    """The fastest of ``repeat`` interleaved runs of each of ``fns``, in seconds."""
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def assert_no_slower(fn: Callable[[], object], reference: Callable[[], object], factor: float,
                     repeat: int = 5) -> tuple[float, float]:
    """``fn`` takes at most ``factor`` times as long as ``reference`` (best of ``repeat`` each);
    returns both times."""
    took, ref = best_times(fn, reference, repeat=repeat)
    assert took <= factor * ref, f"{took:.4f} s is {took / ref:.1f} x the reference's {ref:.4f} s (bound: {factor} x)"
    return took, ref
