"""A profiler trace beside the prediction of its job: per stage and component, with errors
(`paraplan validate trace`), on the tiny GPT's recorded ddp, fsdp and pipeline runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from paraplan.catalog import load_job
from paraplan.cli.app import app
from paraplan.specs import ConfigError
from paraplan.traces.summary import summarize
from paraplan.validate import validate_run
from paraplan.validate.trace import load_trace_run, measured_from_trace
from readable import assert_readable_text

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests" / "fixtures" / "traces"
JOBS = ROOT / "examples" / "tiny-cpu"
runner = CliRunner()


def _validated(mode: str, iteration: str = "fastest"):
    run, _ = load_trace_run(load_job(JOBS / f"{mode}.yaml"), TRACES / mode, iteration)
    return run, validate_run(run)


@pytest.mark.parametrize("mode", ["ddp", "fsdp", "pipeline"])
def test_every_stage_shows_compute_communication_idle_and_the_iteration_with_finite_errors(mode):
    _, result = _validated(mode)
    stages = {c.stage for c in result.components}
    assert stages == ({"stage 0", "stage 1"} if mode == "pipeline" else {"stage 0"})
    for stage in stages:
        names = {c.component for c in result.components if c.stage == stage}
        assert {"gemm", "attention", "compute", "iteration"} <= names
        assert names & {"dp comm", "pp comm"}
    assert all(math.isfinite(c.error) for c in result.components)
    assert math.isfinite(result.error)


@pytest.mark.parametrize("mode", ["ddp", "fsdp", "pipeline"])
def test_the_iteration_measured_is_the_trace_s_fastest(mode):
    _, result = _validated(mode)
    assert result.measured_iteration_s == summarize([TRACES / mode]).stats()["min_s"]


def test_the_median_iteration_can_be_compared_instead():
    summary = summarize([TRACES / "fsdp"])
    run, _ = _validated("fsdp", "median")
    assert run.measured_iteration_s == summary.step_times_s[summary.median_step]


def test_a_stage_s_measured_parts_add_up_to_its_iteration():
    run, _ = _validated("pipeline")
    for stage in ("stage 0", "stage 1"):
        parts = {c.name: c.seconds for c in run.components if c.stage == stage}
        total = sum(v or 0.0 for k, v in parts.items() if k not in ("compute", "iteration"))
        assert total == pytest.approx(parts["iteration"], rel=0.02)


def test_a_job_of_another_run_is_refused_by_the_run_s_timers():
    with pytest.raises(ConfigError, match=r"timers\.json: the traced run was fsdp"):
        load_trace_run(load_job(JOBS / "ddp.yaml"), TRACES / "fsdp")


def test_a_plan_of_another_world_size_is_refused():
    job = load_job(JOBS / "ddp.yaml")
    job = job.model_copy(update={"cluster": job.cluster.model_copy(update={"gpus_per_node": 4}),
                                 "parallel": job.parallel.model_copy(update={"data_parallel_size": 4})})
    with pytest.raises(ConfigError, match="the trace ran on 2 ranks"):
        measured_from_trace(job, summarize([TRACES / "ddp"]))


# -- the command -------------------------------------------------------------------------------


def _cli(*args: str, width: int = 80):
    return runner.invoke(app, ["validate", *args], env={"COLUMNS": str(width)})


def test_the_table_keeps_every_number_whole_at_80_columns():
    result = _cli("trace", str(JOBS / "pipeline.yaml"), str(TRACES / "pipeline"))
    assert result.exit_code == 0, result.output
    _, validated = _validated("pipeline")
    numbers = [f"{c.measured_s * 1e3:.2f}" for c in validated.components]
    numbers += [f"{100 * c.error:+.1f} %" for c in validated.components]
    assert_readable_text(result.stdout, 80, numbers)
    assert "stage 1" in result.stdout


def test_json_output_holds_the_iteration_and_every_component():
    result = _cli("trace", str(JOBS / "fsdp.yaml"), str(TRACES / "fsdp"), "--format", "json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["measured_iteration_s"] == summarize([TRACES / "fsdp"]).stats()["min_s"]
    assert {c["component"] for c in record["components"]} >= {"gemm", "dp comm", "iteration"}


def test_a_bad_trace_directory_is_one_line_and_exit_2(tmp_path):
    result = _cli("trace", str(JOBS / "fsdp.yaml"), str(tmp_path / "nowhere"))
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1 and "no such file or directory" in result.output


def test_the_plot_is_drawn_and_never_written_over_without_force(tmp_path):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "fsdp.png"
    args = ("trace", str(JOBS / "fsdp.yaml"), str(TRACES / "fsdp"), "--plot", str(plot))
    assert _cli(*args).exit_code == 0 and plot.read_bytes()[:4] == b"\x89PNG"
    plot.write_bytes(b"mine")
    refused = _cli(*args)
    assert refused.exit_code == 2 and "already exists" in refused.output and plot.read_bytes() == b"mine"
    assert _cli(*args, "--force").exit_code == 0 and plot.read_bytes()[:4] == b"\x89PNG"


def test_the_help_lists_both_forms():
    text = _cli("--help").stdout
    assert "paraplan validate [runs] RUNS_FILES..." in text
    assert "paraplan validate trace JOB TRACE_DIR" in text
    assert "--components / --no-components" in text


@pytest.mark.shared_data
def test_the_old_form_validate_file_still_works(gpumodeling_dir):
    old = _cli(str(gpumodeling_dir / "runs_perlmutter.json"), "--format", "json", width=200)
    new = _cli("runs", str(gpumodeling_dir / "runs_perlmutter.json"), "--format", "json", width=200)
    assert old.exit_code == 0, old.output
    assert json.loads(old.stdout) == json.loads(new.stdout)


def test_the_old_form_takes_its_options_before_the_file_too(tmp_path):
    missing = tmp_path / "runs.json"
    result = _cli("--format", "json", str(missing))
    assert result.exit_code == 2 and "cannot read" in result.output
