"""paraplan: predict, before spending a GPU-hour, how long an LLM training iteration takes,
how much memory each GPU needs, what the run costs, and which parallel plan is best."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paraplan._version import __version__

if TYPE_CHECKING:
    from paraplan.prediction import Prediction
    from paraplan.specs import Job

__all__ = ["__version__", "load_job", "one_batch_predict", "predict"]


def predict(
    job: Job | dict[str, Any] | str, *, backend: str | None = None, models: str | None = None, **kwargs: Any
) -> Prediction:
    """Predict one iteration. ``job`` is a Job, a job mapping, or the path of a job file;
    ``models`` (a file from ``paraplan fit``) selects the learned backend; a job on node groups
    of different GPUs is predicted analytically (``prediction.entry.predict_any`` chooses)."""
    import warnings

    from paraplan.catalog import load_job, resolve_job
    from paraplan.prediction.entry import predict_any

    if isinstance(job, str):
        job = load_job(job)
    elif isinstance(job, dict):
        job = resolve_job(job)
    notes: list[str] = []
    prediction = predict_any(job, backend=backend, models=models, notes=notes, **kwargs)
    for note in notes:
        warnings.warn(note, stacklevel=2)
    return prediction


def one_batch_predict(job: Job | dict[str, Any] | str, models: str | None = None) -> float:
    """Microseconds of one training iteration (one global batch), as the Distributed Training
    Estimator's ``one_batch_predict`` returns; learned backend when ``models`` is given."""
    return predict(job, models=models).iteration_s * 1e6


def load_job(path: str) -> Job:
    """Read and validate a job file (YAML or JSON)."""
    from paraplan.catalog import load_job as _load_job

    return _load_job(path)
