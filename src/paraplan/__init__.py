"""paraplan: predict, before spending a GPU-hour, how long an LLM training iteration takes,
how much memory each GPU needs, what the run costs, and which parallel plan is best."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from paraplan.prediction import Prediction
    from paraplan.specs import Job

__all__ = ["__version__", "load_job", "predict"]


def predict(job: Job | dict[str, Any] | str, **kwargs: Any) -> Prediction:
    """Predict one iteration. ``job`` is a Job, a job mapping, or the path of a job file."""
    from paraplan.catalog import load_job, resolve_job
    from paraplan.prediction import predict as _predict

    if isinstance(job, str):
        job = load_job(job)
    elif isinstance(job, dict):
        job = resolve_job(job)
    return _predict(job, **kwargs)


def load_job(path: str) -> Job:
    """Read and validate a job file (YAML or JSON)."""
    from paraplan.catalog import load_job as _load_job

    return _load_job(path)
