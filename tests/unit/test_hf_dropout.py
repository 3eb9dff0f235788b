"""GPT-2's config.json trains with dropout, and the config reader (``catalog.hf``) says so: the
hand-written GPT-2 from ``hf_config`` runs HF's dropout kernels (issue 28, item 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paraplan.catalog.hf import model_from_hf_config
from paraplan.specs import ModelSpec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def _gpt2(tmp_path, **fields) -> ModelSpec:
    config = {k: v for k, v in json.loads((FIXTURES / "gpt2.json").read_text()).items() if not k.startswith("_")}
    config.update(fields)
    for key in [k for k, v in fields.items() if v is None]:
        del config[key]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return ModelSpec(**model_from_hf_config(path, {"seq_length": 1024}))


def test_gpt2_config_reads_its_residual_and_attention_dropout(tmp_path):
    model = _gpt2(tmp_path, resid_pdrop=0.2, attn_pdrop=0.05)
    assert (model.hidden_dropout, model.attention_dropout) == (0.2, 0.05)


def test_gpt2_config_without_dropout_fields_takes_gpt2configs_defaults(tmp_path):
    model = _gpt2(tmp_path, resid_pdrop=None, attn_pdrop=None, embd_pdrop=None)
    assert (model.hidden_dropout, model.attention_dropout) == (0.1, 0.1)


def test_the_hand_written_gpt2_from_its_config_runs_a_dropout_after_attention_and_mlp(tmp_path):
    from paraplan.inventory import count_layer_ops, shard_shape
    from paraplan.specs import Precision

    model = _gpt2(tmp_path)
    ops = count_layer_ops(model, shard_shape(model, 1, 1, False, 1, Precision.BF16))
    assert [op.role for op in ops if op.name == "dropout"] == ["attention output dropout", "MLP output dropout"]


@pytest.mark.parametrize("name", ["llama-3-8b.json", "mixtral-8x7b.json"])
def test_other_configs_train_without_dropout_as_before(name):
    model = ModelSpec(**model_from_hf_config(FIXTURES / name, {"seq_length": 1024}))
    assert (model.hidden_dropout, model.attention_dropout) == (0.0, 0.0)
