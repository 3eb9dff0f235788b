"""Learned residuals over the analytical cost model: fit, tune, evaluate and store regressors.

The layer knows nothing about operators: it gets a feature matrix X, the analytical baseline
time b and the measured time t, and learns y = log(t / b).

- :mod:`~paraplan.regress.estimators`: ``ResidualRegressor`` (XGBoost or random forest)
- :mod:`~paraplan.regress.select`: ``fit_best`` (CV tuning, hold-out error), ``learning_curve``
- :mod:`~paraplan.regress.store`: ``save_models`` / ``load_models`` (safe model files)

Names are imported on first use, so ``import paraplan.regress`` stays cheap; scikit-learn and
XGBoost load when a regressor is built or a model file is read.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "ResidualRegressor": "estimators",
    "BUDGETS": "select",
    "FittedRegressor": "select",
    "fit_best": "select",
    "learning_curve": "select",
    "time_error": "select",
    "load_models": "store",
    "read_manifest": "store",
    "save_models": "store",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f"paraplan.regress.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'paraplan.regress' has no attribute {name!r}")
