"""Predict one training iteration: ``predict`` (a job and a cost model in, a ``Prediction``
out) and what a prediction is made of. The modules hold the rest: the one door that chooses the
homogeneous or heterogeneous path and the cost model (``entry.predict_any``), what a stage
costs (``stages``), memory (``memory``), the heterogeneous path (``hetero``) and the choice of
cost model (``backends``)."""

from paraplan.prediction.facade import predict
from paraplan.prediction.memory import PlanMemory, StageMemory
from paraplan.prediction.result import (
    Breakdown,
    CollectiveEstimate,
    OpEstimate,
    Placement,
    Prediction,
    StageTiming,
)

__all__ = [
    "Breakdown",
    "CollectiveEstimate",
    "OpEstimate",
    "Placement",
    "PlanMemory",
    "Prediction",
    "StageMemory",
    "StageTiming",
    "predict",
]
