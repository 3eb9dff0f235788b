"""Issue 28: a traced mixture of experts whose model type ``catalog/hf.py`` does not map takes its
expert count and top-k from the config, under any of transformers' names for them (num_experts,
num_local_experts, n_routed_experts, moe_num_experts; num_experts_per_tok, experts_per_token,
moe_topk, moe_k, ...), or from transformers' config class when the file leaves them to its
defaults (Jamba's 16 experts, top-2: refused before, "the spec has no expert counts")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

for _extra in ("torch", "transformers"):
    pytest.importorskip(_extra)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
SMALL = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 512}


@pytest.fixture(autouse=True)
def _cache_of_this_test(tmp_path, monkeypatch):
    monkeypatch.setenv("PARAPLAN_CACHE_DIR", str(tmp_path / "traces"))


def _predicted(tmp_path, config: dict):
    from paraplan.catalog.jobs import resolve_job
    from paraplan.inventory.hftrace import trace_layer_ops
    from paraplan.inventory.job import count_params
    from paraplan.prediction.entry import predict_any

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    job = resolve_job({"name": "t", "model": {"hf_config": str(path), "seq_length": 256, "inventory": "traced"},
                       "cluster": {"name": "aws-p5.48xlarge", "num_nodes": 1},
                       "parallel": {"micro_batch_size": 1, "global_batch_size": 8}, "precision": "bf16"})
    assert predict_any(job).iteration_s > 0
    fields = {k: v for k, v in config.items() if not k.startswith("_")}
    assert count_params(job) == trace_layer_ops(fields, 1, 256).total_params
    return job.model


def test_jamba_without_its_expert_fields_takes_transformers_defaults(tmp_path):
    config = json.loads((FIXTURES / "jamba-v0.1.json").read_text())
    for key in ("num_experts", "num_experts_per_tok"):
        config.pop(key, None)
    model = _predicted(tmp_path, config)
    assert (model.num_moe_experts, model.moe_router_topk) == (16, 2)


@pytest.mark.parametrize(("model_type", "fields", "experts", "top_k"), [
    ("olmoe", {"num_experts": 8, "num_experts_per_tok": 2}, 8, 2),
    ("granitemoe", {"num_local_experts": 4, "num_experts_per_tok": 2}, 4, 2),
    ("ernie4_5_moe", {"moe_num_experts": 8, "moe_k": 2, "moe_intermediate_size": 64}, 8, 2),
    ("qwen2_moe", {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                   "shared_expert_intermediate_size": 128}, 8, 2),
])
def test_an_unmapped_moe_type_predicts_traced_with_its_own_experts(tmp_path, model_type, fields, experts, top_k):
    model = _predicted(tmp_path, {"model_type": model_type, **SMALL, **fields})
    assert (model.num_moe_experts, model.moe_router_topk) == (experts, top_k)
