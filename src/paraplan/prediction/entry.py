"""The one door to a prediction: ``predict_any`` chooses the homogeneous or heterogeneous path
and the cost model, for the Python API (``paraplan.predict``), the CLI, the plan search and the
exports."""

from __future__ import annotations

from pathlib import Path

from paraplan.prediction.backends import ModelSet, check_backend, load_model_file, make_cost_model
from paraplan.prediction.facade import predict
from paraplan.prediction.hetero import predict_hetero
from paraplan.prediction.result import Prediction
from paraplan.specs import ConfigError, HeteroJob, Job


def predict_any(
    job: Job | HeteroJob,
    *,
    backend: str | None = None,
    models: Path | str | ModelSet | None = None,
    keep_timeline: bool = False,
    notes: list[str] | None = None,
) -> Prediction:
    """Predict one iteration of ``job``, homogeneous or on node groups of different GPUs.
    ``backend`` names the cost model (``analytical``, or ``learned`` with ``models``: a models
    file from ``paraplan fit`` or its loaded ``ModelSet``; ``learned`` when only ``models`` is
    given). What the cost model has to say is appended to ``notes`` when given."""
    backend = backend or ("learned" if models is not None else "analytical")
    check_backend(backend)  # before the node-groups rule, so a misspelt name is named as such
    if isinstance(job, HeteroJob):  # node groups of different GPUs
        if backend != "analytical" or models is not None:
            raise ConfigError("backend: a cluster with node groups of different GPUs is predicted analytically")
        return predict_hetero(job, keep_timeline=keep_timeline)
    fitted = models if models is None or isinstance(models, ModelSet) else load_model_file(models)
    cost_model = make_cost_model(job, backend, fitted)
    if notes is not None:
        source = "models" if isinstance(models, ModelSet) else models
        notes.extend(f"{source}: {note}" for note in getattr(cost_model, "notes", ()))
    return predict(job, cost_model, keep_timeline=keep_timeline)
