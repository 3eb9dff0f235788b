"""Split-conformal prediction intervals from signed log-residuals.

Lei, G'Sell, Rinaldo, Tibshirani & Wasserman, "Distribution-Free Predictive Inference for
Regression", JASA 113 (2018), section 2.2 (split conformal); Vovk, Gammerman & Shafer,
"Algorithmic Learning in a Random World" (2005). With n calibration residuals
r = log(measured / predicted), exchangeable with the residual of a new run, the k-th smallest
and the k-th largest, k = ceil((n + 1)(1 - alpha/2)), bound the new residual with probability
at least 1 - alpha (each side missing at most alpha/2): an asymmetric interval, since
paraplan's errors have a sign. With too few residuals (k > n) there is no such bound: None.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def conformal_rank(n: int, level: float) -> int:
    """The finite-sample rank ceil((n + 1)(1 - alpha/2)) of a two-sided ``level`` interval
    (alpha = 1 - level) from ``n`` residuals; above ``n``: too few residuals."""
    alpha = 1.0 - level
    # the float product (n + 1) * 0.9 may land a hair above an integer (9.000000000000002)
    return math.ceil((n + 1) * (1.0 - alpha / 2.0) - 1e-9)


def runs_needed(level: float) -> int:
    """The fewest residuals a two-sided ``level`` interval can be had from (rank <= n)."""
    n = 1
    while conformal_rank(n, level) > n:
        n += 1
    return n


def conformal_bounds(residuals: Sequence[float], level: float) -> tuple[float, float] | None:
    """(lower, upper) bounds on a new signed log-residual at ``level``: the (n + 1 - k)-th
    and the k-th smallest of ``residuals``; None when there are too few of them."""
    n = len(residuals)
    k = conformal_rank(n, level)
    if n == 0 or k > n:
        return None
    ordered = sorted(residuals)
    return ordered[n - k], ordered[k - 1]
