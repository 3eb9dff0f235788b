"""One validated run: what was measured, what was predicted, and the error."""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.prediction import Prediction


@dataclass(frozen=True, slots=True)
class ComponentError:
    component: str
    stage: str  # "first", "middle", "last" or "-" for a per-call value
    measured_s: float | None  # None: the source cannot measure this part (0: measured, none of it)
    predicted_s: float

    @property
    def error(self) -> float | None:
        """Relative error of the prediction; None where nothing was measured to compare with."""
        if not self.measured_s:
            return None
        return (self.predicted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True, slots=True)
class RunValidation:
    run_id: str
    measured_iteration_s: float
    prediction: Prediction
    components: tuple[ComponentError, ...]
    their_error: float | None  # GPUModeling25's own published error for the run
    source: str = "gpumodeling25"
    gpu: str = ""
    assumed: tuple[str, ...] = ()  # what mapping the record onto a job had to assume
    notes: tuple[str, ...] = ()  # how the measurement was taken (``MeasuredRun.notes``)
    warnings: tuple[str, ...] = ()  # where the measured run and its job disagree (``MeasuredRun.warnings``)

    @property
    def error(self) -> float:
        return (self.prediction.iteration_s - self.measured_iteration_s) / self.measured_iteration_s
