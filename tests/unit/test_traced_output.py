"""What a traced model's outputs say about how it was costed: ``paraplan inventory trace
--kernels fused|eager`` and the kernels mode in predict's table and JSON."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("hf_trace_cache")

TINY = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "tie_word_embeddings": False}


def _invoke(*args: str):
    from typer.testing import CliRunner

    from paraplan.cli.app import app

    return CliRunner().invoke(app, list(args))


@pytest.fixture
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    return path


def test_inventory_trace_shows_fused_kernels_by_default_and_eager_modules_when_asked(config):
    fused = _invoke("inventory", "trace", str(config), "-s", "128", "--compare")
    eager = _invoke("inventory", "trace", str(config), "-s", "128", "--kernels", "eager")
    assert fused.exit_code == 0 and eager.exit_code == 0, fused.output + eager.output
    assert "fused kernels" in fused.output and "q_proj+k_proj+v_proj" in fused.output
    assert "traced vs hand-written (fused kernels)" in fused.output
    assert "eager kernels" in eager.output and "q_proj+k_proj" not in eager.output
    assert "self_attn.k_proj" in eager.output
    assert max(len(line) for line in fused.output.splitlines()) <= 80


def test_inventory_trace_with_an_unknown_kernels_mode_is_one_line_with_exit_code_2(config):
    result = _invoke("inventory", "trace", str(config), "--kernels", "triton")
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "--kernels" in result.output


def _job_file(tmp_path, config, kernels: str | None):
    model = {"hf_config": str(config), "seq_length": 256, "inventory": "traced"}
    if kernels:
        model["kernels"] = kernels
    path = tmp_path / f"job-{kernels}.json"
    path.write_text(json.dumps({"name": "t", "model": model, "cluster": {"name": "aws-p5.48xlarge", "num_nodes": 1},
                                "parallel": {"tp": 1, "micro_batch_size": 1, "global_batch_size": 8},
                                "precision": "bf16"}))
    return path


@pytest.mark.parametrize("kernels", [None, "eager"])
def test_predict_says_which_kernels_a_traced_model_was_costed_with(tmp_path, config, kernels):
    job = _job_file(tmp_path, config, kernels)
    table = _invoke("predict", str(job))
    data = json.loads(_invoke("predict", str(job), "--format", "json").output)
    mode = kernels or "fused"
    assert f"traced, {mode} kernels" in table.output
    assert {k: data["inventory"][k] for k in ("source", "kernels")} == {"source": "traced", "kernels": mode}
    assert data["inventory"]["pipeline"].startswith("by base_model_pp_plan")


def test_predict_of_a_hand_written_model_carries_no_inventory_field(tmp_path, config):
    from paraplan.catalog.jobs import load_job
    from paraplan.prediction.entry import predict_any

    job = _job_file(tmp_path, config, None)
    data = json.loads(job.read_text())
    data["model"]["inventory"] = "hand"
    job.write_text(json.dumps(data))
    assert "inventory" not in predict_any(load_job(job)).to_dict()
