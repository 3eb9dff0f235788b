"""The exact layer partition of a pipeline: which stage holds how many layers.

Given ``T[s, k-1]``, the seconds stage ``s`` spends on one micro-batch when it holds ``k``
layers (``inf`` where they do not fit in its memory), choose ``k_s >= 1`` with
``sum k_s = L`` minimising the pipeline's iteration time in closed form,

    sum_s T[s, k_s - 1] + (m - 1) * max_s T[s, k_s - 1]

(the fill and drain pass every stage once; the slowest stage paces the other m - 1
micro-batches). This is the screen's closed form: exact for equal stages, an estimate for
unequal ones (a slow first stage hides part of the fill, so it can overestimate the 1F1B
schedule by up to ~20 % on small m). The search therefore predicts the chosen splits in full
and refines the best one with the full prediction (``search.hetero.refine_split``).

Method: for a bottleneck ``B``, each stage may hold at most ``K_s(B)`` layers (those with
``T <= B``); among those partitions the smallest sum is found greedily, which is exact
because each row of ``T`` is convex in ``k`` (a maximum of lines: a stage's time is linear in
its layers on one GPU type, the slowest type on a mixed stage) -- the cheapest
``L - S`` of the allowed marginal costs, taken in increasing order, form a prefix of every
row. The objective is then minimised over the finitely many bottlenecks (the values of ``T``)
from the smallest feasible one upward, stopping once ``(m - 1) B`` alone exceeds the best
found. Rows that are not convex are rejected. Tests compare it with brute force (exact for
this objective).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Partition:
    layers: tuple[int, ...]  # per stage
    stage_s: tuple[float, ...]  # T[s, k_s - 1]
    objective_s: float  # sum + (m - 1) * max


def closed_form_s(stage_s: np.ndarray | list[float], num_microbatches: int) -> float:
    t = np.asarray(stage_s, dtype=float)
    return float(t.sum() + (num_microbatches - 1) * t.max())


def partition_layers(stage_s: np.ndarray, num_microbatches: int) -> Partition | None:
    """The optimal partition of ``T = stage_s`` (shape ``(S, L)``) or ``None`` when no
    partition fits (see the module docstring)."""
    T = np.asarray(stage_s, dtype=float)
    S, L = T.shape
    m = num_microbatches
    if S > L or not np.all(np.isfinite(T[:, 0])):
        return None
    if S == 1:
        if not np.isfinite(T[0, L - 1]):
            return None
        return Partition((L,), (float(T[0, L - 1]),), float(m * T[0, L - 1]))
    with np.errstate(invalid="ignore"):
        D = np.diff(T, axis=1)  # D[s, j]: cost of stage s's (j + 2)-th layer; inf once it does not fit
    finite = np.isfinite(D)
    Dm = np.where(finite, D, np.inf)
    tol = 1e-9 * (np.abs(D[finite]).max(initial=0.0) + np.abs(T[:, 0]).max())
    with np.errstate(invalid="ignore"):
        if np.any(Dm < -tol) or np.any(np.diff(Dm, axis=1) < -tol):
            raise ValueError("stage times must grow, and not ever more slowly, with the number of layers")
    extra = L - S
    base = T[:, 0].sum()
    flat = Dm.ravel()
    # cheapest marginal first; among equal ones, the one leaving its stage fastest (balance)
    order = np.lexsort((np.where(finite, T[:, 1:], np.inf).ravel(), flat))
    cap_layers = np.where(finite, np.arange(2, L + 1)[None, :], 0).max(axis=1, initial=1)
    cap_layers = np.maximum(cap_layers, 1)
    if cap_layers.sum() < L:
        return None
    c_min = base + flat[order[:extra]].sum() if extra else base
    # candidate bottlenecks: the values of T, from the smallest that admits a partition
    cands = np.unique(T[np.isfinite(T)])
    cands = cands[cands >= T[:, 0].max()]
    counts = np.zeros(len(cands), dtype=np.int64)
    for s in range(S):
        counts += np.searchsorted(T[s], cands, side="right")
    cands = cands[counts >= L]
    best: tuple[float, np.ndarray] | None = None
    thresholds = np.where(finite, T[:, 1:], np.inf).ravel()[order]  # the B each marginal needs
    for B in cands:
        if best is not None and (m - 1) * B + c_min >= best[0]:
            break
        allowed = order[thresholds <= B][:extra]
        k = np.ones(S, dtype=np.int64)
        np.add.at(k, allowed // (L - 1), 1)
        t = T[np.arange(S), k - 1]
        value = t.sum() + (m - 1) * t.max()
        if best is None or value < best[0] - 1e-15 * value:
            best = (float(value), k)
    assert best is not None
    k = best[1]
    t = T[np.arange(S), k - 1]
    return Partition(tuple(int(x) for x in k), tuple(float(x) for x in t), best[0])
