"""Enumerations shared by every layer (phases, precisions, schedules...)."""

from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    """When an operator runs within one training iteration."""

    FWD = "fwd"
    BWD_INPUT = "bwd_input"
    BWD_WEIGHT = "bwd_weight"
    RECOMPUTE = "recompute"
    OPTIMIZER = "optimizer"


class Precision(str, Enum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"


class Recompute(str, Enum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class Schedule(str, Enum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"


class Framework(str, Enum):
    """The training framework whose behaviour (grad sync, buffers) the prediction follows."""

    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"
