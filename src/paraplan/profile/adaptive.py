"""Adaptive sampling: measure the shapes the regressors know least, stop at a target error.

The engine does not know how a point is measured. It gets a :class:`Pool` of candidate shapes
of one regressor (one device, dtype, operator and direction, or one collective and link) with
the features and analytical baselines ``paraplan fit`` computes for them
(:func:`paraplan.costmodel.fitting.fit_tasks`), a ``measure(points) -> seconds`` callable, and a
:class:`HeldOut` set of measured shapes it never trains on. Then:

1. a space-filling seed (greedy max-min distance in the scaled feature space) is measured;
2. a random forest of :class:`~paraplan.regress.ResidualRegressor` trees learns
   log(measured / analytical), as ``paraplan fit`` does, and is scored on the held-out set
   (median |predicted - measured| / measured);
3. unless that error is at the target, the next batch is the candidates with the highest
   score = spread of the trees' predictions (where the bootstrap models disagree) + the
   out-of-bag error of the nearest measured shape (where the current error is largest), among
   a random shortlist of a few times the batch (scoring the whole pool chases its corners and
   edges, which a median over typical shapes does not reward: replayed, it needed more samples
   than random order);
4. repeat until the target is met, the pool is exhausted or ``max_samples`` are measured.

``order="random"`` runs the same loop on a random order of the pool: the baseline adaptive
sampling is compared against.

``stop="oob"`` judges step 3 by the forest's out-of-bag median |error| over the measured shapes
instead, so no held-out set has to be measured at all (a live sweep then times only the shapes
the loop trains on). A held-out set, when given, is still scored at every step (a replay's
honest check of where the out-of-bag stop left the error) but never decides the stop. :func:`pools_from_samples` turns a samples table into pools;
with measured ``time_s`` it is a replay (``benchmarks/adaptive_replay.py``), with an empty one
it is the grid a live sampler will measure.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paraplan.regress.estimators import ResidualRegressor

__all__ = [
    "AdaptiveRun",
    "HeldOut",
    "Pool",
    "Step",
    "heldout_error",
    "pools_from_samples",
    "sample_adaptively",
    "split_pool",
]

ORDERS = ("adaptive", "random")
STOPS = ("holdout", "oob")
#: The stop reason of a run cut short by its deadline (``paraplan profile adaptive --max-time``).
BUDGET_SPENT = "time budget spent"
#: The forest the loop fits: its trees are the ensemble whose spread marks disagreement.
FOREST_PARAMS: dict[str, Any] = {"n_estimators": 60, "min_samples_leaf": 1, "max_features": 1.0, "oob_score": True}

Measure = Callable[[Any], Any]


@dataclass(frozen=True)
class Pool:
    """Candidate shapes of one regressor: ``points`` (sample-record rows, one per distinct
    shape; ``time_s`` holds a replay's measured time, NaN when not yet measured), their
    feature matrix ``X`` and analytical baseline seconds."""

    key: str
    points: Any  # pandas DataFrame, sample-record columns
    X: np.ndarray
    baseline: np.ndarray
    feature_names: list[str]

    def __len__(self) -> int:
        return len(self.baseline)

    def subset(self, rows: Any) -> Pool:
        rows = np.asarray(rows, dtype=int)
        return Pool(self.key, self.points.iloc[rows], self.X[rows], self.baseline[rows], self.feature_names)


@dataclass(frozen=True)
class HeldOut:
    """Measured shapes the loop is scored on and never trains on."""

    X: np.ndarray
    baseline: np.ndarray
    time_s: np.ndarray

    @classmethod
    def measured(cls, pool: Pool, measure: Measure) -> HeldOut:
        """Measure every shape of ``pool``; those ``measure`` cannot time (NaN) are left out."""
        times = _seconds(measure(pool.points), len(pool))
        ok = np.isfinite(times)
        return cls(pool.X[ok], pool.baseline[ok], times[ok])


@dataclass(frozen=True)
class Step:
    """The errors after training on ``n_samples`` shapes (fractions of time): on the held-out
    set, and out of bag on the measured shapes."""

    n_samples: int
    median_error: float  # median |predicted - measured| / measured (NaN: no held-out set)
    mean_error: float
    signed_median: float  # median (predicted - measured) / measured
    oob_error: float = math.nan  # the forest's out-of-bag median |error| over the measured shapes


@dataclass
class AdaptiveRun:
    """What one loop measured and how the held-out error went."""

    key: str
    order: str
    target_error: float
    chosen: np.ndarray  # pool rows, in the order they were measured
    time_s: np.ndarray  # their measured seconds
    steps: list[Step] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # pool rows ``measure`` could not time (NaN)
    stop_reason: str = ""  # "target reached", "pool exhausted", "max_samples reached", BUDGET_SPENT
    stop: str = "holdout"  # the error the target is judged on: "holdout" or "oob" (out-of-bag)

    @property
    def reached(self) -> bool:
        return self.stop_reason == "target reached"

    @property
    def n_samples(self) -> int:
        return len(self.chosen)

    @property
    def median_error(self) -> float:
        """The held-out median error at the end."""
        return self.steps[-1].median_error if self.steps else math.nan

    @property
    def best_error(self) -> float:
        return min((s.median_error for s in self.steps), default=math.nan)

    @property
    def stop_error(self) -> float:
        """The error the stop was judged on, at the end: held-out or out-of-bag median."""
        if not self.steps:
            return math.nan
        return self.steps[-1].oob_error if self.stop == "oob" else self.steps[-1].median_error


def sample_adaptively(
    pool: Pool,
    measure: Measure,
    heldout: HeldOut | None = None,
    *,
    target_error: float = 0.05,
    batch_size: int = 16,
    seed_size: int | None = None,
    growth: float = 0.0,
    max_samples: int | None = None,
    order: str = "adaptive",
    shortlist: int = 4,
    random_state: int = 0,
    stop: str = "holdout",
    deadline: float | None = None,
) -> AdaptiveRun:
    """Measure batches of ``pool`` until the median error is at most ``target_error``: on
    ``heldout`` (``stop="holdout"``), or the forest's out-of-bag error over the measured shapes
    (``stop="oob"``; ``heldout`` is then optional and only scored, never used to stop).

    ``measure(points)`` gets a DataFrame of pool rows and returns their seconds (NaN for a
    shape it cannot time, e.g. out of memory: it is skipped and never asked again). Batches have
    ``max(batch_size, growth * measured so far)`` shapes (``growth`` > 0 makes the schedule
    geometric); the seed has ``seed_size`` (default: ``max(batch_size, 10)``). ``order`` is
    "adaptive" or "random". An adaptive batch is the best-scored ``batch`` of a random shortlist
    of ``shortlist`` times as many unmeasured shapes (0: score the whole pool). Deterministic
    for a given ``random_state``. ``deadline`` (a :func:`time.monotonic` time): no batch is
    started after it (the batch in hand is finished); the run stops with "time budget spent".
    """
    if order not in ORDERS:
        raise ValueError(f"order: {order!r} is not one of {', '.join(ORDERS)}")
    if stop not in STOPS:
        raise ValueError(f"stop: {stop!r} is not one of {', '.join(STOPS)}")
    if not 0.0 < target_error:
        raise ValueError("target_error: must be > 0")
    if batch_size < 1:
        raise ValueError("batch_size: must be at least 1")
    if shortlist < 0:
        raise ValueError("shortlist: must be >= 0")
    if len(pool) == 0:
        raise ValueError(f"{pool.key}: the pool is empty")
    rng = np.random.default_rng(random_state)
    limit = len(pool) if max_samples is None else min(len(pool), int(max_samples))
    scaled = _scaled(pool.X)
    permutation = rng.permutation(len(pool))
    first = max(batch_size, 10) if seed_size is None else seed_size
    first = min(max(2, first), limit)
    chosen = permutation[:first] if order == "random" else _maximin(scaled, first, rng)
    if stop == "holdout" and (heldout is None or len(heldout.time_s) == 0):
        raise ValueError(f"{pool.key}: the held-out set is empty (stop='oob' needs none)")
    if heldout is not None and len(heldout.time_s) == 0:
        heldout = None
    run = AdaptiveRun(pool.key, order, target_error, np.empty(0, dtype=int), np.empty(0), stop=stop)
    if _spent(deadline):
        run.stop_reason = BUDGET_SPENT
        return run
    _add(run, pool, measure, np.asarray(chosen, dtype=int))
    tried = len(chosen)
    while True:
        if len(run.chosen) < 2:
            if tried >= limit:
                run.stop_reason = "pool exhausted"
                return run
            if _spent(deadline):
                run.stop_reason = BUDGET_SPENT
                return run
            batch = _unmeasured(permutation, run)[: max(batch_size, 2)]
            _add(run, pool, measure, batch)
            tried += len(batch)
            continue
        model = _fit(pool, run, random_state)
        run.steps.append(_score(model, heldout, pool, run))
        if run.stop_error <= target_error:
            run.stop_reason = "target reached"
            return run
        if tried >= len(pool):
            run.stop_reason = "pool exhausted"
            return run
        if tried >= limit:
            run.stop_reason = "max_samples reached"
            return run
        if _spent(deadline):
            run.stop_reason = BUDGET_SPENT
            return run
        size = min(max(batch_size, math.ceil(growth * len(run.chosen))), limit - tried)
        if order == "random":
            batch = _unmeasured(permutation, run)[:size]
        else:
            batch = _next_batch(pool, scaled, run, model, size, rng, shortlist)
        _add(run, pool, measure, batch)
        tried += len(batch)


def _spent(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def _unmeasured(rows: np.ndarray, run: AdaptiveRun) -> np.ndarray:
    return rows[np.isin(rows, np.concatenate([run.chosen, run.skipped]), invert=True)]


def _add(run: AdaptiveRun, pool: Pool, measure: Measure, batch: np.ndarray) -> None:
    """Measure ``batch`` (pool rows); the timed join ``run.chosen``, the rest ``run.skipped``."""
    if len(batch) == 0:
        return
    times = _seconds(measure(pool.points.iloc[batch]), len(batch))
    ok = np.isfinite(times)
    run.chosen = np.concatenate([run.chosen, batch[ok]])
    run.time_s = np.concatenate([run.time_s, times[ok]])
    run.skipped += [int(i) for i in batch[~ok]]


def heldout_error(estimator: Any, heldout: HeldOut) -> Step:
    """The held-out errors of any fitted residual regressor (``predict`` -> log ratio)."""
    return _step(estimator.predict(heldout.X), heldout, 0)


def split_pool(pool: Pool, fraction: float = 0.2, random_state: int = 0) -> tuple[Pool, Pool]:
    """(candidates, held-out): a random ``fraction`` of the shapes is set aside."""
    if not 0.0 < fraction < 1.0:
        raise ValueError("fraction: must be in (0, 1)")
    order = np.random.default_rng(random_state).permutation(len(pool))
    cut = max(1, round(fraction * len(pool)))
    return pool.subset(np.sort(order[cut:])), pool.subset(np.sort(order[:cut]))


def pools_from_samples(samples: Any, hardware: Any = None) -> list[Pool]:
    """One pool per regressor ``paraplan fit`` would fit on ``samples``, with its features
    (GPUs outside the catalog from ``hardware``, a :class:`paraplan.costmodel.fitting.Hardware`).

    Rows with identical features (one shape timed twice, or shapes the operator does not tell
    apart) become one candidate; its ``time_s`` is their geometric mean (NaN if unmeasured).
    """
    import pandas as pd

    from paraplan.costmodel.fitting import Hardware, fit_tasks

    frame = samples.copy()
    frame["time_s"] = frame["time_s"].fillna(1.0)  # fit_tasks reads it; the pool does not use it
    pools = []
    for task in fit_tasks(frame, hardware=hardware or Hardware()):
        _, first, inverse = np.unique(task.X.round(9), axis=0, return_index=True, return_inverse=True)
        inverse = np.asarray(inverse).reshape(-1)
        points = samples.loc[task.index[first]].copy()
        logs = np.log(samples.loc[task.index, "time_s"].to_numpy(dtype=float))
        points["time_s"] = np.exp(pd.Series(logs).groupby(inverse).mean().to_numpy())
        pools.append(Pool(task.key, points, task.X[first], task.baseline[first], list(task.feature_names)))
    return pools


def _seconds(times: Any, n: int) -> np.ndarray:
    out = np.asarray(times, dtype=float).reshape(-1)
    if len(out) != n or not np.all(np.isnan(out) | (np.isfinite(out) & (out > 0))):
        raise ValueError(f"measure: expected {n} finite positive times (or NaN), got {out.tolist()[:5]}")
    return out


def _scaled(X: np.ndarray) -> np.ndarray:
    """Features mapped to [0, 1] over the pool, so distances weigh every feature alike."""
    lo, hi = X.min(axis=0), X.max(axis=0)
    return (X - lo) / np.where(hi > lo, hi - lo, 1.0)


def _maximin(scaled: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` rows spread over the space: a random start, then each the farthest from those
    already taken."""
    picked = [int(rng.integers(len(scaled)))]
    distance = np.linalg.norm(scaled - scaled[picked[0]], axis=1)
    while len(picked) < n:
        nxt = int(np.argmax(distance))
        picked.append(nxt)
        distance = np.minimum(distance, np.linalg.norm(scaled - scaled[nxt], axis=1))
    return np.asarray(picked, dtype=int)


def _fit(pool: Pool, run: AdaptiveRun, random_state: int) -> ResidualRegressor:
    y = np.log(run.time_s / pool.baseline[run.chosen])
    params = dict(FOREST_PARAMS, oob_score=len(run.chosen) >= 4)
    with warnings.catch_warnings():
        # A few shapes may be in every bootstrap sample at first (no out-of-bag score): they
        # count as no error, not as a warning on the terminal.
        warnings.simplefilter("ignore", UserWarning)
        return ResidualRegressor("rforest", params, random_state).fit(pool.X[run.chosen], y)


def _score(model: ResidualRegressor, heldout: HeldOut | None, pool: Pool, run: AdaptiveRun) -> Step:
    """The held-out errors (NaN without a held-out set) and the out-of-bag median |error|."""
    n = len(run.chosen)
    step = _step(model.predict(heldout.X), heldout, n) if heldout is not None else Step(n, *[math.nan] * 3)
    return Step(step.n_samples, step.median_error, step.mean_error, step.signed_median, _oob_error(model, pool, run))


def _oob_error(model: ResidualRegressor, pool: Pool, run: AdaptiveRun) -> float:
    """Median |relative error| of each measured shape predicted by the trees that did not see
    it (NaN when no shape has such a prediction yet)."""
    forest = model.estimator_
    if not hasattr(forest, "oob_prediction_"):
        return math.nan
    y = np.log(run.time_s / pool.baseline[run.chosen])
    pred = np.asarray(forest.oob_prediction_, dtype=float).reshape(len(y), -1)[:, 0]
    # A shape in every bootstrap sample has no out-of-bag prediction (sklearn leaves NaN or 0).
    ok = np.isfinite(pred)
    if not ok.any():
        return math.nan
    return float(np.median(np.abs(np.expm1(pred[ok] - y[ok]))))


def _step(pred_log_ratio: Any, heldout: HeldOut, n: int) -> Step:
    relative = heldout.baseline * np.exp(np.asarray(pred_log_ratio, dtype=float)) / heldout.time_s - 1.0
    return Step(int(n), float(np.median(np.abs(relative))), float(np.mean(np.abs(relative))), float(np.median(relative)))


def _next_batch(
    pool: Pool,
    scaled: np.ndarray,
    run: AdaptiveRun,
    model: ResidualRegressor,
    size: int,
    rng: np.random.Generator,
    shortlist: int,
) -> np.ndarray:
    """The ``size`` unmeasured rows (of a random shortlist of ``shortlist * size``, or of all
    when 0) with the highest disagreement + nearby error."""
    from scipy.spatial import cKDTree

    free = np.setdiff1d(np.arange(len(pool)), np.concatenate([run.chosen, run.skipped]).astype(int))
    if len(free) <= size:
        return free
    if shortlist:
        # Scoring a random shortlist, not the whole pool, keeps the batch spread like the
        # pool itself: the held-out median is over typical shapes, not the pool's corners.
        free = np.sort(rng.choice(free, size=min(len(free), shortlist * size), replace=False))
    forest = model.estimator_
    X32 = np.ascontiguousarray(pool.X[free], dtype=np.float32)
    per_tree = np.stack([tree.tree_.predict(X32).reshape(len(free), -1)[:, 0] for tree in forest.estimators_])
    spread = per_tree.std(axis=0)
    nearby = np.zeros(len(free))
    if hasattr(forest, "oob_prediction_"):
        y = np.log(run.time_s / pool.baseline[run.chosen])
        oob_error = np.abs(np.nan_to_num(forest.oob_prediction_ - y))
        _, nearest = cKDTree(scaled[run.chosen]).query(scaled[free])
        nearby = oob_error[nearest]
    score = spread + nearby
    return free[np.argsort(-score, kind="stable")[:size]]
