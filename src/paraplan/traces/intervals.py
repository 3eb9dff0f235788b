"""Sets of time intervals as sorted lists of disjoint (start, end) pairs."""

from __future__ import annotations

from collections.abc import Iterable

Intervals = list[tuple[float, float]]


def union(pieces: Iterable[tuple[float, float]]) -> Intervals:
    out: Intervals = []
    for s, e in sorted(p for p in pieces if p[1] > p[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def length(a: Intervals) -> float:
    return sum(e - s for s, e in a)


def intersect(a: Intervals, b: Intervals) -> Intervals:
    out: Intervals = []
    i = j = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """The parts of `a` outside `b`."""
    out: Intervals = []
    j = 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k, cur = j, s
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def shares(sets: dict[str, Intervals]) -> dict[str, float]:
    """Each set's share of the union of all of them: an instant that k of the sets hold counts
    1/k to each, so the shares add up to the union's length and none exceeds its set's length.
    ``sets`` are each a union (sorted, disjoint)."""
    lengths = {name: length(a) for name, a in sets.items()}
    if len(sets) < 2:
        return lengths
    whole = length(union(p for a in sets.values() for p in a))
    if sum(lengths.values()) <= whole:
        return lengths  # no two sets overlap: each keeps its own length
    edges = sorted((t, opens, name) for name, a in sets.items() for s, e in a for t, opens in ((s, 1), (e, 0)))
    out = dict.fromkeys(sets, 0.0)
    active: set[str] = set()
    last = edges[0][0]
    for t, opens, name in edges:  # ends sort before starts at equal times
        if t > last and active:
            each = (t - last) / len(active)
            for a in active:
                out[a] += each
        last = t
        if opens:
            active.add(name)
        else:
            active.discard(name)
    return out
