"""Seconds for each operator and collective: the analytical backend (learned ones plug in here)."""

from paraplan.costmodel.base import CostModel
from paraplan.costmodel.calibration import (
    attention_kernel_gaps,
    attention_kernel_ignored,
    calibration_gaps,
    expert_gaps,
    link_gaps,
    power_gaps,
)
from paraplan.costmodel.collectives import estimate_collective_s
from paraplan.costmodel.roofline import AnalyticalCostModel, estimate_op_s, queued_gap_notes

__all__ = [
    "AnalyticalCostModel",
    "CostModel",
    "attention_kernel_gaps",
    "attention_kernel_ignored",
    "calibration_gaps",
    "estimate_collective_s",
    "estimate_op_s",
    "expert_gaps",
    "link_gaps",
    "power_gaps",
    "queued_gap_notes",
]
