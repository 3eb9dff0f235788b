"""Plans ranked by the pessimistic end of their interval (``paraplan search --risk``), and
whether a budget or deadline still holds at the interval's far end."""

from __future__ import annotations

import math

from paraplan.prediction import Prediction
from paraplan.uncertainty.interval import Interval


def pessimistic_score(pred: Prediction, interval: Interval, objective: str) -> float:
    """Lower is better: seconds per token at the interval's slow end (objective time), or
    dollars per million tokens at its dear end (objective cost; needs a price)."""
    slow = math.exp(interval.high)
    if objective == "cost" and pred.usd_per_million_tokens is not None:
        return pred.usd_per_million_tokens * slow
    return slow / pred.tokens_per_s


def far_end_checks(pred: Prediction, interval: Interval, budget_usd: float | None,
                   deadline_s: float | None) -> list[tuple[str, float, float, bool]]:
    """(bound, the figure at the interval's far end, the limit, holds) for the deadline and the
    budget that were given and the plan has a figure for."""
    out = []
    if deadline_s is not None and pred.time_to_train_s is not None:
        far = interval.time(pred.time_to_train_s)[1]
        out.append(("deadline", far, deadline_s, far <= deadline_s))
    if budget_usd is not None and pred.cost_to_train_usd is not None:
        far = interval.time(pred.cost_to_train_usd)[1]
        out.append(("budget", far, budget_usd, far <= budget_usd))
    return out
