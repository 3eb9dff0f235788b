"""The command line as a user runs it: results on stdout, one-line errors with exit code 2."""

import csv
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from paraplan.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def test_predict_with_no_file_runs_the_built_in_demo_job():
    result = run("predict")
    assert result.exit_code == 0, result.output
    assert "iteration time" in result.output
    assert "Memory per GPU" in result.output


def test_predict_json_has_the_documented_keys():
    result = run("predict", "--format", "json")
    data = json.loads(result.stdout)
    for key in ("iteration_s", "tokens_per_s", "tflops_per_gpu", "mfu", "hfu", "bubble_fraction", "breakdown", "memory", "cost"):
        assert key in data
    assert set(data["breakdown"]) == {
        "forward_compute_s", "backward_compute_s", "recompute_s", "tp_communication_s", "cp_communication_s",
        "ep_communication_s", "dp_communication_s", "pipeline_p2p_s", "offload_s", "host_wait_s", "optimizer_step_s",
        "pipeline_bubble_s",
    }
    assert data["memory"]["fits"] in (True, False)
    assert data["cost"]["cost_to_train_usd"] > 0  # the demo has a price and a token budget


def test_predict_from_flags_matches_the_issue_example():
    result = run(
        "predict", "--model", "llama-3-70b", "--gpu", "H100-SXM5-80GB", "--num-nodes", "8",
        "--gpus-per-node", "8", "--tp", "8", "--pp", "4", "--micro-batch-size", "1",
        "--global-batch-size", "512", "--format", "json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["parallel"]["dp"] == 2
    assert data["num_gpus"] == 64
    assert data["gpu"] == "H100-SXM5-80GB"


def test_predict_states_the_sequence_length_in_the_table_and_the_json():
    assert "seq_length 8,192 tokens per sequence" in run("predict").output  # the demo's Llama-3-8B
    data = json.loads(run("predict", "--format", "json").stdout)
    assert data["seq_length"] == 8192


def test_the_json_job_name_follows_a_model_flag():
    data = json.loads(run("predict", "--model", "llama-3-70b", "--num-nodes", "8", "--format", "json").stdout)
    assert (data["job"], data["model"]) == ("demo-llama-3-8b (--model llama-3-70b)", "llama-3-70b")


def test_a_cluster_described_by_its_gpu_in_a_file_predicts_as_the_gpu_flag_does(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("model: llama-3-8b\ncluster: {gpu: H100-SXM5-80GB, num_nodes: 2, gpus_per_node: 8}\n"
                    "parallel: {tp: 8}\n")
    from_file = run("predict", str(path), "--format", "json")
    assert from_file.exit_code == 0, from_file.output
    path.write_text("model: llama-3-8b\ncluster: dgx-a100\nparallel: {tp: 8}\n")
    from_flags = run("predict", str(path), "--gpu", "H100-SXM5-80GB", "--num-nodes", "2", "--format", "json")
    assert from_flags.exit_code == 0, from_flags.output
    a, b = json.loads(from_file.stdout), json.loads(from_flags.stdout)
    assert a["iteration_s"] == b["iteration_s"] and a["uncalibrated"] == b["uncalibrated"]
    assert a["cluster"] == b["cluster"] == "dgx-h100"  # the GPU's reference node, with its own GPU


def test_an_impossible_prediction_is_an_internal_error_with_exit_code_3(monkeypatch):
    from paraplan.prediction import facade
    from paraplan.specs import InternalError

    def impossible(job, *args, **kwargs):
        raise InternalError("internal error: the prediction for job 'x' is impossible: MFU 120.0 %, above 100 %")

    monkeypatch.setattr(facade, "check_possible", impossible)
    result = run("predict", "--format", "json")
    assert result.exit_code == 3
    assert result.stdout == "" or "iteration_s" not in result.stdout
    assert "internal error: " in result.output and "Traceback" not in result.output


def test_every_example_job_predicts():
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        result = run("predict", str(path), "--format", "json")
        assert result.exit_code == 0, f"{path.name}: {result.output}"
        assert json.loads(result.stdout)["iteration_s"] > 0


def test_csv_output_is_one_header_and_one_row():
    result = run("predict", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 1
    assert float(rows[0]["iteration_s"]) > 0
    assert "breakdown.forward_compute_s" in rows[0]


def test_explain_lists_the_operators_of_one_layer():
    result = run("predict", "--explain")
    for name in ("linear1", "flash_atten", "linear4", "tp_"):
        assert name in result.output
    data = json.loads(run("predict", "--explain", "--format", "json").stdout)
    assert [op["name"] for op in data["layer_ops"]][:2] == ["RMSlayernorm", "linear1"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("predict", "--gpu", "A100-SMX4"), "unknown GPU 'A100-SMX4'; did you mean A100-SXM4-80GB?"),
        (("predict", "--gpu", "A800"), "unknown GPU 'A800', not in the catalog"),
        (("predict", "--tp", "3"), "parallel: tp*pp*cp = 3 does not divide the cluster's 32 GPUs"),
        (("predict", "--model", "llama-3-8b", "--tp", "16", "--num-nodes", "4"), "parallel.tp: num_query_groups=8 is not divisible by 16"),
        (("predict", "no-such-file.yaml"), "no-such-file.yaml: cannot read the job file"),
        (("predict", "--price-per-gpu-hour", "two dollars"), "cannot read 'two dollars'"),
        (("predict", "--backend", "magic"), "backend: unknown backend 'magic'"),
    ],
)
def test_bad_input_is_one_line_naming_the_field_with_exit_code_2(args, message):
    result = run(*args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_bad_job_file_names_the_field(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model: gpt2\ncluster: dgx-a100\nparallel: {tp: 2, pipline: 2}\n")
    result = run("predict", str(job))
    assert result.exit_code == 2
    assert "parallel.pipline: unknown key" in result.output


def test_catalog_lists_gpus_models_clusters_and_framework_presets():
    for kind, expected in (("gpus", "H100-SXM5-80GB"), ("models", "llama-3-70b"), ("clusters", "dgx-h100"),
                           ("frameworks", "torchtitan")):
        result = run("catalog", kind, "--format", "json")
        assert result.exit_code == 0
        assert expected in [row["name"] for row in json.loads(result.stdout)]


def test_version_prints_and_exits_zero():
    result = run("--version")
    assert result.exit_code == 0
    assert result.output.startswith("paraplan ")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model: gpt2\ncluster: 7\n", "cluster: expected a catalog cluster name or a mapping"),
        ("model: gpt2\ncluster: dgx-a100\nparallel: [1]\n", "parallel: expected a mapping"),
        ("model: {hf_config: 5}\ncluster: dgx-a100\n", "model.hf_config: expected the path of a config.json"),
        ("model: gpt2\ncluster: {name: dgx-h100, gpu: [a]}\n", "cluster.gpu: expected a catalog GPU name"),
        ("model: gpt2\ncluster: dgx-a100\ntrain_tokens: .inf\n", "train_tokens: expected a count"),
        ("model: gpt2\ncluster: dgx-a100\nparallel: {tp: 2, tensor_model_parallel_size: 4}\n", "parallel.tp: given twice"),
    ],
)
def test_malformed_job_files_get_one_line_and_exit_code_2(tmp_path, text, message):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    result = run("predict", str(path))
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_a_job_file_that_is_not_text_is_rejected(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_bytes(b"\xff\xfe\x00\x01")
    result = run("predict", str(path))
    assert result.exit_code == 2
    assert "not a text file" in result.output


@pytest.mark.parametrize("command", ["predict", "search", "export", "sharding", "validate", "fit", "catalog",
                                     "report", "samples", "calibrate"])
def test_every_command_s_help_states_the_exit_codes(command):
    text = " ".join(run(command, "--help").output.split())
    assert "Exit codes: 0 an answer; 1 a valid question with no answer" in text
    assert "2 bad input" in text and "3 internal error" in text
