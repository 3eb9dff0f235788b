"""Everyday questions as a user asks them: `paraplan compare`, --seq-length and --hf-config on
predict, report and search, report with predict's plan flags, and what a run without a job file
took from the demo job."""

import csv
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from paraplan.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "unit" / "fixtures" / "llama-2-7b-config.json"
runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def _job(tmp_path: Path, name: str, tp: int) -> str:
    path = tmp_path / name
    path.write_text(f"model: llama-3-8b\ncluster: {{name: dgx-h100, num_nodes: 2}}\n"
                    f"parallel: {{tp: {tp}, micro_batch_size: 1, global_batch_size: 64}}\n")
    return str(path)


def _one_error_line(result, *words: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    for word in words:
        assert word in result.output


# -- compare ------------------------------------------------------------------------------------

def test_compare_shows_two_job_files_side_by_side_with_the_change(tmp_path):
    result = run("compare", _job(tmp_path, "a.yaml", 2), _job(tmp_path, "b.yaml", 8))
    assert result.exit_code == 0, result.output
    for text in ("a.yaml", "b.yaml", "tp 2 -> 8", "iteration time", "tokens / s", "MFU", "memory per GPU",
                 "fits", "TP communication", "B - A"):
        assert text in result.stdout
    assert result.stderr == ""  # job files: nothing taken from the demo job


def test_compare_puts_one_job_against_itself_under_a_vs_change(tmp_path):
    data = json.loads(run("compare", _job(tmp_path, "a.yaml", 2), "--vs", "tp=4", "--vs", "zero-stage=1",
                          "--format", "json").stdout)
    assert (data["a"]["parallel"]["tp"], data["b"]["parallel"]["tp"]) == (2, 4)
    assert data["settings_that_differ"]["parallel.zero_stage"] == {"a": 0, "b": 1}
    assert data["difference"]["iteration_s"]["change"] == pytest.approx(
        data["b"]["iteration_s"] - data["a"]["iteration_s"])


def test_the_job_flags_of_compare_apply_to_both_jobs(tmp_path):
    data = json.loads(run("compare", _job(tmp_path, "a.yaml", 2), _job(tmp_path, "b.yaml", 4),
                          "--global-batch-size", "128", "--seq-length", "2048", "--format", "json").stdout)
    for side in ("a", "b"):
        assert data[side]["parallel"]["global_batch_size"] == 128
        assert data[side]["seq_length"] == 2048


def test_compare_writes_csv_one_row_per_figure(tmp_path):
    result = run("compare", _job(tmp_path, "a.yaml", 2), _job(tmp_path, "b.yaml", 4), "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    figures = {r["figure"]: r for r in rows}
    assert float(figures["iteration_s"]["change"]) == pytest.approx(
        float(figures["iteration_s"]["b"]) - float(figures["iteration_s"]["a"]))
    assert "breakdown.forward_compute_s" in figures and "memory.fits" in figures


def test_vs_can_put_a_config_json_against_the_model_a_flag_names():
    result = run("compare", "--model", "llama-3-8b", "--vs", f"hf-config={HF}", "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["settings_that_differ"]["model"] == {"a": "llama-3-8b", "b": "llama-2-7b-config"}
    assert data["b"]["seq_length"] == data["a"]["seq_length"]  # the config.json's model at the job's length


def test_compare_of_the_demo_job_says_once_what_it_took_from_it():
    result = run("compare", "--vs", "tp=4")
    assert result.exit_code == 0, result.output
    assert result.stderr.count("from the demo job:") == 1


@pytest.mark.parametrize(("args", "words"), [
    (("compare",), ("job_files: compare takes two job files",)),
    (("compare", "a.yaml", "b.yaml", "c.yaml"), ("got 3 file(s)",)),
    (("compare", "--vs", "pipeline=2"), ("vs: 'pipeline=2' is not FLAG=VALUE",)),
    (("compare", "--vs", "tp=two"), ("vs: 'tp=two': tp takes a whole number",)),
    (("compare", "no-such-a.yaml", "no-such-b.yaml"), ("no-such-a.yaml: cannot read the job file",)),
])
def test_bad_compare_input_is_one_line_with_exit_code_2(args, words):
    _one_error_line(run(*args), *words)


# -- --seq-length and --hf-config ---------------------------------------------------------------

def test_a_seq_length_flag_sets_the_tokens_per_sequence():
    data = json.loads(run("predict", "--seq-length", "4096", "--format", "json").stdout)
    assert data["seq_length"] == 4096
    assert data["tokens_per_s"] > 0


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_seq_length_that_is_not_positive_is_one_line_with_exit_code_2(value):
    _one_error_line(run("predict", "--seq-length", value), "seq_length", "positive")


def test_an_hf_config_flag_predicts_the_model_of_a_config_json():
    result = run("predict", "--hf-config", str(HF), "--seq-length", "4096", "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["model"] == "llama-2-7b-config" and data["seq_length"] == 4096
    assert 6.5e9 < data["params_total"] < 7e9  # Llama-2-7B


def test_an_hf_config_flag_on_a_job_file_takes_the_jobs_sequence_length_and_says_so(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model: {name: llama-3-8b, seq_length: 2048}\ncluster: dgx-h100\nparallel: {tp: 8}\n")
    result = run("predict", str(job), "--hf-config", str(HF), "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["seq_length"] == 2048
    assert "--seq-length 2048 from" in result.stderr


def test_an_hf_config_flag_is_read_from_the_working_directory_not_the_job_files(tmp_path, monkeypatch):
    monkeypatch.chdir(HF.parent)
    job = tmp_path / "job.yaml"
    job.write_text("model: llama-3-8b\ncluster: dgx-h100\nparallel: {tp: 8}\n")
    assert run("predict", str(job), "--hf-config", HF.name, "--format", "json").exit_code == 0


@pytest.mark.parametrize(("content", "words"), [
    (None, ("model.hf_config: cannot read",)),
    ("{", ("model.hf_config:", "not valid JSON")),
    ('{"model_type": "bert"}', ("model.hf_config: model_type 'bert'", "not supported")),
])
def test_a_missing_or_bad_config_json_is_one_line_with_exit_code_2(tmp_path, content, words):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    _one_error_line(run("predict", "--hf-config", str(path), "--seq-length", "4096"), *words)


def test_an_hf_config_and_a_model_flag_together_are_one_line_with_exit_code_2():
    _one_error_line(run("predict", "--hf-config", str(HF), "--model", "llama-3-8b"), "hf_config", "--model")


def test_search_reads_an_hf_config_flag_before_it_searches(tmp_path):
    _one_error_line(run("search", "--hf-config", str(tmp_path / "none.json"), "--seq-length", "4096"),
                    "model.hf_config: cannot read")
    _one_error_line(run("search", "--seq-length", "0"), "seq_length")


# -- report takes predict's flags -----------------------------------------------------------------

def test_report_takes_predicts_plan_flags(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "r.html"
    result = run("report", "--tp", "4", "--seq-length", "4096", "-o", str(out))
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "tp=4 pp=1" in html
    assert "sequence 4096" in html


# -- a run without a job file ---------------------------------------------------------------------

def test_a_run_without_a_job_file_says_on_stderr_what_it_took_from_the_demo_job():
    result = run("predict", "--tp", "4", "--format", "json")
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # stdout stays the answer alone
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("from the demo job: ")
    assert "--model llama-3-8b" in lines[0] and "--seq-length 8192" in lines[0]
    assert "--tp" not in lines[0]  # the user set it


def test_a_run_with_a_job_file_says_nothing_of_the_demo_job():
    result = run("predict", str(ROOT / "examples" / "mistral-7b-one-node.yaml"), "--format", "json")
    assert result.exit_code == 0, result.output
    assert "demo job" not in result.stderr


def test_a_search_without_a_job_file_names_what_it_took_from_the_demo_job_but_not_the_plan_it_varies():
    result = run("search", "--model", "gpt2", "--num-nodes", "1", "--top", "1", "--format", "json")
    assert result.exit_code == 0, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert line == "from the demo job: --cluster aws-p5.48xlarge --global-batch-size 512"


# -- plans the framework cannot run ---------------------------------------------------------------

CANNOT = "note: the framework cannot run this plan (predicted as a what-if): parallel.zero_stage: "


def test_predict_answers_a_plan_its_framework_cannot_run_and_says_why_in_one_note(tmp_path):
    job = _job(tmp_path, "a.yaml", tp=1)
    zero1 = run("predict", job, "--framework", "fsdp", "--zero-stage", "1", "--recompute", "full")
    assert zero1.exit_code == 0, zero1.output
    assert "iteration" in zero1.stdout.lower()  # still answered
    notes = [line for line in zero1.stderr.splitlines() if line.startswith(CANNOT)]
    assert len(notes) == 1 and "ZeRO-1" in notes[0]
    zero3 = run("predict", job, "--framework", "fsdp", "--zero-stage", "3", "--recompute", "full")
    assert zero3.exit_code == 0 and "cannot run" not in zero3.stderr


def test_compare_says_which_of_its_jobs_the_framework_cannot_run(tmp_path):
    job = _job(tmp_path, "a.yaml", tp=1)
    result = run("compare", job, "--framework", "fsdp", "--zero-stage", "3", "--recompute", "full",
                 "--vs", "zero_stage=1")
    assert result.exit_code == 0, result.output
    assert [line[:9] for line in result.stderr.splitlines() if "cannot run" in line] == ["note: B: "]
