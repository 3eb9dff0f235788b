"""Choose a cost model by name: ``analytical`` (default) or ``learned`` (with a models file)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paraplan.costmodel import AnalyticalCostModel, CostModel
from paraplan.specs import ConfigError, Job

BACKENDS = ("analytical", "learned")


@dataclass(frozen=True)
class ModelSet:
    """The regressors of a models file and what it records about how they were fitted."""

    models: dict[str, Any]
    metadata: dict[str, Any]

    @property
    def fingerprints(self) -> dict[str, str]:
        return dict(self.metadata.get("fingerprints") or {})


def load_model_file(path: Path | str) -> ModelSet:
    """Regressors and metadata of a models file written by ``paraplan fit``."""
    from paraplan.regress.store import load_models

    models, metadata = load_models(path)
    return ModelSet(models, metadata)


def check_backend(backend: str) -> None:
    """Refuse, in one line naming the available ones, a backend name that is none of ``BACKENDS``."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend: unknown backend {backend!r} (available: {', '.join(BACKENDS)})")


def make_cost_model(job: Job, backend: str, models: ModelSet | None = None) -> CostModel:
    """The cost model for ``job``: the roofline, or learned residuals on top of it."""
    check_backend(backend)
    if backend == "analytical":
        return AnalyticalCostModel.of_plan(job.cluster, job.precision, job.parallel)
    if models is None:
        raise ConfigError("models: the learned backend needs a models file (paraplan fit ... --out FILE)")
    from paraplan.costmodel.learned import LearnedCostModel

    return LearnedCostModel(job.cluster, job.precision, models.models, models.fingerprints, plan=job.parallel)
