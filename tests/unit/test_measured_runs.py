"""Every source of measured runs gives one record type, and validation takes it from any source."""

from __future__ import annotations

from pathlib import Path

import pytest

from paraplan.catalog import load_job
from paraplan.traces.summary import summarize
from paraplan.validate import MeasuredRun, load_runs, measured_from_record, validate_run, validate_runs
from paraplan.validate.trace import measured_from_trace

ROOT = Path(__file__).resolve().parents[2]

def test_a_trace_becomes_a_measured_run_of_its_job_with_components_per_stage():
    job = load_job(ROOT / "examples" / "tiny-cpu" / "pipeline.yaml")
    run = measured_from_trace(job, summarize([ROOT / "tests" / "fixtures" / "traces" / "pipeline"]))
    assert isinstance(run, MeasuredRun) and (run.kind, run.job) == ("trace", job)
    assert {c.stage for c in run.components} == {"stage 0", "stage 1"}


@pytest.mark.shared_data
def test_a_gpumodeling_record_becomes_a_measured_run_with_first_middle_last_components(gpumodeling_dir):
    record = load_runs(gpumodeling_dir / "runs_perlmutter.json")[0]
    run = measured_from_record(record)
    assert (run.kind, run.source) == ("gpumodeling25", "gpumodeling25")
    assert run.measured_iteration_s == record["measured"]["iteration_time_s"]["min"]
    assert {c.stage for c in run.components} >= {"first", "middle", "last"}
    assert run.their_error is not None


@pytest.mark.shared_data
def test_validation_takes_measured_runs_and_raw_records_alike(gpumodeling_dir):
    record = load_runs(gpumodeling_dir / "runs_perlmutter.json")[0]
    from_record = validate_runs([record])[0]
    from_run = validate_run(measured_from_record(record))
    assert from_run.error == from_record.error
    assert from_run.components == from_record.components


def test_the_record_names_a_known_kind():
    job = load_job(ROOT / "examples" / "tiny-cpu" / "ddp.yaml")
    with pytest.raises(ValueError, match="kind"):
        MeasuredRun(id="x", kind="rumour", source="x", job=job, measured_iteration_s=1.0)


def test_gpumodeling_and_published_no_longer_import_each_other():
    for name, other in (("gpumodeling", "published"), ("published", "gpumodeling")):
        text = (ROOT / "src" / "paraplan" / "validate" / f"{name}.py").read_text()
        assert f"paraplan.validate.{other}" not in text
