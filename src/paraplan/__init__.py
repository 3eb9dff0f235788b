"""paraplan: predict, before spending a GPU-hour, how long an LLM training iteration takes,
how much memory each GPU needs, what the run costs, and which parallel plan is best."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from paraplan.prediction import Prediction
    from paraplan.specs import Job

__all__ = ["__version__", "load_job", "one_batch_predict", "predict"]


def predict(
    job: Job | dict[str, Any] | str, *, backend: str | None = None, models: str | None = None, **kwargs: Any
) -> Prediction:
    """Predict one iteration. ``job`` is a Job, a job mapping, or the path of a job file;
    ``models`` (a file from ``paraplan fit``) selects the learned backend."""
    from paraplan.catalog import load_job, resolve_job
    from paraplan.prediction import predict as _predict
    from paraplan.prediction.backends import load_model_file, make_cost_model

    if isinstance(job, str):
        job = load_job(job)
    elif isinstance(job, dict):
        job = resolve_job(job)
    from paraplan.specs import HeteroJob

    if isinstance(job, HeteroJob):
        from paraplan.prediction.hetero import predict_hetero

        return predict_hetero(job, **kwargs)
    backend = backend or ("learned" if models is not None else "analytical")
    fitted = load_model_file(models) if models is not None else None
    cost_model = make_cost_model(job, backend, fitted)
    for note in getattr(cost_model, "notes", ()):
        import warnings

        warnings.warn(f"{models}: {note}", stacklevel=2)
    return _predict(job, cost_model, **kwargs)


def one_batch_predict(job: Job | dict[str, Any] | str, models: str | None = None) -> float:
    """Microseconds of one training iteration (one global batch), as the Distributed Training
    Estimator's ``one_batch_predict`` returns; learned backend when ``models`` is given."""
    return predict(job, models=models).iteration_s * 1e6


def load_job(path: str) -> Job:
    """Read and validate a job file (YAML or JSON)."""
    from paraplan.catalog import load_job as _load_job

    return _load_job(path)
