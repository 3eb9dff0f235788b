"""Tune, compare and evaluate residual regressors; learning curves.

Every error here is measured on TIME: the predicted time ``b * exp(pred)`` against the measured
``t``, as ``mean |pred_time - t| / t`` (a fraction). Since ``y = log(t / b)`` this is
``mean |exp(pred - y) - 1|`` and needs no ``b``.

Splits keep duplicate grid points (repeated timings of one shape) on one side: by the caller's
``groups`` if given, otherwise by identical feature rows. The 20 % hold-out is drawn once per
data set with a fixed seed, and :func:`fit_best` and :func:`learning_curve` draw the same one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any

import numpy as np

from paraplan.regress.estimators import ALGORITHMS, ResidualRegressor, check_algorithm
from paraplan.specs import ConfigError

HOLDOUT_FRACTION = 0.2
MIN_DISTINCT_SAMPLES = 10  # fewer distinct shapes than this cannot be tuned and evaluated


@dataclass(frozen=True)
class Budget:
    """How hard :func:`fit_best` tries: folds of cross-validation and the grid per algorithm.

    A grid maps a parameter to the values to try. For ``n_estimators`` only the largest value is
    fitted; the smaller ones are scored on the first trees of that fit.
    """

    folds: int
    grids: dict[str, dict[str, list[Any]]]


BUDGETS: dict[str, Budget] = {
    # Seconds per regressor: for tests and a first look.
    "quick": Budget(
        folds=3,
        grids={
            "xgboost": {"n_estimators": [60, 120], "max_depth": [4, 6], "learning_rate": [0.15]},
            "rforest": {"n_estimators": [30], "min_samples_leaf": [1], "max_features": [1.0]},
        },
    ),
    # The whole A100 set (~40 regressors, ~90k rows) in <= 10 min on 2 cores.
    "default": Budget(
        folds=5,
        grids={
            "xgboost": {"n_estimators": [150, 300, 600], "max_depth": [4, 7], "learning_rate": [0.1]},
            "rforest": {"n_estimators": [60], "min_samples_leaf": [1, 3], "max_features": [1.0]},
        },
    ),
}


@dataclass
class FittedRegressor:
    """One tuned regressor with its provenance and errors (fractions, on time)."""

    key: str  # e.g. "op/linear1/fwd" or "collective/all_reduce"
    estimator: ResidualRegressor
    algorithm: str
    params: dict
    feature_names: list[str]
    n_samples: int
    cv_error: float  # best CV error on the 80 % training part
    holdout_error: float  # tuned on the 80 %, scored on the 20 % hold-out
    baseline_holdout_error: float  # the analytical baseline b on the same hold-out
    x_min: np.ndarray
    x_max: np.ndarray
    cv_errors: dict[str, float] = field(default_factory=dict)  # best CV error per algorithm tried
    fit_seconds: float = 0.0

    def predict_log_ratio(self, X: Any) -> np.ndarray:
        return self.estimator.predict(_matrix(X, self.feature_names, self.key))

    def predict_time(self, X: Any, b: Any) -> np.ndarray:
        """Predicted seconds: the baseline times the learned residual."""
        return np.asarray(b, dtype=np.float64) * np.exp(self.predict_log_ratio(X))

    def outside_range(self, X: Any) -> np.ndarray:
        """Per row: does any feature lie outside the range seen in training?"""
        M = _matrix(X, self.feature_names, self.key)
        return np.any((M < self.x_min) | (M > self.x_max), axis=1)


def time_error(y_log_ratio: Any, pred_log_ratio: Any) -> float:
    """mean |b*exp(pred) - t| / t for y = log(t/b): the error on time, as a fraction."""
    y = np.asarray(y_log_ratio, dtype=np.float64)
    p = np.asarray(pred_log_ratio, dtype=np.float64)
    return float(np.mean(np.abs(np.expm1(p - y))))


def fit_best(
    key: str,
    X: Any,
    b: Any,
    t: Any,
    feature_names: Sequence[str],
    budget: str = "default",
    random_state: int = 0,
    groups: Any = None,
    *,
    algorithms: Sequence[str] = ALGORITHMS,
    n_jobs: int | None = None,
) -> FittedRegressor:
    """Tune each of ``algorithms`` by K-fold CV on 80 % of the rows and keep the better one.

    The kept configuration is refitted on the 80 % to score the 20 % hold-out, then on all rows
    for the returned estimator. ``n_jobs`` fits run at once (threads; default min(2, cores)).
    """
    start = time.perf_counter()
    if budget not in BUDGETS:
        raise ConfigError(f"budget: {budget!r} is not one of {', '.join(BUDGETS)}")
    plan = BUDGETS[budget]
    if isinstance(algorithms, str):
        algorithms = (algorithms,)
    if not algorithms:
        raise ValueError("algorithms: name at least one")
    for algorithm in algorithms:
        check_algorithm(algorithm)
    M, y, groups = _check_data(key, X, b, t, feature_names, groups)
    train, test = holdout_split(groups, random_state)
    jobs = _n_jobs(n_jobs)

    cv_errors: dict[str, float] = {}
    best: tuple[float, str, dict[str, Any]] | None = None
    for algorithm in algorithms:
        scored = _grid_cv(algorithm, plan, M[train], y[train], groups[train], random_state, jobs)
        err, params = min(scored, key=lambda item: item[0])
        cv_errors[algorithm] = err
        if best is None or err < best[0]:
            best = (err, algorithm, params)
    assert best is not None
    cv_error, algorithm, params = best

    def make() -> ResidualRegressor:
        return ResidualRegressor(algorithm=algorithm, params=dict(params), random_state=random_state)

    on_train = make().fit(M[train], y[train])
    holdout_error = time_error(y[test], on_train.predict(M[test]))
    baseline_error = time_error(y[test], np.zeros(len(test)))
    final = make().fit(M, y)
    return FittedRegressor(
        key=key,
        estimator=final,
        algorithm=algorithm,
        params=dict(params),
        feature_names=list(feature_names),
        n_samples=len(y),
        cv_error=cv_error,
        holdout_error=holdout_error,
        baseline_holdout_error=baseline_error,
        x_min=M.min(axis=0),
        x_max=M.max(axis=0),
        cv_errors=cv_errors,
        fit_seconds=time.perf_counter() - start,
    )


def learning_curve(
    X: Any,
    b: Any,
    t: Any,
    fractions: Sequence[float] = (0.1, 0.25, 0.5, 1.0),
    algorithm: str = "xgboost",
    params: dict | None = None,
    random_state: int = 0,
    groups: Any = None,
    *,
    key: str = "learning_curve",
) -> list[tuple[float, int, float]]:
    """(fraction, n_train, hold-out error on time) for nested fractions of the 80 % part.

    Always scored on the same 20 % hold-out as :func:`fit_best` with the same seed and groups;
    pass the kept ``algorithm`` and ``params`` of a FittedRegressor to draw its curve.
    """
    check_algorithm(algorithm)
    if any(not 0.0 < f <= 1.0 for f in fractions):
        raise ValueError("fractions: each must be in (0, 1]")
    width = np.shape(X)[1] if np.ndim(X) == 2 else 0
    names = list(X.columns) if hasattr(X, "columns") else [f"x{i}" for i in range(width)]
    M, y, groups = _check_data(key, X, b, t, names, groups)
    train, test = holdout_split(groups, random_state)
    order = np.random.default_rng(random_state).permutation(train)  # nested subsets
    rows = []
    for fraction in fractions:
        n = min(len(order), max(2, round(fraction * len(order))))
        subset = order[:n]
        est = ResidualRegressor(algorithm, params, random_state).fit(M[subset], y[subset])
        rows.append((float(fraction), int(n), time_error(y[test], est.predict(M[test]))))
    return rows


def holdout_split(groups: np.ndarray, random_state: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (train, test) with about 20 % of the groups held out, fixed by the seed."""
    from sklearn.model_selection import GroupShuffleSplit

    split = GroupShuffleSplit(n_splits=1, test_size=HOLDOUT_FRACTION, random_state=random_state)
    train, test = next(split.split(np.zeros(len(groups)), groups=groups))
    return np.sort(train), np.sort(test)


def row_groups(M: np.ndarray) -> np.ndarray:
    """A group label per row: rows with identical features share one."""
    _, inverse = np.unique(M, axis=0, return_inverse=True)
    return np.asarray(inverse).reshape(-1)


def _grid_cv(
    algorithm: str,
    plan: Budget,
    M: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    random_state: int,
    n_jobs: int,
) -> list[tuple[float, dict[str, Any]]]:
    """(CV error, params) for every point of the algorithm's grid."""
    from joblib import Parallel, delayed
    from sklearn.model_selection import GroupKFold

    grid = plan.grids[algorithm]
    n_trees = sorted(grid.get("n_estimators", [None]))
    others = {k: v for k, v in grid.items() if k != "n_estimators"}
    bases = [dict(zip(others, values, strict=True)) for values in product(*others.values())]
    folds = min(plan.folds, len(np.unique(groups)))
    splits = list(GroupKFold(n_splits=folds, shuffle=True, random_state=random_state).split(M, y, groups))

    def run(base: dict[str, Any], train: np.ndarray, test: np.ndarray) -> dict[Any, np.ndarray]:
        params = dict(base) if n_trees == [None] else {**base, "n_estimators": n_trees[-1]}
        est = ResidualRegressor(algorithm, params, random_state).fit(M[train], y[train])
        if n_trees == [None]:
            return {None: est.predict(M[test])}
        return est.staged_predict(M[test], n_trees)

    tasks = [(base, train, test) for base in bases for train, test in splits]
    results = Parallel(n_jobs=n_jobs, prefer="threads")(delayed(run)(*task) for task in tasks)

    scored = []
    for i, base in enumerate(bases):
        per_fold = results[i * len(splits) : (i + 1) * len(splits)]
        for n in n_trees:
            pred = np.empty_like(y)
            for (_, test), staged in zip(splits, per_fold, strict=True):
                pred[test] = staged[n]
            params = dict(base) if n is None else {**base, "n_estimators": n}
            scored.append((time_error(y, pred), params))
    return scored


def _check_data(
    key: str, X: Any, b: Any, t: Any, feature_names: Sequence[str], groups: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(feature matrix, log residual, group labels), or a one-line ConfigError naming ``key``."""
    names = list(feature_names)
    M = _matrix(X, names, key)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    t = np.asarray(t, dtype=np.float64).reshape(-1)
    if not len(b) == len(t) == M.shape[0]:
        raise ConfigError(f"{key}: X has {M.shape[0]} rows, b {len(b)} and t {len(t)}")
    if not np.all(np.isfinite(M)):
        bad = names[int(np.nonzero(~np.all(np.isfinite(M), axis=0))[0][0])]
        raise ConfigError(f"{key}: feature {bad!r} has NaN or infinite values")
    for label, arr in (("baseline time b", b), ("measured time t", t)):
        if not np.all(np.isfinite(arr) & (arr > 0)):
            raise ConfigError(f"{key}: {label} must be finite and > 0 in every row")
    if groups is None:
        groups = row_groups(M)
    else:
        groups = np.asarray(groups).reshape(-1)
        if len(groups) != len(t):
            raise ConfigError(f"{key}: groups has {len(groups)} labels for {len(t)} rows")
    distinct = len(np.unique(groups))
    if distinct < MIN_DISTINCT_SAMPLES:
        raise ConfigError(
            f"{key}: {distinct} distinct samples, need at least {MIN_DISTINCT_SAMPLES} to fit and evaluate"
        )
    return M, np.log(t / b), groups


def _matrix(X: Any, feature_names: Sequence[str], key: str) -> np.ndarray:
    """X as a float matrix in ``feature_names`` order (DataFrames are reordered by name)."""
    names = list(feature_names)
    if hasattr(X, "columns"):
        missing = [n for n in names if n not in X.columns]
        if missing:
            raise ConfigError(f"{key}: X lacks feature {missing[0]!r}")
        X = X[names]
    M = np.asarray(X, dtype=np.float64)
    if M.ndim != 2 or M.shape[1] != len(names):
        raise ConfigError(f"{key}: X has shape {M.shape}, expected (n, {len(names)}) for {names}")
    return M


def _n_jobs(n_jobs: int | None) -> int:
    return max(1, n_jobs if n_jobs is not None else min(2, os.cpu_count() or 1))
