"""Uncertainty intervals on predictions, earned from measured errors (issue 29).

``conformal``: split-conformal bounds from signed log-residuals (Lei et al. 2018). ``regimes``:
what drives a prediction's error (GPU calibrated or not, framework preset or engine defaults,
dense or MoE) and the residuals of the dev runs in each, from ``catalog/intervals.yaml``.
``interval``: a prediction's interval at a level, with the rule that gave it. ``guessed``: the
spread of a prediction over the plausible values of each setting the job did not state.
Measured runs shape only the interval, never the point prediction.
"""

from paraplan.uncertainty.conformal import conformal_bounds, conformal_rank, runs_needed
from paraplan.uncertainty.interval import Interval, check_level, interval_for
from paraplan.uncertainty.regimes import Regime, ResidualTable, load_residuals, regime_of

__all__ = [
    "Interval",
    "Regime",
    "ResidualTable",
    "check_level",
    "conformal_bounds",
    "conformal_rank",
    "interval_for",
    "load_residuals",
    "regime_of",
    "runs_needed",
]
