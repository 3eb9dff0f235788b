"""A schedule's task graph evaluated for many plans of one shape at once.

A pipeline schedule of fixed shape (stages, micro-batches, chunks) is a graph whose nodes each
wait for at most two others (the stage's previous task and the task whose output it needs) and
then run for a duration. Sorting the nodes into levels (every node after all of its
predecessors' levels) turns the event simulation into one numpy step per level over a
(nodes, plans) array, so the search's screen times every plan of a shape exactly.
"""

from __future__ import annotations

import itertools


def graph_levels(kinds: list[int], first: list[int], second: list[int], delays: list[int] | None = None):
    """The graph in levels: per level the node ids, both predecessors (the node count stands
    for "none", a zero row) and duration indices, and with ``delays`` (a duration index per
    node) the delay after which the second predecessor's output arrives; and the node count."""
    import numpy as np

    n = len(kinds)
    level = [0] * n
    for k in range(n):
        a, b = first[k], second[k]
        level[k] = 1 + max(level[a] if a >= 0 else -1, level[b] if b >= 0 else -1)
    order = np.argsort(np.asarray(level), kind="stable")
    bounds = np.searchsorted(np.asarray(level)[order], np.arange(max(level) + 2))
    fa = np.where(np.asarray(first) >= 0, first, n)
    fb = np.where(np.asarray(second) >= 0, second, n)
    kd = np.asarray(kinds)
    dl = None if delays is None else np.asarray(delays)
    out = []
    for lo, hi in itertools.pairwise(bounds):
        ids = order[lo:hi]
        out.append((ids, fa[ids], fb[ids], kd[ids]) + (() if dl is None else (dl[ids],)))
    return tuple(out), n


def graph_ends(levels, n: int, dur):
    """When each node ends, for every plan: ``dur`` is an array (duration index, plans);
    returns an array (n + 1, plans) whose last row is the zero "none" row. A node starts when
    its first predecessor ends and its second one's output has arrived (that one's end plus
    the node's delay, where the levels carry delays): max(end[a], end[b] + delay) + duration."""
    import numpy as np

    end = np.zeros((n + 1, dur.shape[1]))
    if levels and len(levels[0]) == 5:
        for ids, a, b, kind, delay in levels:
            end[ids] = np.maximum(end[a], end[b] + dur[delay]) + dur[kind]
        return end
    for ids, a, b, kind in levels:
        end[ids] = np.maximum(end[a], end[b]) + dur[kind]
    return end
