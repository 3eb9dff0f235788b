"""The Pareto front of plans: no other plan is both faster and cheaper (or smaller).

On one cluster at one size every plan costs the same per second, so its cost is proportional
to its time and the front of time against cost is the single fastest plan. Time against cost
is a front across cluster sizes and GPU types; on one cluster the trade-off is time against
memory per GPU (headroom, or room for a longer sequence or a bigger micro-batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")

#: What the front trades time against: dollars (per token or to train), or memory per GPU.
PARETO_AXES = ("cost", "memory")


def pareto_front(items: Sequence[T], time: Callable[[T], float], cost: Callable[[T], float]) -> list[T]:
    """The items not dominated in (time, cost), both minimised, sorted by time.

    An item is dominated when another is no slower and no dearer, and strictly better in one;
    of items equal in both, the first is kept.
    """
    ordered = sorted(items, key=lambda it: (time(it), cost(it)))
    front: list[T] = []
    best_cost = float("inf")
    for it in ordered:
        c = cost(it)
        if c < best_cost:
            front.append(it)
            best_cost = c
    return front


def near_front(time: np.ndarray, other: np.ndarray, slack: float, other_slack: float = 0.0) -> np.ndarray:
    """Indices (ascending) of the points that no other point beats by a margin: a point is left
    out when another is faster by more than ``slack`` (a fraction of its time) and smaller in
    ``other`` by at least ``other_slack`` (a fraction). With both zero: the front, with points
    of equal time kept; with a slack, a superset of the front of any times within ``slack`` of
    these (e.g. the exact times of screened plans)."""
    time, other = np.asarray(time, dtype=float), np.asarray(other, dtype=float)
    if len(time) == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(other, kind="stable")
    fastest_so_far = np.minimum.accumulate(time[order])
    # for each point, how many points are no larger in ``other`` than it less the margin
    below = np.searchsorted(other[order], other / (1.0 + other_slack), side="right")
    best = np.where(below > 0, fastest_so_far[np.maximum(below - 1, 0)], np.inf)
    return np.flatnonzero(~(best * (1.0 + slack) < time))
