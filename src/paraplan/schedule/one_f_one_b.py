"""Megatron-LM's 1F1B (one chunk per stage) timed for many plans of a pipeline depth at once.

Stage ``i`` of ``p`` runs ``w = min(p - i - 1, m)`` warm-up forwards, then forward-backward
pairs, then ``w`` cool-down backwards (``schedule.orders``); a forward waits for the stage
before's forward of its micro-batch, a backward for the stage after's backward (the last
stage's for its own forward). That order is regular, so its task graph is built here with
numpy in closed form (``_graph``), node ``(2 i + kind) m + j`` for micro-batch ``j``, instead of
``schedule.pipeline``'s general builder that walks the stages' orders in Python (about 1 s
for the graphs a whole-space screen needs, 0.01 s here). Its levels are each task's end time
when every task takes one unit: warm-up forward ``j`` ends at ``i + j + 1``, the first steady
forward at ``p``, later forwards at ``i + 2 j + 1`` and backward ``j`` at ``2 p - i + 2 j``
(the longest chain into each task; every edge is checked to climb, so the levels are a valid
order whatever the formula, and a test compares the graph with ``_structure``'s).

``one_f_one_b_finish`` then times every plan: by a closed form where the last stage paces the
pipeline from the start (proven, ``_paced_by_last``), else from runs shared by every m: a run of
k micro-batches holds every task of a run of m <= k before that one's cool-down, so one run per
distinct column of durations times all of its plans up to k exactly (``_cool_down``), and past
k exactly where the run's steady band repeats, else within ``DRIFT_BOUND``.
"""

from __future__ import annotations

import functools

from paraplan.schedule.graph import in_level_order, level_ends
from paraplan.schedule.pipeline import _full
from paraplan.schedule.steady import DRIFT_BOUND, LONG
from paraplan.specs import Schedule


def periodic_short(p: int) -> int:
    """Micro-batches of ``one_f_one_b_finish``'s first short run for ``p`` stages: the
    warm-up (p), a band of p + 2 micro-batches checked for periodicity, and the p + 2 before
    the cool-down whose tasks a shorter run would time differently."""
    return 3 * p + 4


def graph_arrays(p: int, m: int):
    """1F1B's task graph for ``p`` stages and ``m`` micro-batches as flat arrays over nodes
    ``(2 i + kind) m + j`` (kind 0 forward, 1 backward): each node's duration index (as
    ``task_durations``: 3 i + kind), the stage's previous task, the task whose output it waits
    for (-1: none) and its unit-time end (its level + 1)."""
    import numpy as np

    i = np.arange(p)[:, None]
    j = np.arange(m)[None, :]
    w = np.minimum(p - i - 1, m)

    def node(stage, kind, mb):
        return (2 * stage + kind) * m + mb

    warm, first = j < w, j == w
    f_prev = np.where(warm, np.where(j > 0, node(i, 0, j - 1), -1),
                      np.where(first, np.where(w > 0, node(i, 0, w - 1), -1), node(i, 1, np.maximum(j - w - 1, 0))))
    f_dep = np.where(i > 0, node(i - 1, 0, j), -1)
    f_end = np.where(warm, i + j + 1, np.where(first, p, i + 2 * j + 1))
    steady = j < m - w
    b_prev = np.where(steady, node(i, 0, np.minimum(j + w, m - 1)),
                      np.where(j >= 1, node(i, 1, j - 1), node(i, 0, m - 1)))
    b_dep = np.where(i < p - 1, node(np.minimum(i + 1, p - 1), 1, j), node(i, 0, j))
    b_end = 2 * p - i + 2 * j

    def flat(fwd, bwd):
        return np.stack([np.broadcast_to(fwd, (p, m)), np.broadcast_to(bwd, (p, m))], axis=1).reshape(-1)

    return flat(3 * i, 3 * i + 1), flat(f_prev, b_prev), flat(f_dep, b_dep), flat(f_end, b_end)


@functools.lru_cache(maxsize=128)
def _graph(p: int, m: int):
    """``graph_arrays`` in levels, in level order (``schedule.graph.in_level_order``): (its
    levels, each node's row of the ends as an array (2 p, m))."""
    import numpy as np

    kinds, prev, dep, level = graph_arrays(p, m)
    for before in (prev, dep):
        if np.any((before >= 0) & (level <= level[np.maximum(before, 0)])):
            raise RuntimeError("one_f_one_b: a task's level does not follow its predecessor's (this is a bug)")
    levels, row = in_level_order(kinds, prev, dep, level)
    return levels, row.reshape(2 * p, m)


def _ends(p: int, m: int, dur, upto: int | None = None, end=None):
    """The tasks' ends (rows as ``_graph``'s, columns) for the duration columns ``dur`` (3 p,
    columns): every level, or the first ``upto``; with ``end``, a run of these columns
    evaluated up to some level, continued."""
    return level_ends(_graph(p, m)[0], dur, upto, end)


def _steady_levels(p: int, k: int) -> int:
    """How many levels hold every task of a run of ``k`` >= p micro-batches before its
    cool-down (forward j of stage i ends at level i + 2 j + 1, steady backward j at
    2 p - i + 2 j): whatever the graph's length, the same tasks."""
    return 2 * k + p - 1


def _last(rows, m: int):
    """Each stage's last task's row: its backward of the last micro-batch."""
    return rows[1::2, m - 1]


def _whole(p: int, m: int, dur):
    """Each stage's finish (p, columns) from the whole graph of ``m`` micro-batches, past
    ``LONG`` extrapolated plan by plan as ``simulate_pipeline`` does."""
    if m > LONG:
        return _full(Schedule.ONE_F_ONE_B, p, m, 1, dur, False)
    return _ends(p, m, dur)[_last(_graph(p, m)[1], m)]


def _paced_by_last(p: int, dur):
    """Which duration columns the last stage paces from its first forward to its last
    backward, so that ``_paced_finish`` holds: no stage takes longer for a forward and a
    backward (sends included) than the last stage, and each stage's first steady forward,
    which ends after its warm-up's flow shop of p - i forwards through stages 0..i, sum
    F + (p - i - 1) max F, comes before the last stage's first backward has come back to it
    (sum F + the later stages' forward and backward). Then, by induction over 1F1B's rounds,
    every backward waits for the one after it, never for its stage, every steady forward for
    its stage's backward before, never for its input, and the last stage never waits."""
    import numpy as np

    fwd, both = dur[0::3], dur[0::3] + dur[1::3]
    later = np.cumsum(both[::-1], axis=0)[::-1]  # later[i]: stages i.. p - 1
    lead = (p - 1 - np.arange(p - 1))[:, None] * np.maximum.accumulate(fwd[:p - 1], axis=0)
    return np.all(both[:p - 1] <= both[p - 1], axis=0) & np.all(lead <= later[1:], axis=0)


def _paced_finish(p: int, dur):
    """Each stage's finish (p, columns) for one micro-batch's worth of the last stage's pace
    (add (m - 1) times its forward and backward): the forwards down the pipeline, then the
    last backward back up to each stage."""
    import numpy as np

    back = np.cumsum(dur[1::3][::-1], axis=0)[::-1]  # stage i's backward and those after it
    return dur[0::3].sum(axis=0) + back


def _cool_down(p: int, rows, end, m, column, b_dur):
    """Each stage's finish (p, plans) for plans of ``m`` micro-batches, from a longer run:
    ``end`` its task ends, ``rows`` their rows (``_graph``), ``column`` each plan's column of
    it and ``b_dur`` each stage's backward (p, columns).

    A run of m micro-batches holds the same tasks as one of k up to its cool-down: every
    forward, and each stage's steady backwards (same predecessors, same durations), so only
    the cool-down differs, stage i's last ``c = min(p - i - 1, m)`` backwards, each waiting for
    the stage's task before and the stage after's backward of its micro-batch. Counting them
    from the end (u = 0 the last), backward u of stage i waits for u + 1 of stage i and u of
    stage i + 1, both on the anti-diagonal i + u + 1: one numpy step per anti-diagonal from
    the run's tasks (u = c: the last steady backward, or the last forward where the whole
    stage is warm-up and cool-down) down to stage i's last backward, its finish."""
    import numpy as np

    if len(m) == 0:
        return np.empty((p, 0))
    pairs, plan = np.unique(column * (int(m.max()) + 1) + m, return_inverse=True)  # plans alike: once
    column, m = pairs // (int(m.max()) + 1), pairs % (int(m.max()) + 1)
    n = len(m)
    stage = np.arange(p)[:, None]
    c = np.minimum(p - 1 - stage, m[None, :])  # (p, plans)
    before = np.where(c < m, rows[2 * stage + 1, np.maximum(m - 1 - c, 0)], rows[2 * stage, m - 1])
    outside = end[before, column[None, :]]  # the run's task at u = c of each stage
    back = b_dur[:, column]
    out = np.empty((p, n))
    out[p - 1] = outside[p - 1]
    diagonal = np.where(c == p - 1 - stage, outside, -np.inf)  # i + u = p - 1
    for s in range(p - 2, -1, -1):
        u = s - stage[:s + 1]
        step = np.maximum(diagonal[:s + 1], diagonal[1:s + 2]) + back[:s + 1]
        cs = c[:s + 1]
        diagonal = np.where(u < cs, step, np.where(u == cs, outside[:s + 1], -np.inf))
        out[s] = diagonal[s]
    return out[:, plan.reshape(-1)]


def distinct_columns(dur):
    """The distinct columns of ``dur`` (rows, columns): (the index of a column of each, each
    column's index among them), as ``np.unique(dur, axis=1)`` gives, by a lexicographic sort
    of the rows (several times faster for a few rows)."""
    import numpy as np

    order = np.lexsort(dur[::-1])
    ranked = dur[:, order]
    new = np.ones(dur.shape[1], dtype=bool)
    new[1:] = np.any(ranked[:, 1:] != ranked[:, :-1], axis=0)
    inverse = np.empty(dur.shape[1], dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return order[new], inverse


def _periodic(p: int, k: int, rows, end):
    """Whether each column of a run repeats itself in the band of p + 2 micro-batches before
    the last p + 1 of its first ``k`` (every task one period after the same task of the
    micro-batch before), and that period."""
    import numpy as np

    j0 = k - 2 * p - 3
    band = end[rows[:, j0:j0 + p + 2]]  # (2 p, p + 2, columns)
    steps = band[:, 1:] - band[:, :-1]
    period = steps[0, 0]
    return np.all(np.abs(steps - period) <= 1e-9 * period, axis=(0, 1)), period


def one_f_one_b_finish(p: int, m, dur, column=None):
    """Each stage's finish time under Megatron-LM's 1F1B for many plans of ``p`` stages at
    once, each with its own micro-batch count (``m``, an integer array): ``dur`` is an array
    (3 p, columns) indexed as ``task_durations`` (blocking sends included) and ``column`` each
    plan's column of it (default: plan k has column k). Returns (p, plans), equal to
    ``simulate_pipeline``'s finish times to rounding, or within ``DRIFT_BOUND``.

    Where the last stage sets the pace from the start (``_paced_by_last``: in a whole-space
    screen of GPT-3 175B, 76-86 % of the plans of each depth), a closed form is exact.

    The other plans are timed from runs of k micro-batches, one per distinct column: a plan
    of m <= k exactly from the run's tasks and its own cool-down (``_cool_down``), so the
    columns whose plans all have at most k1 = ``periodic_short(p)`` take one run of their
    largest m. A plan with more is timed from a run of k1: when every task of a band of p + 1
    micro-batches in its steady phase ends exactly one period later than the same task of the
    micro-batch before (the whole state, not one stage's marks), every later task does too,
    by induction over the graph (1F1B's steady tasks wait on tasks at most p micro-batches
    earlier), so a run of m micro-batches finishes (m - k) periods later: exact. A column not
    yet periodic continues its run, level by level, to 2 k1, 4 k1 and 8 k1, checked again at
    each (so every plan of up to 8 k1 micro-batches is exact). Still not periodic, its stages
    are drifting: a stage slower than those after it sets the pace only once their warm-up
    lead is used up, so the finish as a function of m is the larger of lines, convex, its
    slope at most the slowest stage's forward plus backward. Between the slope over the last
    two checks and that pace lies the finish at m: the middle of the bracket is taken where
    its half-width is within ``DRIFT_BOUND``, the rest is evaluated whole."""
    import numpy as np

    m = np.asarray(m, dtype=np.int64)
    n = len(m)
    column = np.arange(n) if column is None else np.asarray(column, dtype=np.int64)
    out = np.empty((p, n))
    paced = _paced_by_last(p, dur)[column] & (m >= p)
    out[:, paced] = (_paced_finish(p, dur)[:, column[paced]]
                     + (m[paced] - 1) * (dur[-3] + dur[-2])[column[paced]])
    todo = ~paced
    pace = (dur[0::3] + dur[1::3]).max(axis=0)[column]  # the slowest stage's forward and backward
    b_dur = dur[1::3]
    k1 = periodic_short(p)
    long = np.zeros(dur.shape[1], dtype=bool)  # columns with a plan of more than k1
    long[column[todo & (m > k1)]] = True
    few = todo & ~long[column]  # plans only a short run's cool-down times: one run of their most
    if few.any():
        used, inv = np.unique(column[few], return_inverse=True)
        k = int(m[few].max())
        out[:, few] = _cool_down(p, _graph(p, k)[1], _ends(p, k, dur[:, used]), m[few], inv.reshape(-1),
                                 b_dur[:, used])
        todo &= ~few
    # the rest: one run of 8 k1 for their columns, evaluated level by level up to where a run
    # of k1, 2 k1, 4 k1 would begin its cool-down, dropping the columns done at each of them
    cols = np.flatnonzero(todo)
    if len(cols) == 0:
        return out
    longest = 8 * k1
    rows = _graph(p, longest)[1]
    used, inv = np.unique(column[cols], return_inverse=True)
    inv = inv.reshape(-1)
    end, earlier, before = None, None, k1
    for k in (k1, 2 * k1, 4 * k1, longest):
        end = _ends(p, longest, dur[:, used], _steady_levels(p, k), end)
        ends = _cool_down(p, rows, end, np.full(len(used), k), np.arange(len(used)), b_dur[:, used])
        short = m[cols] <= k  # exact: the run's tasks and the plan's own cool-down
        out[:, cols[short]] = _cool_down(p, rows, end, m[cols[short]], inv[short], b_dur[:, used])
        periodic, period = _periodic(p, k, rows, end)
        done = ~short & periodic[inv]
        out[:, cols[done]] = ends[:, inv[done]] + (m[cols[done]] - k) * period[inv[done]]
        finished = short | done
        if k == longest and earlier is not None:
            # still drifting: past the run the finish is above the chord's line and below the pace's
            drift = np.flatnonzero(~finished)
            top, mb = ends[:, inv[drift]], m[cols[drift]]
            slope = (top - earlier[:, inv[drift]]) / (k - before)
            low, high = top + (mb - k) * slope, top + (mb - k) * pace[cols[drift]]
            narrow = np.all(high - low <= 2 * DRIFT_BOUND * low, axis=0)
            out[:, cols[drift[narrow]]] = ((low + high) / 2)[:, narrow]
            finished[drift[narrow]] = True
        todo[cols[finished]] = False
        cols, inv = cols[~finished], inv[~finished]
        if len(cols) == 0:
            return out
        keep, inv = np.unique(inv, return_inverse=True)
        inv = inv.reshape(-1)
        used, end, earlier, before = used[keep], end[:, keep], ends[:, keep], k
    for mb in np.unique(m[todo]).tolist():  # drifts too wide to bracket
        sel = np.flatnonzero(todo & (m == mb))
        used, inv = np.unique(column[sel], return_inverse=True)
        out[:, sel] = _whole(p, mb, dur[:, used])[:, inv.reshape(-1)]
    return out
