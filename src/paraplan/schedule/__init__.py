"""Stage times -> pipeline schedule -> iteration timeline."""

from paraplan.schedule.pipeline import PipelineResult, Task, simulate_pipeline

__all__ = ["PipelineResult", "Task", "simulate_pipeline"]
