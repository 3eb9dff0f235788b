"""A schedule's task graph evaluated for many plans of one shape at once.

A pipeline schedule of fixed shape (stages, micro-batches, chunks) is a graph whose nodes each
wait for at most two others (the stage's previous task and the task whose output it needs) and
then run for a duration. Sorting the nodes into levels (every node after all of its
predecessors' levels) turns the event simulation into one numpy step per level over a
(nodes, plans) array, so the search's screen times every plan of a shape exactly. The nodes
are renumbered in level order, so that a level is a slice of rows and its predecessors lie a
few rows back (``in_level_order``).
"""

from __future__ import annotations

import itertools


class Ordered:
    """A graph in level order as flat arrays over its rows 1.. (``level_order``): ``bounds``
    each level's first row and, last, the rows' end; each row's predecessors' rows (``a``,
    ``b``; 0: none), duration index and delay index (None: no delays); ``span`` the most rows
    a level reaches back over, from its earliest predecessor's row to its last row
    (``window_ends`` keeps that many)."""

    def __init__(self, bounds, a, b, kinds, delays):
        import numpy as np

        self.bounds, self.a, self.b, self.kinds, self.delays = bounds, a, b, kinds, delays
        last = np.repeat(bounds[1:] - 1, np.diff(bounds))  # each row's level's last row
        reach = np.minimum(np.where(a > 0, a, last), np.where(b > 0, b, last))  # its earliest predecessor's
        self.span = int((last - reach).max()) + 1 if len(a) else 1
        self.windows: dict = {}  # ``_window``'s plans

    def levels(self) -> tuple:
        """Cut into levels (``in_level_order``'s)."""
        a, b, kd, dl = self.a, self.b, self.kinds, self.delays
        return tuple((lo, hi, a[lo - 1:hi - 1], b[lo - 1:hi - 1], kd[lo - 1:hi - 1])
                     + (() if dl is None else (dl[lo - 1:hi - 1],))
                     for lo, hi in itertools.pairwise(self.bounds.tolist()))


def graph_levels(kinds: list[int], first: list[int], second: list[int], delays: list[int] | None = None):
    """The graph in levels (each node one level after the later of its predecessors'), its
    nodes given rows of the ends in level order (``in_level_order``): (levels, each node's row)."""
    import numpy as np

    n = len(kinds)
    level = [0] * n
    for k in range(n):
        a, b = first[k], second[k]
        level[k] = 1 + max(level[a] if a >= 0 else 0, level[b] if b >= 0 else 0)
    return in_level_order(np.asarray(kinds), np.asarray(first), np.asarray(second), np.asarray(level),
                          None if delays is None else np.asarray(delays))


def in_level_order(kinds, first, second, level, delays=None):
    """A graph's levels from each node's duration index, predecessors (-1: none) and level
    (1 for a node without predecessors, every node past its predecessors' levels), the nodes
    renumbered so that each level is consecutive rows of the ends (row 0 the zero "none" row):
    per level its first and past-last row, both predecessors' rows and duration indices, and
    with ``delays`` (a duration index per node) the delay after which the second
    predecessor's output arrives; and each node's row. A level is then one slice
    assignment, and predecessors lie a few rows back (several times faster than rows in
    node order on graphs of some thousand nodes)."""
    ordered, row = level_order(kinds, first, second, level, delays)
    return ordered.levels(), row


def level_order(kinds, first, second, level, delays=None):
    """``in_level_order``'s graph as flat arrays (``Ordered``), not yet cut into levels, and
    each node's row."""
    import numpy as np

    n = len(kinds)
    order = np.argsort(level, kind="stable")
    row = np.empty(n, dtype=np.int64)
    row[order] = np.arange(1, n + 1)
    bounds = np.searchsorted(level[order], np.arange(1, int(level.max()) + 2)) + 1 if n else np.ones(1, dtype=np.int64)
    a = np.where(first >= 0, row[np.maximum(first, 0)], 0)[order]
    b = np.where(second >= 0, row[np.maximum(second, 0)], 0)[order]
    return Ordered(bounds, a, b, kinds[order], None if delays is None else delays[order]), row


def level_ends(levels, dur, upto: int | None = None, end=None):
    """Each row's end (rows, plans) from ``in_level_order``'s levels, the first ``upto`` of
    them or all: ``dur`` an array (duration index, plans). A row starts when its first
    predecessor ends and its second one's output has arrived (that one's end plus the row's
    delay, where the levels carry delays): max(end[a], end[b] + delay) + duration. With
    ``end``, the ends of these plans already evaluated up to some level are continued."""
    import numpy as np

    levels = levels[:upto]
    size = levels[-1][1] if levels else 1
    done = 0 if end is None else end.shape[0]
    if end is None or done < size:
        grown = np.zeros((size, dur.shape[1]))
        if end is not None:
            grown[:done] = end
        end = grown
    for level in levels:
        if level[1] <= done:
            continue
        lo, hi, a, b, kind = level[:5]
        if len(level) == 6:
            end[lo:hi] = np.maximum(end[a], end[b] + dur[level[5]]) + dur[kind]
        else:
            end[lo:hi] = np.maximum(end[a], end[b]) + dur[kind]
    return end


def graph_ends(levels, rows, dur, nodes):
    """When each of ``nodes`` (a list of node ids) ends, for every plan: ``levels`` and
    ``rows`` as ``graph_levels`` gives them, ``dur`` an array (duration index, plans); returns
    an array (len(nodes), plans)."""
    return level_ends(levels, dur)[rows[nodes]]


def window_ends(ordered, dur, keep, upto: int | None = None, delays: bool = True):
    """The ends (len(keep), plans) of the rows ``keep`` (sorted, distinct, >= 1) of a graph in
    level order (``Ordered``) as ``level_ends(ordered.levels(), dur, upto)[keep]``, bit for
    bit, without holding every row: the levels are stepped through a window of rows a few
    times ``Ordered.span`` deep (no level reads further back), rows leaving it copied out
    where kept; without ``delays``, the graph's delays are left out (all zero). A graph of 60,000 nodes over
    1,000 plans holds 500 MB of ends whole, page faults and cache misses that cost more than
    the steps."""
    import numpy as np

    keep = np.asarray(keep, dtype=np.int64)
    local, moves, size, bases = _window(ordered, upto, delays and ordered.delays is not None)
    plans = dur.shape[1]
    window = np.empty((size + 1, plans))
    window[0] = 0.0
    out = np.empty((len(keep), plans))
    base = 1  # row r lies at window[r - base + 1]

    def copy_out(stop: int) -> None:  # the kept rows of [base, stop) leave the window
        lo, hi = np.searchsorted(keep, [base, stop])
        out[lo:hi] = window[keep[lo:hi] - base + 1]

    move = iter(moves)
    at, new = next(move, (-1, 0))
    for t, level in enumerate(local):
        if t == at:  # slide: rows [new, its first row) to the window's top
            copy_out(new)
            first = level[0] + new - base  # the level's first local row before the slide
            window[1:first - new + base] = window[new - base + 1:first]
            base = new
            at, new = next(move, (-1, 0))
        lo, hi, a, b, kind = level[:5]
        rows = window[lo:hi]  # written in place: max(end[a], end[b] + delay) + duration, in that order
        if len(level) == 6:
            np.add(window[b], dur[level[5]], out=rows)
            np.maximum(window[a], rows, out=rows)
        else:
            np.maximum(window[a], window[b], out=rows)
        rows += dur[kind]
    copy_out(bases)
    return out


def _window(ordered, upto, delays: bool):
    """``window_ends``' plan for ``ordered`` (its first ``upto`` levels), cached on it: each
    level with its rows and predecessors' rows local to the window (and its delays, with
    ``delays``), the slides (before which level, the new first row kept), the window's rows
    and the rows' count."""
    import numpy as np

    key = (upto, delays)
    if key in ordered.windows:
        return ordered.windows[key]
    bounds = ordered.bounds[:None if upto is None else upto + 1].tolist()
    span = ordered.span
    width = max(hi - lo for lo, hi in itertools.pairwise(bounds))
    size = 4 * span + width
    base, bases, moves = 1, [], []
    for t, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        if hi - base > size:
            base = max(base, lo + 1 - span)
            moves.append((t, base))
        bases.append(base)
    rows = bounds[-1] - 1
    shift = np.repeat(np.asarray(bases) - 1, np.diff(bounds))

    def local(pred):
        return np.where(pred > 0, pred - shift, 0)

    a, b, kd = local(ordered.a[:rows]), local(ordered.b[:rows]), ordered.kinds
    dl = ordered.delays if delays else None
    out = [(lo - base + 1, hi - base + 1, a[lo - 1:hi - 1], b[lo - 1:hi - 1], kd[lo - 1:hi - 1])
           + (() if dl is None else (dl[lo - 1:hi - 1],))
           for (lo, hi), base in zip(itertools.pairwise(bounds), bases, strict=True)]
    ordered.windows[key] = (out, moves, size, bounds[-1])
    return ordered.windows[key]
