"""A measured run, whatever its source: one record type for validation.

GPUModeling25's traced runs (``gpumodeling.measured_from_gpumodeling``), published runs
(``published.measured_from_published``) and a profiler trace of a run paraplan has the job of
(``trace.measured_from_trace``) all become a ``MeasuredRun``; ``runs.validate_runs`` predicts
each one's job and compares, the per-component comparison chosen by ``kind``.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.specs import Job

#: What produced a record; each kind has its own way of mapping predictions onto components.
KINDS = ("gpumodeling25", "published", "trace")


@dataclass(frozen=True, slots=True)
class MeasuredComponent:
    """Seconds one part of an iteration took, as the source measured it."""

    name: str  # the source's component name ("stage_fwd", "gemm", "dp exposed", ...)
    stage: str  # where: "first", "middle", "last", "stage 0", or "-" (one call, no stage)
    stage_index: int | None  # the pipeline stage it was measured on (None: "-")
    seconds: float | None  # None: the source cannot measure this part (not the same as 0)


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    """One measured run: the job it ran, its measured iteration (the reference) and, where the
    source measured them, its components."""

    id: str
    kind: str  # one of KINDS
    source: str  # a short name shown in tables: gpumodeling25, mlperf, torchtitan, trace, ...
    job: Job  # the job the run's configuration describes (resolved)
    measured_iteration_s: float
    components: tuple[MeasuredComponent, ...] = ()
    gpu: str = ""
    their_error: float | None = None  # the source's own published prediction error, if any
    assumed: tuple[str, ...] = ()  # what reading the record as a job had to assume
    notes: tuple[str, ...] = ()  # how the measurement was taken, in words
    warnings: tuple[str, ...] = ()  # where the record and the job disagree (another GPU, another pp)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"MeasuredRun {self.id}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
