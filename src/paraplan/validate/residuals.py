"""Validated runs as the residuals an interval is earned from (``paraplan.uncertainty``):
each run's source, regime and log(measured / predicted iteration time)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from paraplan.uncertainty.coverage import Held
from paraplan.uncertainty.regimes import architecture_of, regime_of
from paraplan.validate.result import RunValidation


def held_runs(results: Iterable[RunValidation]) -> list[Held]:
    """Each validated run's source, regime, signed log-residual and GPU architecture."""
    return [Held(r.run_id, r.source, regime_of(r.prediction), math.log(r.measured_iteration_s / r.prediction.iteration_s),
                 architecture_of(r.prediction.job.cluster.gpu))
            for r in results]
