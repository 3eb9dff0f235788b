"""Predict one training iteration: the facade (``predict``, ``predict_hetero``), what a
prediction is (``result``), what a stage costs (``stages``), memory, and the choice of cost
model (``backends``)."""

from paraplan.prediction.facade import all_ops, assemble_prediction, predict, stage_sends_s
from paraplan.prediction.memory import PlanMemory, StageMemory
from paraplan.prediction.result import (
    Breakdown,
    CollectiveEstimate,
    OpEstimate,
    Placement,
    Prediction,
    StageTiming,
)
from paraplan.prediction.stages import (
    BACKWARD,
    CommCosts,
    LayerCost,
    explain_layer,
    exposed_beside,
    layer_costs,
    ops_seconds,
    stage_timing,
)

__all__ = [
    "BACKWARD",
    "Breakdown",
    "CollectiveEstimate",
    "CommCosts",
    "LayerCost",
    "OpEstimate",
    "Placement",
    "PlanMemory",
    "Prediction",
    "StageMemory",
    "StageTiming",
    "all_ops",
    "assemble_prediction",
    "explain_layer",
    "exposed_beside",
    "layer_costs",
    "ops_seconds",
    "predict",
    "stage_sends_s",
    "stage_timing",
]
