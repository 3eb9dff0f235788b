"""Measured runs vs predictions: read run files, predict every run's job, compare.

Every source gives the same record (``measured.MeasuredRun``); the comparison of components is
the source's own (``_COMPARE``, by the record's ``kind``). Nothing here feeds back into any
estimate: measured runs are for validation only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from paraplan.catalog.userdata import load_json, read_text
from paraplan.costmodel import CostModel
from paraplan.prediction import Prediction, predict
from paraplan.prediction.backends import ModelSet, make_cost_model
from paraplan.specs import ConfigError
from paraplan.validate.gpumodeling import compare_gpumodeling, measured_from_gpumodeling
from paraplan.validate.measured import MeasuredRun
from paraplan.validate.published import is_published_record, measured_from_published
from paraplan.validate.result import ComponentError, RunValidation
from paraplan.validate.trace import compare_trace

_COMPARE: dict[str, Callable[[MeasuredRun, Prediction, CostModel], tuple[ComponentError, ...]]] = {
    "gpumodeling25": lambda run, pred, cm: compare_gpumodeling(run, pred),
    "published": lambda run, pred, cm: (),
    "trace": compare_trace,
}


def load_runs(path: Path | str) -> list[dict[str, Any]]:
    """The run records of a runs_perlmutter.json (GPUModeling25) or runs_dev*.json (published)."""
    path = Path(path)
    runs = load_json(read_text(path), str(path))
    if not isinstance(runs, list) or not all(isinstance(r, dict) and "parallel" in r for r in runs):
        raise ConfigError(
            f"{path}: expected a list of run records as in runs_perlmutter.json or runs_dev.json"
        )
    return runs


def measured_from_record(run: dict[str, Any]) -> MeasuredRun:
    """A run record of either file as a measured run: GPUModeling25's traced records carry
    per-component times, published ones a measured (or derivable) iteration time."""
    if "components_best_iteration_us" in run.get("measured", {}):
        return measured_from_gpumodeling(run)
    if is_published_record(run):
        return measured_from_published(run)
    raise ConfigError(f"{run.get('id', '?')}: neither a GPUModeling25 nor a published run record")


def validate_runs(
    runs: Iterable[MeasuredRun | dict[str, Any]],
    backend: str = "analytical",
    models: ModelSet | None = None,
    skipped: list[tuple[str, str]] | None = None,
) -> list[RunValidation]:
    """Predict every run's job and compare with what was measured. ``runs`` are measured runs,
    or the records of runs_perlmutter.json / runs_dev*.json (read as ``measured_from_record``);
    ``backend``/``models`` choose the cost model. A record paraplan cannot read (an unknown GPU,
    a configuration its validation refuses, nothing measured to compare with) is left out and,
    when ``skipped`` is given, appended to it as (run id, reason); without it, the error rises."""
    results = []
    for run in runs:
        try:
            measured = run if isinstance(run, MeasuredRun) else measured_from_record(run)
        except (ConfigError, KeyError, TypeError, ValueError) as err:
            if skipped is None:
                raise
            reason = f"missing field {err}" if isinstance(err, KeyError) else str(err).splitlines()[0]
            skipped.append((str(run.get("id", "?")), reason))
            continue
        results.append(validate_run(measured, backend, models))
    return results


def validate_run(run: MeasuredRun, backend: str = "analytical", models: ModelSet | None = None) -> RunValidation:
    """One measured run beside paraplan's prediction of its job."""
    cm = make_cost_model(run.job, backend, models)
    pred = predict(run.job, cm)
    return RunValidation(
        run_id=run.id,
        measured_iteration_s=run.measured_iteration_s,
        prediction=pred,
        components=_COMPARE[run.kind](run, pred, cm),
        their_error=run.their_error,
        source=run.source,
        gpu=run.gpu or run.job.cluster.gpu.name,
        assumed=run.assumed,
        notes=run.notes,
        warnings=run.warnings,
    )
