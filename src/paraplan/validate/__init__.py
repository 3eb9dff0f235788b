"""Measured runs vs predictions: per-run and per-component error tables."""

from paraplan.validate.gpumodeling import job_mapping_from_run, load_runs, validate_runs
from paraplan.validate.result import ComponentError, RunValidation

__all__ = ["ComponentError", "RunValidation", "job_mapping_from_run", "load_runs", "validate_runs"]
