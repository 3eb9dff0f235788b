"""Error statistics of validated runs, per group (source, GPU): signed bias and spread."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from paraplan.validate.result import RunValidation


@dataclass(frozen=True, slots=True)
class ErrorStats:
    """How far predictions are from measurements for ``n`` runs (relative errors:
    (predicted - measured) / measured, so negative means predicted too fast)."""

    group: str
    n: int
    signed_median: float
    median_abs: float
    p90_abs: float
    mean_abs: float
    worst: float  # the signed error of largest magnitude


def _percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    position = (len(sorted_values) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def error_stats(group: str, errors: Iterable[float]) -> ErrorStats:
    values = list(errors)
    if not values:
        raise ValueError(f"{group}: no runs")
    absolute = sorted(abs(e) for e in values)
    return ErrorStats(
        group=group,
        n=len(values),
        signed_median=statistics.median(values),
        median_abs=statistics.median(absolute),
        p90_abs=_percentile(absolute, 0.9),
        mean_abs=statistics.fmean(absolute),
        worst=max(values, key=abs),
    )


def grouped_stats(
    results: Iterable[RunValidation], key: Callable[[RunValidation], str]
) -> list[ErrorStats]:
    """One ``ErrorStats`` per value of ``key`` (in first-seen order)."""
    groups: dict[str, list[float]] = {}
    for r in results:
        groups.setdefault(key(r), []).append(r.error)
    return [error_stats(name, errors) for name, errors in groups.items()]
