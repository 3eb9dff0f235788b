"""Time one callable: warm up on the same shape, then repeat until the spread is small.

Each sample times ``inner`` back-to-back calls (enough for a sample to last
:attr:`TimingPolicy.min_sample_s`, so a microsecond kernel is not lost in the clock's
overhead) and divides by ``inner``. Samples are taken until their spread, the interquartile
range over the median, is at most :attr:`TimingPolicy.target_spread`, or the repeat or time
budget runs out; the median is the time recorded. On CUDA each sample is bracketed by CUDA
events (the GPU's own clock, after a synchronize); on the CPU by ``time.perf_counter``.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Timing", "TimingPolicy", "measure"]


@dataclass(frozen=True)
class TimingPolicy:
    warmup: int = 3  # calls before timing (at least), on the point's own shape
    warmup_s: float = 0.02  # ... and at least this long
    min_repeats: int = 5
    max_repeats: int = 50
    target_spread: float = 0.05  # IQR / median
    min_sample_s: float = 2e-4  # a sample's calls last at least this long
    max_inner: int = 1000
    budget_s: float = 1.0  # time one phase of one point for at most this long (after warm-up)


@dataclass(frozen=True)
class Timing:
    median_s: float
    spread: float  # interquartile range / median
    repeats: int
    inner: int  # calls per sample
    converged: bool  # spread <= the target


def _spread(samples: list[float]) -> float:
    if len(samples) < 4:
        return math.inf
    q = statistics.quantiles(samples, n=4, method="inclusive")
    med = statistics.median(samples)
    return (q[2] - q[0]) / med if med > 0 else math.inf


def _clock(device: str) -> Callable[[Callable[[], Any], int], float]:
    """``clock(fn, n)``: seconds ``n`` calls of ``fn`` take on ``device``."""
    if device.startswith("cuda"):
        import torch

        def cuda(fn: Callable[[], Any], n: int) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3

        return cuda

    def cpu(fn: Callable[[], Any], n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t0

    return cpu


def measure(fn: Callable[[], Any], device: str, policy: TimingPolicy | None = None) -> Timing:
    """The time of one call of ``fn`` on ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``)."""
    policy = policy or TimingPolicy()
    clock = _clock(device)
    calls, spent = 0, 0.0
    while calls < policy.warmup or spent < policy.warmup_s:
        spent += clock(fn, 1)
        calls += 1
        if calls >= 10 * policy.warmup and spent >= policy.warmup_s / 10:
            break
    single = max(spent / calls, 1e-9)
    inner = int(min(policy.max_inner, max(1, math.ceil(policy.min_sample_s / single))))
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < policy.max_repeats:
        samples.append(clock(fn, inner) / inner)
        if len(samples) >= policy.min_repeats:
            if _spread(samples) <= policy.target_spread or time.perf_counter() - start > policy.budget_s:
                break
    spread = _spread(samples)
    return Timing(statistics.median(samples), spread, len(samples), inner, spread <= policy.target_spread)
