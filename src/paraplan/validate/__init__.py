"""Measured runs (one record type, whatever their source) vs predictions: error tables."""

from paraplan.validate.gpumodeling import job_mapping_from_run
from paraplan.validate.measured import MeasuredComponent, MeasuredRun
from paraplan.validate.result import ComponentError, RunValidation
from paraplan.validate.runs import load_runs, measured_from_record, validate_run, validate_runs

__all__ = [
    "ComponentError",
    "MeasuredComponent",
    "MeasuredRun",
    "RunValidation",
    "job_mapping_from_run",
    "load_runs",
    "measured_from_record",
    "validate_run",
    "validate_runs",
]
