"""Measured runs vs predictions: per-run and per-component error tables."""

from paraplan.validate.gpumodeling import (
    ComponentError,
    RunValidation,
    job_mapping_from_run,
    load_runs,
    validate_runs,
)

__all__ = ["ComponentError", "RunValidation", "job_mapping_from_run", "load_runs", "validate_runs"]
