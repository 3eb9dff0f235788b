"""The Pareto front of plans: no other plan is both faster and cheaper."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def pareto_front(items: Sequence[T], time: Callable[[T], float], cost: Callable[[T], float]) -> list[T]:
    """The items not dominated in (time, cost), both minimised, sorted by time.

    An item is dominated when another is no slower and no dearer, and strictly better in one.
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
