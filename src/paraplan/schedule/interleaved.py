"""Megatron-LM's interleaved 1F1B task graph built with numpy, for ``schedule.pipeline_finish``.

Stage ``i`` of ``p`` with ``v`` chunks runs ``T = m v`` forwards and as many backwards
(``schedule.orders``): ``w = min(2 (p - i - 1) + (v - 1) p, T)`` warm-up forwards, then
forward-backward pairs, then ``w`` cool-down backwards. Its k-th forward is chunk
``(k // p) % v`` of micro-batch ``(k // (p v)) p + k % p``, its k-th backward the same
micro-batch on chunk ``v - 1 - (k // p) % v``, the same on every stage. So a forward waits for
the stage before's k-th forward (stage 0: stage p - 1's forward k - p, none on chunk 0), a
backward for the stage after's k-th backward (the last stage: stage 0's backward k - p, or on
the model's last chunk its own forward k + (v - 1) p). Node ``i 2T + position`` is built in
closed form (``graph_arrays``) instead of ``pipeline._structure``'s Python walk of the orders,
and its levels (each task's end when every task takes one unit: the longest chain into it)
come from one walk of the stages in turn (``_unit_levels``). A test
compares the graph with ``_structure``'s and the times with ``simulate_pipeline``'s.
"""

from __future__ import annotations

import functools
import itertools

from paraplan.schedule.graph import in_level_order, level_ends, level_order, window_ends


def _positions(p: int, m: int, v: int):
    """Each stage's warm-up (p, 1) and, per position of its order (p, 2T): kind (0 forward, 1
    backward) and index k among the stage's tasks of that kind."""
    import numpy as np

    total = m * v
    i = np.arange(p)[:, None]
    w = np.minimum(2 * (p - i - 1) + (v - 1) * p, total)
    pos = np.arange(2 * total)[None, :]
    steady = (pos >= w) & (pos < 2 * total - w)
    odd = (pos - w) % 2 == 1
    kind = np.where(pos < w, 0, np.where(steady, odd.astype(np.int64), 1))
    k = np.where(pos < w, pos, np.where(steady, np.where(odd, (pos - w - 1) // 2, w + (pos - w) // 2), pos - total))
    return w, kind, k


def _node(p: int, m: int, v: int, w, stage, kind, k):
    """The node of stage ``stage``'s ``k``-th task of ``kind`` (arrays broadcast; ``w`` each
    stage's warm-up, indexed by ``stage``)."""
    import numpy as np

    total = m * v
    ws = w[stage, 0]
    fwd = np.where(k < ws, k, 2 * k - ws)
    bwd = np.where(k < total - ws, ws + 2 * k + 1, total + k)
    return stage * 2 * total + np.where(kind == 0, fwd, bwd)


def graph_arrays(p: int, m: int, v: int):
    """The interleaved task graph of ``p`` stages, ``m`` micro-batches (a multiple of p) and
    ``v`` chunks as flat arrays over nodes ``i 2 m v + position``: each node's duration index
    (as ``task_durations``: (i v + chunk) 3 + kind), the stage's previous task, the task whose
    output it waits for (-1: none) and the delay index of that output's arrival
    (``pipeline._levels``: 3 p v none, + 1 a forward's input, + 2 a backward's)."""
    import numpy as np

    total = m * v
    w, kind, k = _positions(p, m, v)
    i = np.broadcast_to(np.arange(p)[:, None], kind.shape)
    group = (k // p) % v
    chunk = np.where(kind == 0, group, v - 1 - group)
    pos = np.arange(2 * total)[None, :]
    node = i * 2 * total + pos
    prev = np.where(pos > 0, node - 1, -1)
    last = p - 1
    # a forward: stage i - 1's k-th forward; stage 0: the last stage's forward k - p (chunk > 0)
    f_stage, f_k = np.where(i > 0, i - 1, last), np.where(i > 0, k, k - p)
    f_none = (i == 0) & (chunk == 0)
    # a backward: stage i + 1's k-th; the last stage: stage 0's backward k - p, or its own forward
    own = (i == last) & (chunk == v - 1)
    b_stage, b_kind = np.where(i < last, i + 1, np.where(own, last, 0)), np.where(own, 0, 1)
    b_k = np.where(i < last, k, np.where(own, k + (v - 1) * p, k - p))
    dep_f = np.where(f_none, -1, _node(p, m, v, w, f_stage, 0, np.maximum(f_k, 0)))
    dep_b = _node(p, m, v, w, b_stage, b_kind, np.clip(b_k, 0, total - 1))
    dep = np.where(kind == 0, dep_f, dep_b)
    base = 3 * p * v
    delay = np.where((dep >= 0) & ~((kind == 1) & own), base + 1 + kind, base)
    durations = (i * v + chunk) * 3 + kind
    return durations.reshape(-1), prev.reshape(-1), dep.reshape(-1), delay.reshape(-1)


def _unit_levels(p: int, m: int, v: int, prev, dep):
    """Each node's level: its end when every task takes one unit (one more than the later of
    its stage's previous task's and its input's levels), walking the stages in turn, each as
    far as its inputs are known (a list walk: faster than numpy steps for these few stages)."""
    import numpy as np

    length = 2 * m * v
    deps = dep.tolist()
    level = [0] * (p * length)
    at = [i * length for i in range(p)]
    ends = [i * length + length for i in range(p)]
    remaining = p * length
    while remaining:
        progressed = False
        for i in range(p):
            k, stop = at[i], ends[i]
            before = level[k - 1] if k > i * length else 0
            while k < stop:
                d = deps[k]
                if d >= 0:
                    ld = level[d]
                    if ld == 0:
                        break
                    if ld > before:
                        before = ld
                before += 1
                level[k] = before
                k += 1
            if k > at[i]:
                remaining -= k - at[i]
                at[i] = k
                progressed = True
        if not progressed:
            raise RuntimeError("interleaved: the schedule deadlocked (this is a bug)")
    level = np.asarray(level, dtype=np.int64)
    if np.any((prev >= 0) & (level <= level[np.maximum(prev, 0)])):
        raise RuntimeError("interleaved: a task's level does not follow its predecessor's (this is a bug)")
    return level


@functools.lru_cache(maxsize=64)
def levels(p: int, m: int, v: int, overlap_p2p: bool = False):
    """The graph in levels for ``schedule.graph`` (as ``pipeline._levels``): (levels, each
    node's row)."""
    kinds, prev, dep, delay = graph_arrays(p, m, v)
    level = _unit_levels(p, m, v, prev, dep)
    return in_level_order(kinds, prev, dep, level, delay if overlap_p2p else None)


def last_tasks(p: int, m: int, v: int) -> list[int]:
    """Each stage's last task's node."""
    length = 2 * m * v
    return [i * length + length - 1 for i in range(p)]


def stage0_done(p: int, m: int, v: int) -> list[int]:
    """The node of stage 0's backward of each micro-batch on chunk 0, in micro-batch order."""
    import numpy as np

    w, _, _ = _positions(p, m, v)
    j = np.arange(m)
    k = (j // p) * p * v + (v - 1) * p + j % p
    return _node(p, m, v, w, np.zeros(m, dtype=np.int64), 1, k).tolist()


def _warm_up(p: int, v: int) -> int:
    """Stage 0's warm-up forwards when the run is long enough to hold them (the most of any stage)."""
    return 2 * (p - 1) + (v - 1) * p


@functools.lru_cache(maxsize=64)
def _run(p: int, k: int, v: int):
    """A run of ``k`` micro-batches: (its graph in level order as ``levels(p, k, v, True)``'s,
    flat (``graph.Ordered``), each node's row,
    each node's level, prev, dep, duration index, delay index, the last level of a task that
    a longer run shares)."""
    import numpy as np

    kinds, prev, dep, delay = graph_arrays(p, k, v)
    level = _unit_levels(p, k, v, prev, dep)
    lv, row = level_order(kinds, prev, dep, level, delay)
    length = 2 * k * v
    untainted = np.arange(p * length) % length < _tainted_from(p, k, v, prev, dep)[np.arange(p * length) // length]
    return lv, row, level, prev, dep, kinds, delay, int(level[untainted].max())


def _tainted_from(p: int, m: int, v: int, prev, dep):
    """Each stage's first position whose task differs from a longer run's: its cool-down, or
    earlier where the task waits (through its input, or through the stage's previous task) on a
    task that differs; the differing tasks are a suffix of every stage's order."""
    import numpy as np

    length = 2 * m * v
    w, _, _ = _positions(p, m, v)
    first = (length - w[:, 0]).astype(np.int64)
    stage = np.arange(p * length) // length
    pos = np.arange(p * length) % length
    while True:
        tainted = pos >= first[stage]
        hit = (dep >= 0) & tainted[np.maximum(dep, 0)] & ~tainted
        if not hit.any():
            return first
        np.minimum.at(first, stage[hit], pos[hit])


def _steady_tail(p: int, v: int) -> int:
    """The fewest micro-batches (a multiple of p) whose run holds every stage's whole warm-up:
    from there on, a run's tail is the same graph whatever m (``_tail``)."""
    return p * -(-_warm_up(p, v) // (p * v))


@functools.lru_cache(maxsize=64)
def _tail_graph(p: int, m: int, v: int):
    """The tail of a run of ``m`` micro-batches (holding every stage's whole warm-up): the
    nodes of its graph downstream of a cool-down task (``_tainted_from``), in unit-time level
    order. Returns (the tail's levels as ``graph.in_level_order``'s (lo, hi, a, b, kind, delay)
    over rows after those of its inputs, rows 1..; each stage's last task's row; the rows'
    count; its inputs, the run's nodes the tail reads, as each one's stage and position)."""
    import numpy as np

    kinds, prev, dep, delay = graph_arrays(p, m, v)
    length = 2 * m * v
    first = _tainted_from(p, m, v, prev, dep)
    stage = np.arange(p * length) // length
    pos = np.arange(p * length) % length
    tail = pos >= first[stage]
    preds = np.concatenate([prev[tail], dep[tail]])
    preds = preds[preds >= 0]
    outside = np.unique(preds[~tail[preds]])
    finals = np.array(last_tasks(p, m, v))
    outside = np.unique(np.concatenate([outside, finals[~tail[finals]]]))
    # unit levels of the tail, its inputs at level 0
    nodes = np.flatnonzero(tail)
    lv = [0] * (p * length)
    prevs, deps = prev.tolist(), dep.tolist()
    tails = [np.flatnonzero(tail & (stage == i)).tolist() for i in range(p)]
    at = [0] * p
    remaining = len(nodes)
    done_l = (~tail).tolist()
    while remaining:
        progressed = False
        for i in range(p):
            seq = tails[i]
            j = at[i]
            while j < len(seq):
                n = seq[j]
                a, b = prevs[n], deps[n]
                if (a >= 0 and not done_l[a]) or (b >= 0 and not done_l[b]):
                    break
                lv[n] = 1 + max(lv[a] if a >= 0 else 0, lv[b] if b >= 0 else 0)
                done_l[n] = True
                j += 1
            if j > at[i]:
                remaining -= j - at[i]
                at[i] = j
                progressed = True
        if not progressed:
            raise RuntimeError("interleaved: the tail deadlocked (this is a bug)")
    level = np.asarray(lv, dtype=np.int64)
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


def _evaluate_tail(tail, kept, cols, dur):
    """Each stage's finish (p, len(cols)) of a run's tail (``_tail``) from the longer run's
    kept ends ``kept`` (``_Kept``), for the columns ``cols`` (``dur`` with its delay rows,
    columns)."""
    return _evaluate_tails(tail[1:4], kept, [(tail[0], cols)], dur)[0]


def _evaluate_tails(graph, kept, reads, dur):
    """``_evaluate_tail`` of one tail graph (``_tail``'s levels, finals and rows' count) for
    several runs' inputs at once: ``reads`` a list of (the rows it reads in the longer run,
    columns); a list of each one's finish (p, len(columns))."""
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
    first = _tainted_from(p, k, v, prev, dep)
    n = p * length
    stage, pos = np.arange(n) // length, np.arange(n) % length
    w, _, _ = _positions(p, k, v)
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
    columns already repeat there (GPT-3 175B's whole space: a third of the shared run's
    cost). The columns that do not take the shared run of ``long_run(p, v)`` micro-batches,
    so that every m up to it is exact; past it, those that still do not repeat (stages still
    drifting) take the middle of a bracket where it is within ``DRIFT_BOUND``
    (``_drift_bracket``), else a run twice as long, up to their largest m."""
    import numpy as np

    m = np.asarray(m, dtype=np.int64)
    column = np.asarray(column, dtype=np.int64)
    cols = dur.shape[1]
    extra = np.zeros((3, cols)) if arrival is None else np.concatenate([np.zeros((1, cols)), arrival])
    full = np.concatenate([dur, extra])
    out = np.empty((p, len(m)))
    warm = _warm_up(p, v)
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
        used, inv = np.unique(col_rest[pending], return_inverse=True)
        inv = inv.reshape(-1)
        idx = np.flatnonzero(pending)
        ms = m_rest[idx]
        beyond = ms > k
        exact = np.unique(ms[~beyond]).tolist()
        tails = {mb: _tail(p, mb, v, k) for mb in exact}
        band = None
        if beyond.any():
            tails[k], tails[k - p] = _tail(p, k, v, k), _tail(p, k - p, v, k)
            band = _band(p, k, v)
        rows = [tail[0] for tail in tails.values()] + ([] if band is None else list(band))
        run = _run(p, k, v)
        kept = _Kept(run[0], run[7], full[:, used], rows, asynchronous)  # the run's ends the tails read
        reads, plans = [], []
        for mb in exact:  # exact: the run's tasks and this m's tail (one graph for every m)
            at = ms == mb
            cu, ci = np.unique(inv[at], return_inverse=True)
            reads.append((tails[mb][0], cu))
            plans.append((rest[idx[at]], ci.reshape(-1)))
        if reads:
            for (where, ci), done in zip(plans, _evaluate_tails(tails[exact[0]][1:4], kept, reads, full[:, used]),
                                         strict=True):
                out[:, where] = done[:, ci]
        pending[idx[~beyond]] = False
        if not beyond.any():
            break
        tail = tails[k]
        if band is not None:
            fine, period = _periodic(kept, band)
            sel = beyond & fine[inv]
            if sel.any():
                cu, ci = np.unique(inv[sel], return_inverse=True)
                ci = ci.reshape(-1)
                base = _evaluate_tail(tail, kept, cu, full[:, used])
                out[:, rest[idx[sel]]] = base[:, ci] + ((ms[sel] - k) // p) * period[cu][ci]
                pending[idx[sel]] = False
            beyond &= ~sel
        if beyond.any() and k >= long_run(p, v):  # still drifting: the middle of a bracket where narrow enough
            finish, narrow = _drift_bracket(p, v, k, kept, (tail, tails[k - p]), full[:, used], inv[beyond],
                                            ms[beyond])
            out[:, rest[idx[beyond][narrow]]] = finish[:, narrow]
            pending[idx[beyond][narrow]] = False
        k = long_run(p, v) if k < long_run(p, v) else 2 * k
    return out


def _drift_bracket(p: int, v: int, k: int, kept, tails, dur, inv, m):
    """Each stage's finish (p, plans) of plans of ``m`` > k micro-batches whose columns (``inv``
    of ``dur``'s) do not repeat within the run of ``k`` (``kept`` its ends, ``tails`` the
    ``_tail`` of k and of k - p micro-batches in it), and which of them to keep: (finish, mask).

    Their stages are still drifting: a slower stage takes over the pace as the lead the
    warm-up gave the others is used up, so each period of p micro-batches takes longer than
    the last (as 1F1B's, ``one_f_one_b_finish``). Past the run the finish lies between the
    run's last period repeated (the chord) and the slowest stage's busy time per period (its
    forwards and backwards, held sends included, of p micro-batches on every chunk); the
    middle of that bracket is taken where its half-width is within ``DRIFT_BOUND`` (0.1 %) and
    the chord does not exceed the pace, the rest take a longer run. Not proven as the repeat
    is: checked against ``simulate_pipeline`` by a test."""
    import numpy as np

    from paraplan.schedule.one_f_one_b import DRIFT_BOUND

    cu, ci = np.unique(inv, return_inverse=True)
    ci = ci.reshape(-1)
    top = _evaluate_tail(tails[0], kept, cu, dur)
    chord = top - _evaluate_tail(tails[1], kept, cu, dur)
    work = dur[:3 * p * v][:, cu].reshape(p, v, 3, len(cu))[:, :, :2].sum(axis=(1, 2))
    pace = p * work.max(axis=0)
    periods = (m - k) // p
    low = top[:, ci] + periods * chord[:, ci]
    high = top[:, ci] + periods * pace[ci]
    narrow = np.all(chord <= pace * (1 + 1e-12), axis=0)[ci] & np.all(high - low <= 2 * DRIFT_BOUND * low, axis=0)
    return (low + high) / 2, narrow


def long_run(p: int, v: int) -> int:
    """Micro-batches of ``interleaved_finish``'s shared run: past the warm-up and the tail by a
    few periods of p micro-batches."""
    return p * (8 + -(-_warm_up(p, v) // (p * v)))


def level_ends_rows(lv, dur, rows):
    """``graph.level_ends`` of the rows ``rows``."""
    return level_ends(lv, dur)[rows]
