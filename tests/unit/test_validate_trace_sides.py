"""`paraplan validate trace` shows every part either side has (a part measured as 0 beside a
predicted one, a part the trace cannot measure as n/a), and warns where the trace ran on
another GPU or pipeline degree than its job says. On small hand-made GPU traces of the tiny
GPT's two-rank DDP job, and on HolisticTraceAnalysis's traces where present."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hta_traces import HTA, write_trace
from paraplan.catalog import load_job
from paraplan.cli.app import app
from paraplan.traces.summary import summarize
from paraplan.validate import validate_run
from paraplan.validate.trace import job_mismatches, measured_from_trace
from readable import assert_readable_text

ROOT = Path(__file__).resolve().parents[2]
DDP = ROOT / "examples" / "tiny-cpu" / "ddp.yaml"
TWO_GROUPS = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2},
              {"pg_name": "1", "pg_desc": "custom", "pg_size": 2}]
runner = CliRunner()


def _events(group: str) -> list[dict]:
    """One step: a GEMM, then an all-reduce on process group ``group``."""
    def launch(c: int, ts: float) -> dict:
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts,
                "dur": 1, "args": {"correlation": c}}

    return [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 20},
        launch(1, 2), launch(2, 4),
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32", "pid": 0, "tid": 7, "ts": 10,
         "dur": 300, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", "pid": 0,
         "tid": 20, "ts": 310, "dur": 100, "args": {"correlation": 2, "Collective name": "allreduce",
                                                   "Process Group Name": group, "dtype": "Float",
                                                   "In msg nelems": 1024, "Group size": 2}},
    ]


def _traces(tmp_path: Path, group: str = "0", gpu: str = "cpu-core", groups=TWO_GROUPS) -> Path:
    for rank in (0, 1):
        write_trace(_events(group), tmp_path / f"rank{rank}.json.gz",
                    distributedInfo={"rank": rank, "world_size": 2, "backend": "nccl", "pg_config": groups},
                    deviceProperties=[{"id": 0, "name": gpu}])
    return tmp_path


def _validated(directory: Path, job_file: Path = DDP):
    return validate_run(measured_from_trace(load_job(job_file), summarize([directory])))


def _row(result, component: str):
    return next(c for c in result.components if c.component == component)


def test_a_predicted_part_the_trace_measured_none_of_shows_as_0_with_no_error(tmp_path):
    result = _validated(_traces(tmp_path))
    optimizer = _row(result, "optimizer")
    assert optimizer.measured_s == 0.0 and optimizer.predicted_s > 0 and optimizer.error is None
    assert _row(result, "dp comm").measured_s == pytest.approx(100e-6)


def test_communication_no_process_group_names_makes_the_dimensions_not_measured_rather_than_0(tmp_path):
    result = _validated(_traces(tmp_path, group="1"))
    assert _row(result, "unknown comm").measured_s == pytest.approx(100e-6)
    dp = _row(result, "dp comm")
    assert dp.measured_s is None and dp.predicted_s > 0 and dp.error is None
    assert any("not measured (n/a), not 0" in n for n in result.notes)


def test_a_part_neither_side_has_is_left_out(tmp_path):
    names = {c.component for c in _validated(_traces(tmp_path)).components}
    assert not names & {"ep comm", "tp comm", "fp8_cast", "conv"}
    assert {"compute", "idle", "iteration"} <= names


def test_the_table_shows_measured_0_and_n_a_whole_at_80_columns_and_json_keeps_null(tmp_path):
    traces = _traces(tmp_path, group="1")
    table = runner.invoke(app, ["validate", "trace", str(DDP), str(traces)], env={"COLUMNS": "80"})
    assert table.exit_code == 0, table.output
    result = _validated(traces)
    assert_readable_text(table.stdout, 80, [f"{_row(result, 'optimizer').predicted_s * 1e3:.2f}", "n/a"])
    cells = {line.split("│")[2].strip(): [c.strip() for c in line.split("│")[3:5]]
             for line in table.stdout.splitlines() if line.count("│") == 6}
    assert cells["optimizer"][0] == "0.00" and cells["dp comm"][0] == "n/a"
    record = json.loads(runner.invoke(app, ["validate", "trace", str(DDP), str(traces), "-f", "json"]).stdout)
    dp = next(c for c in record["components"] if c["component"] == "dp comm")
    assert dp["measured_s"] is None and dp["error"] is None and dp["predicted_s"] > 0


def test_the_picture_draws_predicted_parts_the_trace_has_none_of(tmp_path):
    pytest.importorskip("matplotlib")
    from paraplan.report.tracevalidation import figure_trace_validation

    fig = figure_trace_validation(_validated(_traces(tmp_path, group="1")))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert {"optimizer", "attention", "dp comm", "unknown comm", "gemm"} <= set(labels)
    assert any("n/a: dp comm" in t.get_text() for t in fig.axes[0].get_xticklabels())


# -- warnings: the trace ran otherwise than the job says ----------------------------------------


def test_a_trace_of_another_gpu_is_a_warning_naming_both(tmp_path):
    result = _validated(_traces(tmp_path, gpu="NVIDIA A100-SXM4-40GB"))
    assert result.warnings == ("trace recorded on NVIDIA A100-SXM4-40GB, job says cpu-core",)


def test_a_gpu_the_trace_names_by_a_catalog_alias_of_the_job_s_is_no_warning(tmp_path):
    job = tmp_path / "a100.yaml"
    job.write_text(DDP.read_text().replace("cluster: cluster.yaml",
                                           "cluster: {gpu: A100-SXM4-40GB, gpus_per_node: 2, num_nodes: 1}"))
    (tmp_path / "traces").mkdir()
    traces = _traces(tmp_path / "traces", gpu="NVIDIA A100-SXM4-40GB")
    assert job_mismatches(load_job(job), summarize([traces])) == ()


def test_a_pipeline_group_of_another_size_is_a_warning(tmp_path):
    groups = [*TWO_GROUPS, {"pg_name": "2", "pg_desc": "pp", "pg_size": 2}]
    result = _validated(_traces(tmp_path, groups=groups))
    assert result.warnings == ("the trace's pipeline process group has 2 ranks, job says pp 1",)


def test_the_command_prints_the_warning_and_json_holds_it(tmp_path):
    traces = _traces(tmp_path, gpu="NVIDIA A100-SXM4-40GB")
    table = runner.invoke(app, ["validate", "trace", str(DDP), str(traces)], env={"COLUMNS": "80"})
    assert "warning: trace recorded on NVIDIA A100-SXM4-40GB, job says cpu-core" in table.stderr
    record = json.loads(runner.invoke(app, ["validate", "trace", str(DDP), str(traces), "-f", "json"]).stdout)
    assert record["warnings"] == ["trace recorded on NVIDIA A100-SXM4-40GB, job says cpu-core"]


def test_the_tiny_gpt_s_own_traces_warn_of_nothing():
    fixtures = ROOT / "tests" / "fixtures" / "traces"
    for mode in ("ddp", "fsdp", "pipeline"):
        job = load_job(ROOT / "examples" / "tiny-cpu" / f"{mode}.yaml")
        assert job_mismatches(job, summarize([fixtures / mode])) == (), mode


@pytest.mark.skipif(not (HTA / "E1_diff_control_a100x8").is_dir(), reason="../shared/data/traces/hta absent")
def test_hta_s_a100_trace_beside_an_h100_job_warns_of_the_gpu_and_shows_predicted_ep_comm(tmp_path):
    job = tmp_path / "moe.yaml"
    job.write_text("name: moe-8\nmodel: {name: mixtral-8x7b, num_layers: 4}\ncluster: {name: dgx-h100, num_nodes: 1}\n"
                   "parallel: {tp: 1, pp: 1, ep: 8, micro_batch_size: 1, global_batch_size: 16}\nprecision: bf16\n")
    result = validate_run(measured_from_trace(load_job(job), summarize([HTA / "E1_diff_control_a100x8"])))
    assert result.warnings == ("trace recorded on NVIDIA A100-PG509-200 (a GPU the catalog does not know), "
                               "job says H100-SXM5-80GB",)
    attention = _row(result, "attention")
    assert attention.measured_s == 0.0 and attention.predicted_s > 0
    parts = [c for c in result.components if c.component not in ("compute", "iteration")]
    assert sum(c.measured_s for c in parts) == pytest.approx(_row(result, "iteration").measured_s, rel=1e-9)


def test_the_table_and_json_show_the_predictions_ignored_settings_and_placement_notes(tmp_path):
    import io
    from dataclasses import replace

    from rich.console import Console

    from paraplan.report.tracevalidation import render_trace_validation, trace_validation_record

    result = _validated(_traces(tmp_path))
    prediction = replace(result.prediction, uncalibrated=("no curve",), ignored_settings=("cuda graphs",),
                         placement_notes=("tp straddles nodes",))
    result = replace(result, prediction=prediction)
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(render_trace_validation(result))
    text = console.export_text()
    assert "uncalibrated: no curve" in text and "ignored: cuda graphs" in text
    assert "placement: tp straddles nodes" in text
    record = trace_validation_record(result)
    assert record["ignored_settings"] == ["cuda graphs"] and record["placement_notes"] == ["tp straddles nodes"]
