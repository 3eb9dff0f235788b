"""Interleaved 1F1B timed for many plans of one (p, v) shape at once, from shared runs of its
task graph (``schedule.interleaved``): ``interleaved_finish``.

A run of k micro-batches holds every task of a shorter run up to that run's cool-down, so one
run per distinct column of durations serves every m <= k: each m adds only its tail, the
tasks downstream of a cool-down (``_tail``; past the warm-up one graph for every m), evaluated
from the run's tasks. Only the run's rows the tails and the periodicity band read are kept
(``graph.window_ends``). Past the run, where a band of it repeats, whole periods extend it
(exact); where the stages still drift, the middle of a bracket at most ``DRIFT_BOUND`` wide
(``steady.drift_bracket``).
"""

from __future__ import annotations

import functools
import itertools

from paraplan.schedule.graph import level_ends, level_order, window_ends
from paraplan.schedule.interleaved import (
    graph_arrays,
    last_tasks,
    levels,
    positions,
    tainted_from,
    unit_levels,
    warm_up,
)
from paraplan.schedule.steady import drift_bracket


@functools.lru_cache(maxsize=64)
def _run(p: int, k: int, v: int):
    """A run of ``k`` micro-batches: (its graph in level order as ``levels(p, k, v, True)``'s,
    flat (``graph.Ordered``), each node's row,
    each node's level, prev, dep, duration index, delay index, the last level of a task that
    a longer run shares)."""
    import numpy as np

    kinds, prev, dep, delay = graph_arrays(p, k, v)
    level = unit_levels(p, k, v, prev, dep)
    lv, row = level_order(kinds, prev, dep, level, delay)
    length = 2 * k * v
    untainted = np.arange(p * length) % length < tainted_from(p, k, v, prev, dep)[np.arange(p * length) // length]
    return lv, row, level, prev, dep, kinds, delay, int(level[untainted].max())


def _steady_tail(p: int, v: int) -> int:
    """The fewest micro-batches (a multiple of p) whose run holds every stage's whole warm-up:
    from there on, a run's tail is the same graph whatever m (``_tail``)."""
    return p * -(-warm_up(p, v) // (p * v))


@functools.lru_cache(maxsize=64)
def _tail_graph(p: int, m: int, v: int):
    """The tail of a run of ``m`` micro-batches (holding every stage's whole warm-up): the
    nodes of its graph downstream of a cool-down task (``tainted_from``), in unit-time level
    order. Returns (the tail's levels as ``graph.in_level_order``'s (lo, hi, a, b, kind, delay)
    over rows after those of its inputs, rows 1..; each stage's last task's row; the rows'
    count; its inputs, the run's nodes the tail reads, as each one's stage and position)."""
    import numpy as np

    kinds, prev, dep, delay = graph_arrays(p, m, v)
    length = 2 * m * v
    first = tainted_from(p, m, v, prev, dep)
    stage = np.arange(p * length) // length
    pos = np.arange(p * length) % length
    tail = pos >= first[stage]
    preds = np.concatenate([prev[tail], dep[tail]])
    preds = preds[preds >= 0]
    outside = np.unique(preds[~tail[preds]])
    finals = np.array(last_tasks(p, m, v))
    outside = np.unique(np.concatenate([outside, finals[~tail[finals]]]))
    # unit levels of the tail, its inputs at level 0: the longest chain from them, one numpy
    # step per level of it until nothing changes (as deep as the cool-down: a few hundred)
    nodes = np.flatnonzero(tail)
    level = np.zeros(p * length, dtype=np.int64)
    a, b = prev[nodes], dep[nodes]
    for _ in range(len(nodes) + 1):
        new = 1 + np.maximum(np.where(a >= 0, level[np.maximum(a, 0)], 0), np.where(b >= 0, level[np.maximum(b, 0)], 0))
        if np.array_equal(new, level[nodes]):
            break
        level[nodes] = new
    else:
        raise RuntimeError("interleaved: the tail has a cycle (this is a bug)")
    order = nodes[np.argsort(level[nodes], kind="stable")]
    row = np.zeros(p * length, dtype=np.int64)
    row[outside] = np.arange(1, len(outside) + 1)
    base = len(outside) + 1
    row[order] = np.arange(base, base + len(order))
    a = np.where(prev[order] >= 0, row[np.maximum(prev[order], 0)], 0)
    b = np.where(dep[order] >= 0, row[np.maximum(dep[order], 0)], 0)
    sorted_level = level[order]
    bounds = np.flatnonzero(np.diff(sorted_level)) + 1
    bounds = [0, *bounds.tolist(), len(order)]
    levels_out = tuple((base + lo, base + hi, a[lo:hi], b[lo:hi], kinds[order][lo:hi], delay[order][lo:hi])
                       for lo, hi in itertools.pairwise(bounds))
    return levels_out, row[finals], base + len(order), outside // length, outside % length


@functools.lru_cache(maxsize=256)
def _tail(p: int, m: int, v: int, k: int):
    """How a run of ``m`` micro-batches differs from one of ``k`` >= m (both holding every
    stage's whole warm-up): its tail (``_tail_graph``) and the k-run's nodes it reads.
    Returns (those nodes' rows in the k-run; the tail's levels; each stage's last task's row;
    the rows' count; those nodes).

    From ``_steady_tail(p, v)`` micro-batches on every stage's order ends the same way (its
    last positions, counted from the end, hold the same tasks of the same chunks, m v being a
    multiple of p v), so the tail is the same graph, reading the same tasks p micro-batches
    (2 p v positions) later for each p more micro-batches: built once per (p, v) (a test
    compares it with the tail built for each m)."""
    m0 = _steady_tail(p, v)
    levels_out, finals, size, stage, pos = _tail_graph(p, m0, v)
    nodes_k = stage * 2 * k * v + pos + 2 * v * (m - m0)  # the same tasks in the k-run
    return _run(p, k, v)[1][nodes_k], levels_out, finals, size, nodes_k


def _evaluate_tails(graph, kept, reads, dur):
    """Each stage's finish of runs' tails (``_tail``: one graph, its levels, finals and rows'
    count, ``graph``) from a longer run's kept ends ``kept`` (``_Kept``), several at once:
    ``reads`` a list of (the rows a tail reads in the longer run, columns of ``dur``, with its
    delay rows); a list of each one's finish (p, len(columns))."""
    import numpy as np

    lv, finals, size = graph
    widths = [len(cols) for _, cols in reads]
    cols = np.concatenate([cols for _, cols in reads])
    end = np.empty((size, len(cols)))
    end[0] = 0.0
    at = 0
    for (rows, these), width in zip(reads, widths, strict=True):
        end[1:len(rows) + 1, at:at + width] = kept.rows(rows)[:, these]
        at += width
    d = dur[:, cols]
    for lo, hi, a, b, kind, delay in lv:
        end[lo:hi] = np.maximum(end[a], end[b] + d[delay]) + d[kind]
    return np.split(end[finals], np.cumsum(widths)[:-1], axis=1)


class _Kept:
    """The ends of some rows of a run (``graph.window_ends``), read by row."""

    def __init__(self, ordered, upto: int, dur, rows, delays: bool):
        import numpy as np

        self.keep = np.unique(np.concatenate(rows))
        self.ends = window_ends(ordered, dur, self.keep, upto, delays)

    def rows(self, rows):
        import numpy as np

        return self.ends[np.searchsorted(self.keep, rows)]


@functools.lru_cache(maxsize=64)
def _band(p: int, k: int, v: int):
    """The band ``_periodic`` checks in a run of ``k`` micro-batches: (its nodes' rows, the
    rows of the same nodes one period later), or None where no band is provably past the
    warm-up."""
    import numpy as np

    run = _run(p, k, v)
    _, row, level, prev, dep, kinds, delay, _ = run
    reads = int(level[_tail(p, k, v, k)[4]].min())
    length = 2 * k * v
    shift = 2 * p * v  # one period: p micro-batches on every chunk, 2 p v positions
    first = tainted_from(p, k, v, prev, dep)
    n = p * length
    stage, pos = np.arange(n) // length, np.arange(n) % length
    w, _, _ = positions(p, k, v)
    late = pos + shift >= first[stage]  # the node's shift (or the node) differs from a longer run's
    src = np.flatnonzero(~late)
    same = (kinds[src + shift] == kinds[src]) & (delay[src + shift] == delay[src])
    same &= (prev[src + shift] == prev[src] + shift) & (pos[src] > w[stage[src], 0] + 1)
    same &= np.where(dep[src] >= 0, dep[src + shift] == dep[src] + shift, dep[src + shift] < 0)
    preds = np.concatenate([prev, dep])
    gap = np.concatenate([level - level[np.maximum(prev, 0)], level - level[np.maximum(dep, 0)]])[preds >= 0].max()
    top = int(level[late].min())
    lo = min(top - gap, reads)  # the band [lo, lo + gap) ends before the first late node
    if len(src[~same]) and lo <= int(level[src[~same]].max()):
        return None  # the band reaches back into the warm-up
    band = src[(level[src] >= lo) & (level[src] < lo + gap)]
    if len(band) == 0:
        return None
    return row[band], row[band + shift]


def _periodic(kept, band):
    """Whether each column of a run (``kept`` its ends) repeats itself over ``band``
    (``_band``), and its period: (mask, period)."""
    import numpy as np

    earlier, later = kept.rows(band[0]), kept.rows(band[1])
    steps = later - earlier
    period = steps[0]
    tol = 1e-13 * np.abs(later).max(axis=0)
    return np.all(np.abs(steps - period) <= tol, axis=0), period


def interleaved_finish(p: int, v: int, m, dur, column, arrival=None):
    """Each stage's finish (p, plans) under interleaved 1F1B for many plans of ``p`` stages and
    ``v`` chunks at once, each with its micro-batches (``m``, multiples of p) and its
    column of ``dur`` (3 p v, columns, as ``pipeline.task_durations``); ``arrival`` (2,
    columns): asynchronous sends (``pipeline_finish``'s).

    One run of k micro-batches per column serves every m <= k: a run of m differs from it only
    in its tail, the tasks downstream of a cool-down task (``_tail``), evaluated from the run's
    other tasks. Past k, where the run repeats itself with period p micro-batches over a band
    of levels as deep as its longest edge (every task one period later than the task p
    micro-batches before: by induction over the levels every later task does too), the tail of
    a run of m0 <= k whose inputs lie past the band's start, shifted by (m - m0) / p periods.
    The first run is one period past the warm-up (``_steady_tail`` + p micro-batches): most
    columns already repeat there (GPT-3 175B's whole space: 70-80 % of the columns of each
    depth of 4 stages or more, in a run a third as long as the shared one). The columns that
    do not take the shared run of ``long_run(p, v)`` micro-batches, so that every m up to it
    is exact; past it, those that still do not repeat (stages still drifting) take the middle
    of a bracket where it is within ``DRIFT_BOUND`` (``steady.drift_bracket``), else a run twice as
    long, up to their largest m. Every tail is evaluated in one pass (``_Finish``)."""
    import numpy as np

    m = np.asarray(m, dtype=np.int64)
    column = np.asarray(column, dtype=np.int64)
    cols = dur.shape[1]
    extra = np.zeros((3, cols)) if arrival is None else np.concatenate([np.zeros((1, cols)), arrival])
    full = np.concatenate([dur, extra])
    out = np.empty((p, len(m)))
    warm = warm_up(p, v)
    short = m * v < warm
    for mb in np.unique(m[short]).tolist():  # warm-ups cut short: their own graph
        sel = np.flatnonzero(m == mb)
        used, inv = np.unique(column[sel], return_inverse=True)
        lv, row = levels(p, mb, v, True)
        out[:, sel] = level_ends_rows(lv, full[:, used], row[last_tasks(p, mb, v)])[:, inv.reshape(-1)]
    rest = np.flatnonzero(~short)
    if len(rest) == 0:
        return out
    m_rest, col_rest = m[rest], column[rest]
    pending = np.ones(len(rest), dtype=bool)
    k = _steady_tail(p, v) + p  # a first run one period past the warm-up; then the shared run
    asynchronous = arrival is not None
    while pending.any():
        k = min(k, int(m_rest[pending].max()))
        used, inv = _distinct(col_rest[pending], cols)
        idx = np.flatnonzero(pending)
        ms = m_rest[idx]
        beyond = ms > k
        band = _band(p, k, v) if beyond.any() else None
        bracket = beyond.any() and k >= long_run(p, v)
        exact = np.unique(ms[~beyond]).tolist()
        wanted = {mb: inv[ms == mb] for mb in exact}  # exact: the run and m's tail
        if beyond.any():  # past the run: its own tail (and the one a period shorter, for the bracket)
            wanted.setdefault(k, inv[:0])
            wanted[k] = np.concatenate([wanted[k], inv[beyond]])
            if bracket:
                wanted[k - p] = np.concatenate([wanted.get(k - p, inv[:0]), inv[beyond]])
        tails = {mb: _tail(p, mb, v, k) for mb in wanted}
        rows = [tail[0] for tail in tails.values()] + ([] if band is None else list(band))
        run = _run(p, k, v)
        kept = _Kept(run[0], run[7], full[:, used], rows, asynchronous)  # the run's ends the tails read
        finish = _Finish(tails, wanted, kept, full[:, used])
        for mb in exact:
            at = ms == mb
            out[:, rest[idx[at]]] = finish(mb, inv[at])
        pending[idx[~beyond]] = False
        if not beyond.any():
            break
        if band is not None:
            fine, period = _periodic(kept, band)
            sel = beyond & fine[inv]
            out[:, rest[idx[sel]]] = finish(k, inv[sel]) + ((ms[sel] - k) // p) * period[inv[sel]]
            pending[idx[sel]] = False
            beyond &= ~sel
        if bracket and beyond.any():  # still drifting: the middle of a bracket where narrow enough
            top, before = finish(k, inv[beyond]), finish(k - p, inv[beyond])
            done, narrow = drift_bracket(p, v, top, before, full[:, used][:, inv[beyond]], (ms[beyond] - k) // p)
            out[:, rest[idx[beyond][narrow]]] = done[:, narrow]
            pending[idx[beyond][narrow]] = False
        k = long_run(p, v) if k < long_run(p, v) else 2 * k
    return out


class _Finish:
    """Each stage's finish of runs of the micro-batch counts of ``tails`` (each ``_tail``) for
    the columns ``wanted`` of each, from one longer run's kept ends: every tail is the same
    graph, evaluated once for them all (``_evaluate_tails``); called with (m, columns)."""

    def __init__(self, tails, wanted, kept, dur):

        n = dur.shape[1]
        self.cols = {mb: _distinct(cols, n)[0] for mb, cols in wanted.items()}
        graph = next(iter(tails.values()))[1:4]
        done = _evaluate_tails(graph, kept, [(tails[mb][0], cols) for mb, cols in self.cols.items()], dur)
        self.done = dict(zip(self.cols, done, strict=True))

    def __call__(self, mb: int, cols):
        import numpy as np

        return self.done[mb][:, np.searchsorted(self.cols[mb], cols)]


def _distinct(values, n: int):
    """The distinct values of ``values`` (integers below ``n``), sorted, and each one's index
    among them: ``np.unique(values, return_inverse=True)`` by counting, without a sort."""
    import numpy as np

    present = np.bincount(values, minlength=n) > 0
    return np.flatnonzero(present), (np.cumsum(present) - 1)[values]


def long_run(p: int, v: int) -> int:
    """Micro-batches of ``interleaved_finish``'s shared run: past the warm-up and the tail by a
    few periods of p micro-batches."""
    return p * (8 + -(-warm_up(p, v) // (p * v)))


def level_ends_rows(lv, dur, rows):
    """``graph.level_ends`` of the rows ``rows``."""
    return level_ends(lv, dur)[rows]
