"""Each model's parameters counted from its own module tree (built by ``transformers`` on the meta
device from the config.json in tests/fixtures/hf) against the figure its authors publish, in
their convention: with or without the input embedding, the untied output head, the vision tower.

A figure published exactly (Gemma 2's report, Mistral's Codestral Mamba page, the GPT-OSS
model card to 10 M) is held to 0.1 %; a figure published rounded ("52B", "17B active") to half a
unit of its last digit, which is all it can say (the stricter of the two applies)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from paraplan.inventory.hftrace import count_parameters
from paraplan.specs import ConfigError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


@dataclass(frozen=True)
class Published:
    model: str  # the fixture's name
    what: str  # total | non_embedding | active | active_no_embedding | active_non_embedding | embedding
    value: float  # parameters
    step: float  # the unit of the figure's last published digit (1 for an exact count)
    source: str


# each figure's convention is its ``what``; `_measure` says what each one counts
PUBLISHED = [Published(**row) for row in json.loads((FIXTURES / "published.json").read_text())["figures"]]

SLOW = {"deepseek-v3", "llama-4-scout", "gpt-oss-120b", "qwen3-next-80b-a3b", "jamba-v0.1"}


def _config(model: str) -> dict:
    config = json.loads((FIXTURES / f"{model}.json").read_text())
    return {k: v for k, v in config.items() if not k.startswith("_")}


def _measure(model: str, what: str) -> int:
    try:
        c = count_parameters(_config(model))
    except ConfigError as err:  # a model_type this transformers cannot build
        pytest.skip(str(err))
    embedding_and_head = c.embedding + c.head
    return {
        "total": c.total,
        "embedding": c.embedding,
        "non_embedding": c.total - embedding_and_head,
        "active": c.active,
        "active_no_embedding": c.active - c.embedding,
        "active_non_embedding": c.active - embedding_and_head,
    }[what]


def _case(p: Published):
    marks = [pytest.mark.slow] if p.model in SLOW else []
    return pytest.param(p, id=f"{p.model}-{p.what}", marks=marks)


@pytest.mark.parametrize("published", [_case(p) for p in PUBLISHED])
def test_the_parameters_counted_from_the_module_tree_are_the_published_figure(published):
    counted = _measure(published.model, published.what)
    allowed = max(0.001 * published.value, published.step / 2)
    assert abs(counted - published.value) <= allowed, (published.source, counted)


def test_codestral_mamba_has_exactly_the_parameters_mistral_published():
    assert _measure("mamba-codestral-7b", "total") == 7_285_403_648


def test_a_tied_head_is_counted_once_and_an_untied_one_apart():
    gemma = count_parameters(_config("gemma-2-2b"))
    olmo = count_parameters(_config("olmo-2-7b"))
    assert gemma.head == 0 and gemma.embedding == 256_000 * 2304
    assert olmo.head == olmo.embedding == 100_352 * 4096


def test_gpt_oss_20b_runs_4_of_its_32_experts_per_token():
    c = count_parameters(_config("gpt-oss-20b"))
    assert c.routed_active * 32 == c.routed * 4
    assert c.active < c.total


def test_deepseek_v3_mtp_module_is_an_option_transformers_does_not_build():
    # transformers 5.23's DeepseekV3ForCausalLM ignores the checkpoint's mtp.* weights on load
    # (_keys_to_ignore_on_load_unexpected) and builds no MTP module: the module tree is the
    # 61-layer main model, so the traced count is the report's 671B whatever
    # num_nextn_predict_layers says
    with_mtp = count_parameters(_config("deepseek-v3"))
    without = count_parameters({**_config("deepseek-v3"), "num_nextn_predict_layers": 0})
    assert with_mtp.total == without.total


TINY_MIXTRAL = {
    "model_type": "mixtral", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "num_local_experts": 8,
    "num_experts_per_tok": 2,
}


def test_traced_experts_are_one_grouped_gemm_reading_each_experts_weights_once(tmp_path, monkeypatch):
    monkeypatch.setenv("PARAPLAN_CACHE_DIR", str(tmp_path))
    from paraplan.inventory.hftrace import trace_model
    from paraplan.inventory.traced import layer_ops_from_trace

    b, s, h, inter, experts, top_k = 2, 64, 256, 512, 8, 2
    layer = trace_model(TINY_MIXTRAL, b, s).layers[0]
    ops = [o for o in layer.ops if o.module == "mlp.experts" and (o.flops or o.bytes)]
    fwd = [o for o in ops if o.phase == "fwd"]
    assert [o.aten for o in fwd] == ["grouped_mm"]
    rows = b * s * top_k
    gemm = 2 * rows * 3 * h * inter  # gate+up and down, each routed row through one expert
    assert fwd[0].flops == gemm + rows * inter  # plus the gate's product
    weights = experts * 3 * h * inter * 2  # bf16, each expert's weights once
    assert weights < fwd[0].bytes_read < weights + 8 * rows * (h + inter) * 2
    gemm_op = next(op for op in layer_ops_from_trace(layer) if op.name == "mlp.experts")
    assert gemm_op.bwd_weight_flops == gemm
    assert gemm_op.params == experts * 3 * h * inter


def test_experts_written_to_run_every_token_through_every_expert_are_costed_for_the_routed_rows(
        tmp_path, monkeypatch):
    # Llama 4's reference code repeats the tokens once per expert (the router's zero scores mask
    # the rest): 16x the FLOPs Scout runs with one expert a token
    monkeypatch.setenv("PARAPLAN_CACHE_DIR", str(tmp_path))
    from paraplan.inventory.hftrace import trace_model

    h, inter, tokens = 128, 256, 2 * 64
    config = {
        "model_type": "llama4_text", "hidden_size": h, "intermediate_size": inter, "intermediate_size_mlp": 512,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "num_local_experts": 4, "num_experts_per_tok": 1, "vocab_size": 500, "tie_word_embeddings": False,
    }
    layer = trace_model(config, 2, 64).layers[0]
    fwd = [o for o in layer.ops if o.module == "feed_forward.experts" and o.phase == "fwd" and o.flops]
    assert [o.aten for o in fwd] == ["grouped_mm"]
    assert fwd[0].flops == 2 * tokens * 3 * h * inter + tokens * inter
