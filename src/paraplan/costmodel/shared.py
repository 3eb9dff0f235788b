"""One object per catalog GPU or cluster, shared by every cost model built on it: the GPU with a
kernel's attention curve, the pricers that memoise what an operator or a collective costs there.

Catalog objects are immutable (frozen models), so what is derived from one alone stays true
while it lives. Entries are keyed by the object's identity and hold the object, so that its id
cannot be reused while the entry exists; a different GPU or cluster, even an equal one, gets its
own entry, and nothing leaks from one to another. Each maker keeps its own entries, at most 64:
the 65th owner clears all of that maker's entries. Owners made on the fly therefore take a maker
of their own: a heterogeneous cluster's views have the collective pricers' (not the GPUs'), and
the GPU copies a calibration fit makes, one per trial spec, have ``roofline._BurstPricer``
(``estimate_op_s``), so they never clear the cost models' ``_Pricer`` entries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_LIMIT = 64  # entries kept per maker at most: all of its entries are dropped past it
_MADE: dict[Callable, dict[tuple, tuple[object, object]]] = {}


def one_per(make: Callable[..., T], owner: object, *args: object) -> T:
    """``make(owner, *args)``, made once while ``owner`` lives (``args`` hashable)."""
    made = _MADE.setdefault(make, {})
    key = (id(owner), *args)
    hit = made.get(key)
    if hit is not None and hit[0] is owner:
        return hit[1]  # type: ignore[return-value]
    out = make(owner, *args)
    if len(made) >= _LIMIT:
        made.clear()
    made[key] = (owner, out)
    return out
