"""Validated, frozen configuration types: what a job is made of."""

from paraplan.specs.enums import (
    AttentionKernel,
    FP8Recipe,
    Framework,
    MemoryKernel,
    Phase,
    Precision,
    Recompute,
    Schedule,
)
from paraplan.specs.errors import (
    ConfigError,
    InternalError,
    format_validation_error,
    positive_value,
    short_repr,
)
from paraplan.specs.hardware import (
    ClusterSpec,
    CollectiveCurve,
    EfficiencyCurve,
    EfficiencySpec,
    GpuSpec,
    GroupedGemm,
    HostSpec,
    KernelCurve,
    LinkSpec,
    PrecisionCurves,
    QueuedGap,
    SustainedClock,
    TpOverlap,
)
from paraplan.specs.hetero import HeteroClusterSpec, HeteroJob
from paraplan.specs.job import DEFAULT_MEMORY_HEADROOM, Job
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import PLAN_ALIASES, ParallelPlan
from paraplan.specs.runtime import HostLaunchSpec, RuntimeMemorySpec, UserbuffersGemm, UserbuffersSpec

__all__ = [
    "DEFAULT_MEMORY_HEADROOM",
    "PLAN_ALIASES",
    "AttentionKernel",
    "ClusterSpec",
    "CollectiveCurve",
    "ConfigError",
    "EfficiencyCurve",
    "EfficiencySpec",
    "FP8Recipe",
    "Framework",
    "GpuSpec",
    "GroupedGemm",
    "HeteroClusterSpec",
    "HeteroJob",
    "HostLaunchSpec",
    "HostSpec",
    "InternalError",
    "Job",
    "KernelCurve",
    "LinkSpec",
    "MemoryKernel",
    "ModelSpec",
    "ParallelPlan",
    "Phase",
    "Precision",
    "PrecisionCurves",
    "QueuedGap",
    "Recompute",
    "RuntimeMemorySpec",
    "Schedule",
    "SustainedClock",
    "TpOverlap",
    "UserbuffersGemm",
    "UserbuffersSpec",
    "format_validation_error",
    "positive_value",
    "short_repr",
]
