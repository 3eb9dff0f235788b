"""Validated runs as the residuals an interval is earned from (``paraplan.uncertainty``):
each run's source, regime and log(measured / predicted iteration time)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from paraplan.uncertainty.coverage import Held
from paraplan.uncertainty.regimes import regime_of
from paraplan.validate.result import RunValidation


def held_runs(results: Iterable[RunValidation]) -> list[Held]:
    """Each validated run's source, regime and signed log-residual."""
    return [Held(r.run_id, r.source, regime_of(r.prediction), math.log(r.measured_iteration_s / r.prediction.iteration_s))
            for r in results]
