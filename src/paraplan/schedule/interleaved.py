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
come from one walk of the stages in turn (``unit_levels``). A test
compares the graph with ``_structure``'s and the times with ``simulate_pipeline``'s.
``schedule.interleaved_runs`` times many plans at once from runs of this graph.
"""

from __future__ import annotations

import functools

from paraplan.schedule.graph import in_level_order


def positions(p: int, m: int, v: int):
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
    w, kind, k = positions(p, m, v)
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


def unit_levels(p: int, m: int, v: int, prev, dep):
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
    level = unit_levels(p, m, v, prev, dep)
    return in_level_order(kinds, prev, dep, level, delay if overlap_p2p else None)


def last_tasks(p: int, m: int, v: int) -> list[int]:
    """Each stage's last task's node."""
    length = 2 * m * v
    return [i * length + length - 1 for i in range(p)]


def stage0_done(p: int, m: int, v: int) -> list[int]:
    """The node of stage 0's backward of each micro-batch on chunk 0, in micro-batch order."""
    import numpy as np

    w, _, _ = positions(p, m, v)
    j = np.arange(m)
    k = (j // p) * p * v + (v - 1) * p + j % p
    return _node(p, m, v, w, np.zeros(m, dtype=np.int64), 1, k).tolist()


def warm_up(p: int, v: int) -> int:
    """Stage 0's warm-up forwards when the run is long enough to hold them (the most of any stage)."""
    return 2 * (p - 1) + (v - 1) * p


def tainted_from(p: int, m: int, v: int, prev, dep):
    """Each stage's first position whose task differs from a longer run's: its cool-down, or
    earlier where the task waits (through its input, or through the stage's previous task) on a
    task that differs; the differing tasks are a suffix of every stage's order."""
    import numpy as np

    length = 2 * m * v
    w, _, _ = positions(p, m, v)
    first = (length - w[:, 0]).astype(np.int64)
    stage = np.arange(p * length) // length
    pos = np.arange(p * length) % length
    while True:
        tainted = pos >= first[stage]
        hit = (dep >= 0) & tainted[np.maximum(dep, 0)] & ~tainted
        if not hit.any():
            return first
        np.minimum.at(first, stage[hit], pos[hit])
