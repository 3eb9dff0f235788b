"""One object per catalog GPU or cluster, shared by every cost model built on it: the GPU with a
kernel's attention curve, the pricers that memoise what an operator or a collective costs there.

Catalog objects are immutable (frozen models), so what is derived from one alone stays true
while it lives. Entries are keyed by the object's identity and hold the object, so that its id
cannot be reused while the entry exists; a different GPU or cluster, even an equal one, gets its
own entry, and nothing leaks from one to another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_LIMIT = 256  # entries kept at most: all are dropped past it (a long session of many catalogs)
_MADE: dict[tuple, tuple[object, object]] = {}


def one_per(make: Callable[..., T], owner: object, *args: object) -> T:
    """``make(owner, *args)``, made once while ``owner`` lives (``args`` hashable)."""
    key = (make, id(owner), *args)
    hit = _MADE.get(key)
    if hit is not None and hit[0] is owner:
        return hit[1]  # type: ignore[return-value]
    made = make(owner, *args)
    if len(_MADE) >= _LIMIT:
        _MADE.clear()
    _MADE[key] = (owner, made)
    return made
