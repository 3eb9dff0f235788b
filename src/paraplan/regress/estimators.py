"""The residual regressor: learns y = log(t / b), the measured time over the analytical one.

Trees predict piecewise-constant values taken from their training targets, and the prediction
is further clipped to the residual range seen in training, so a shape far outside the sampled
grid gets a bounded correction of the analytical answer instead of a wild extrapolation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

ALGORITHMS = ("xgboost", "rforest")

# Settings every inner model gets unless ``params`` overrides them. One thread per model: the
# tuner runs two fits at once on this 2-core machine, which beats two threads per fit for the
# small data sets (hundreds to a few thousand rows) that operator sampling produces.
BASE_PARAMS: dict[str, dict[str, Any]] = {
    "xgboost": {
        "n_estimators": 300,
        "max_depth": 6,
        "learning_rate": 0.1,
        "objective": "reg:squarederror",
        "tree_method": "hist",
        "n_jobs": 1,
    },
    "rforest": {"n_estimators": 100, "min_samples_leaf": 1, "max_features": 1.0, "n_jobs": 1},
}


def check_algorithm(algorithm: str) -> str:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm: {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    return algorithm


def make_inner(algorithm: str, params: dict[str, Any] | None, random_state: int) -> Any:
    """An unfitted XGBRegressor or RandomForestRegressor with the base settings and ``params``."""
    check_algorithm(algorithm)
    settings = {**BASE_PARAMS[algorithm], **(params or {}), "random_state": random_state}
    if algorithm == "xgboost":
        from xgboost import XGBRegressor

        return XGBRegressor(**settings)
    from sklearn.ensemble import RandomForestRegressor

    return RandomForestRegressor(**settings)


class ResidualRegressor(RegressorMixin, BaseEstimator):
    """Predict the log residual log(t / b) of measured over analytical time.

    ``algorithm`` is "xgboost" (xgboost.XGBRegressor) or "rforest" (scikit-learn's
    RandomForestRegressor); ``params`` are passed to it on top of :data:`BASE_PARAMS`.

    Fitted state: ``estimator_`` (the inner model), ``residual_min_`` / ``residual_max_`` (the
    range of training targets; predictions are clipped to it), ``n_features_in_`` and, when
    fitted on a DataFrame, ``feature_names_in_``.
    """

    def __init__(self, algorithm: str = "xgboost", params: dict | None = None, random_state: int = 0):
        self.algorithm = algorithm
        self.params = params
        self.random_state = random_state

    def fit(self, X: Any, y: Any) -> ResidualRegressor:
        """Fit to ``y`` = log(t / b). (Named ``y`` as scikit-learn's estimator checks require.)"""
        check_algorithm(self.algorithm)
        X, y = validate_data(self, X, y, dtype=np.float64, y_numeric=True)
        y = np.asarray(y, dtype=np.float64)
        self.estimator_ = make_inner(self.algorithm, self.params, self.random_state).fit(X, y)
        self.residual_min_ = float(y.min())
        self.residual_max_ = float(y.max())
        return self

    def predict(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "estimator_")
        X = self._validated(X)
        if self.algorithm == "rforest":
            return self._clip(_forest_predict(self.estimator_, X))
        return self._clip(self.estimator_.predict(X))

    def staged_predict(self, X: Any, n_estimators: list[int]) -> dict[int, np.ndarray]:
        """Predictions using only the first n trees (boosting rounds), for each n.

        Lets the tuner score several ``n_estimators`` from one fit; n above the fitted count
        is capped to it.
        """
        check_is_fitted(self, "estimator_")
        X = self._validated(X)
        out: dict[int, np.ndarray] = {}
        for n in n_estimators:
            if self.algorithm == "rforest":
                raw = _forest_predict(self.estimator_, X, n)
            else:
                rounds = min(int(n), self.estimator_.get_booster().num_boosted_rounds())
                raw = self.estimator_.predict(X, iteration_range=(0, rounds))
            out[int(n)] = self._clip(raw)
        return out

    def _validated(self, X: Any) -> np.ndarray:
        """X checked against the fitted state. A plain finite float matrix of the right width
        skips scikit-learn's validation, which costs ~1 ms per call; a cost model asks a
        dozen regressors per job."""
        if (
            type(X) is np.ndarray
            and X.dtype == np.float64
            and X.ndim == 2
            and X.shape[0] > 0
            and X.shape[1] == self.n_features_in_
            and not hasattr(self, "feature_names_in_")
            and np.isfinite(X).all()
        ):
            return X
        return validate_data(self, X, dtype=np.float64, reset=False)

    def _clip(self, raw: Any) -> np.ndarray:
        return np.clip(np.asarray(raw, dtype=np.float64), self.residual_min_, self.residual_max_)

    @classmethod
    def from_fitted(
        cls,
        algorithm: str,
        params: dict | None,
        random_state: int,
        inner: Any,
        n_features: int,
        residual_range: tuple[float, float],
    ) -> ResidualRegressor:
        """Rebuild a fitted regressor from its parts (used when loading a model file)."""
        est = cls(algorithm=algorithm, params=params, random_state=random_state)
        est.estimator_ = inner
        est.n_features_in_ = int(n_features)
        est.residual_min_, est.residual_max_ = (float(residual_range[0]), float(residual_range[1]))
        return est


def _forest_predict(forest: Any, X: np.ndarray, n_trees: int | None = None) -> np.ndarray:
    """Mean of the first ``n_trees`` trees of a fitted RandomForestRegressor.

    Same numbers as ``forest.predict`` (a test checks it) without its per-tree joblib
    dispatch, which costs ~15 ms per call for 100 trees: too slow for a cost model that asks
    a dozen regressors per job.
    """
    trees = forest.estimators_[: n_trees or len(forest.estimators_)]
    X32 = np.ascontiguousarray(X, dtype=np.float32)
    total = np.zeros(X32.shape[0], dtype=np.float64)
    for tree in trees:
        total += tree.tree_.predict(X32).reshape(X32.shape[0], -1)[:, 0]
    return total / len(trees)
