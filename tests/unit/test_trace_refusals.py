"""Issue 28, bad input: a model whose shapes a meta-device trace cannot hold, or whose sizes torch
or transformers refuse, is one line naming the field and what to do (exit 2), never a traceback."""

from __future__ import annotations

import json

import pytest

for _extra in ("torch", "transformers"):
    pytest.importorskip(_extra)

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
        "num_attention_heads": 4, "vocab_size": 100}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PARAPLAN_CACHE_DIR", str(tmp_path / "cache"))


def _refusal(config: dict, seq: int = 16) -> str:
    from paraplan.inventory.hftrace import trace_model
    from paraplan.specs import ConfigError

    with pytest.raises(ConfigError) as err:
        trace_model(config, 1, seq)
    return str(err.value)


def test_a_sequence_whose_logits_overflow_a_tensors_size_names_seq_length():
    message = _refusal(TINY, seq=2**60)
    assert message.startswith("model.seq_length: micro-batch 1 x 1,152,921,504,606,846,976 tokens")
    assert "use a shorter seq_length or micro_batch_size" in message
    assert "\n" not in message


@pytest.mark.parametrize(("field", "value", "who"), [("intermediate_size", -8, "torch"),
                                                      ("num_attention_heads", 0, "transformers")])
def test_a_size_torch_or_transformers_refuses_is_named_with_its_value(field, value, who):
    message = _refusal({**TINY, field: value})
    assert message.startswith(f"model.hf_config: {field} = {value}: {who} refuses")
    assert message.endswith("give a positive size")


def test_predict_refuses_an_overflowing_traced_job_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from paraplan.cli.app import app

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"name": "t", "model": {"hf_config": str(config), "seq_length": 2**60,
                                                       "inventory": "traced"},
                               "cluster": {"name": "aws-p5.48xlarge", "num_nodes": 1},
                               "parallel": {"micro_batch_size": 1, "global_batch_size": 8}, "precision": "bf16"}))
    result = CliRunner().invoke(app, ["predict", str(job)])
    assert result.exit_code == 2
    assert "model.seq_length" in result.output and "Traceback" not in result.output
