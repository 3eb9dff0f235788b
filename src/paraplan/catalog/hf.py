"""Read a Hugging Face ``config.json`` as a ModelSpec mapping.

Supported ``model_type`` values: llama, mistral, qwen2 (gated SiLU MLP, RMSNorm, rotary;
Qwen2 with a bias on the QKV projection), qwen3 (with per-head query/key norms), gpt_neox
(GELU, LayerNorm, partial rotary, parallel residual), gpt2 (GELU, LayerNorm, learned
positions), and the mixtures of experts mixtral, qwen2_moe, qwen3_moe, deepseek_v2 and
deepseek_v3 (multi-head latent attention, shared experts, first dense layers). Only the shape matters to the cost
model, so tokenizer, RoPE scaling and initialisation fields are ignored, and dropout fields too
except GPT-2's (``resid_pdrop``, ``attn_pdrop``: the others' configs train without dropout); the
RoPE base (``rope_theta``) is kept for the launch recipes.

A config holds no training sequence length: ``max_position_embeddings`` is the longest
sequence the model accepts (131,072 for Qwen2 and Llama 3.1, which pre-trained at 4-8K), so
the job must give ``seq_length``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paraplan.catalog.userdata import load_json
from paraplan.specs import ConfigError

_WHERE = "model.hf_config"
_LLAMA_LIKE = ("llama", "mistral", "qwen2")
SUPPORTED_MODEL_TYPES = (*_LLAMA_LIKE, "gpt_neox", "gpt2", "mixtral", "qwen3", "qwen2_moe", "qwen3_moe",
                         "deepseek_v2", "deepseek_v3")


def _fail(reason: str) -> ConfigError:
    return ConfigError(f"{_WHERE}: {reason}")


def _read(path: Path) -> dict[str, Any]:
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise _fail(f"cannot read {path} ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise _fail(f"{path} is not a text file (it is not UTF-8)") from None
    try:
        config = load_json(text, str(path))
    except ConfigError as err:
        raise _fail(str(err)) from None
    if not isinstance(config, dict):
        raise _fail(f"{path} is not a JSON object")
    return config


def _get(config: dict[str, Any], path: Path, *keys: str, default: Any = ...) -> Any:
    """The first of ``keys`` present in ``config`` (HF renames fields between model types)."""
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    if default is ...:
        raise _fail(f"{path.name} has no {' / '.join(repr(k) for k in keys)}")
    return default


def _gelu(act: str, path: Path) -> str:
    if act.startswith("gelu"):
        return "gelu"
    raise _fail(f"hidden activation {act!r} in {path.name} is not supported (expected a GELU)")


def _llama_like(config: dict[str, Any], path: Path) -> dict[str, Any]:
    hidden = _get(config, path, "hidden_size")
    heads = _get(config, path, "num_attention_heads")
    act = str(_get(config, path, "hidden_act", "hidden_activation", default="silu"))
    if act not in ("silu", "swish"):
        raise _fail(
            f"hidden_act {act!r} in {path.name} is not supported for a gated MLP (expected silu)"
        )
    fields: dict[str, Any] = {
        "num_layers": _get(config, path, "num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_query_groups": _get(config, path, "num_key_value_heads", default=heads),
        "ffn_hidden_size": _get(config, path, "intermediate_size"),
        "vocab_size": _get(config, path, "vocab_size"),
        "activation": "swiglu",
        "normalization": "rmsnorm" if "rms_norm_eps" in config else "layernorm",
        "position_embedding": "rotary",
        "rotary_percent": float(config.get("partial_rotary_factor") or 1.0),
        "parallel_residual": False,
        # LlamaConfig/MistralConfig/Qwen2Config all default tie_word_embeddings to False.
        "untie_embeddings_and_output_weights": not config.get("tie_word_embeddings", False),
        # Llama's attention_bias puts a bias on q, k, v and o, mlp_bias on the MLP's three
        # projections; Qwen2 has one on q, k and v only (Qwen2Attention: bias=True on
        # q_proj/k_proj/v_proj, False on o_proj; Megatron-LM --add-qkv-bias).
        "add_bias_linear": bool(config.get("attention_bias")),
        "add_bias_mlp": bool(config.get("mlp_bias")),
        "add_qkv_bias": bool(config.get("attention_bias")) or config.get("model_type") == "qwen2",
    }
    if config.get("rope_theta") is not None:
        fields["rope_theta"] = float(config["rope_theta"])
    head_dim = config.get("head_dim")
    if head_dim and head_dim * heads != hidden:
        fields["kv_channels"] = head_dim
    return fields


def _gpt_neox(config: dict[str, Any], path: Path) -> dict[str, Any]:
    fields = {
        "num_layers": _get(config, path, "num_hidden_layers"),
        "hidden_size": _get(config, path, "hidden_size"),
        "num_attention_heads": _get(config, path, "num_attention_heads"),
        "ffn_hidden_size": _get(config, path, "intermediate_size"),
        "vocab_size": _get(config, path, "vocab_size"),
        "activation": _gelu(str(_get(config, path, "hidden_act", default="gelu")), path),
        "normalization": "layernorm",
        "position_embedding": "rotary",
        "rotary_percent": float(_get(config, path, "rotary_pct", "partial_rotary_factor", default=0.25)),
        "parallel_residual": bool(config.get("use_parallel_residual", True)),
        "untie_embeddings_and_output_weights": not config.get("tie_word_embeddings", False),
        "add_bias_linear": bool(config.get("attention_bias", True)),
    }
    base = _get(config, path, "rope_theta", "rotary_emb_base", default=None)
    if base is not None:
        fields["rope_theta"] = float(base)
    return fields


def _gpt2(config: dict[str, Any], path: Path) -> dict[str, Any]:
    hidden = _get(config, path, "n_embd", "hidden_size")
    return {
        "num_layers": _get(config, path, "n_layer", "num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": _get(config, path, "n_head", "num_attention_heads"),
        "ffn_hidden_size": _get(config, path, "n_inner", default=4 * hidden),
        "vocab_size": _get(config, path, "vocab_size"),
        "activation": _gelu(str(_get(config, path, "activation_function", default="gelu_new")), path),
        "normalization": "layernorm",
        "position_embedding": "learned",
        "parallel_residual": False,
        "untie_embeddings_and_output_weights": not config.get("tie_word_embeddings", True),
        "add_bias_linear": True,
        # GPT-2 trains with dropout (GPT2Config's defaults: 0.1 each): after the attention and
        # MLP outputs (resid_pdrop) and on the attention probabilities (attn_pdrop; inside a
        # flash kernel, an op of its own in unfused attention). embd_pdrop, after the embedding,
        # has no operator in the hand-written inventory.
        "hidden_dropout": float(_get(config, path, "resid_pdrop", default=0.1)),
        "attention_dropout": float(_get(config, path, "attn_pdrop", default=0.1)),
    }


def _moe_layers(
    num_layers: int, sparse_step: int, dense: list[int], first_dense: int, *, from_one: bool
) -> dict[str, Any]:
    """Which layers are MoE, as Megatron-LM's ``moe_layer_freq``: every ``sparse_step``-th
    layer except ``dense`` (``mlp_only_layers``), after the first ``first_dense``
    (DeepSeek's ``first_k_dense_replace``). Qwen's ``decoder_sparse_step`` counts layers from
    1 (``(i + 1) % step == 0``, ``from_one``), DeepSeek's ``moe_layer_freq`` from 0
    (``i % freq == 0``), as their modeling code does."""
    pattern = tuple(
        0 if i in dense or i < first_dense or (i + int(from_one)) % sparse_step else 1 for i in range(num_layers)
    )
    if all(pattern):
        return {}
    return {"moe_layer_freq": pattern}


def _mixtral(config: dict[str, Any], path: Path) -> dict[str, Any]:
    fields = _llama_like(config, path)
    fields.update({
        "num_moe_experts": _get(config, path, "num_local_experts"),
        "moe_router_topk": _get(config, path, "num_experts_per_tok"),
        "moe_ffn_hidden_size": fields["ffn_hidden_size"],
        "moe_aux_loss_coeff": float(config.get("router_aux_loss_coef") or 0.0),
    })
    return fields


def _qwen3(config: dict[str, Any], path: Path) -> dict[str, Any]:
    fields = _llama_like(config, path)
    fields["qk_layernorm"] = True  # Qwen3Attention's q_norm and k_norm (RMSNorm per head)
    fields["add_qkv_bias"] = bool(config.get("attention_bias"))
    return fields


def _qwen_moe(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """Qwen2-MoE and Qwen3-MoE: ``num_experts`` routed experts of ``moe_intermediate_size``,
    Qwen2-MoE with a shared expert of ``shared_expert_intermediate_size``."""
    fields = _qwen3(config, path) if config.get("model_type") == "qwen3_moe" else _llama_like(config, path)
    layers = fields["num_layers"]
    fields.update({
        "num_moe_experts": _get(config, path, "num_experts"),
        "moe_router_topk": _get(config, path, "num_experts_per_tok"),
        "moe_ffn_hidden_size": _get(config, path, "moe_intermediate_size"),
        "moe_aux_loss_coeff": float(config.get("router_aux_loss_coef") or 0.0),
        **_moe_layers(layers, int(config.get("decoder_sparse_step") or 1), list(config.get("mlp_only_layers") or []), 0,
                      from_one=True),
    })
    if config.get("shared_expert_intermediate_size"):
        fields["moe_shared_expert_intermediate_size"] = config["shared_expert_intermediate_size"]
    return fields


def _deepseek(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """DeepSeek-V2/V3: multi-head latent attention, shared and routed experts, the first
    ``first_k_dense_replace`` layers dense (``intermediate_size``)."""
    fields = _llama_like(config, path)
    fields.pop("num_query_groups")  # MLA has no key-value groups
    moe_ffn = _get(config, path, "moe_intermediate_size")
    fields.update({
        "multi_latent_attention": True,
        "kv_lora_rank": _get(config, path, "kv_lora_rank"),
        "qk_head_dim": _get(config, path, "qk_nope_head_dim"),
        "qk_pos_emb_head_dim": _get(config, path, "qk_rope_head_dim"),
        "v_head_dim": _get(config, path, "v_head_dim"),
        "num_moe_experts": _get(config, path, "n_routed_experts"),
        "moe_router_topk": _get(config, path, "num_experts_per_tok"),
        "moe_ffn_hidden_size": moe_ffn,
        "moe_router_score_function": "sigmoid" if config.get("scoring_func") == "sigmoid" else "softmax",
        "moe_aux_loss_coeff": float(config.get("aux_loss_alpha") or 0.0),
        **_moe_layers(fields["num_layers"], int(config.get("moe_layer_freq") or 1), [],
                      int(config.get("first_k_dense_replace") or 0), from_one=False),
    })
    fields.pop("kv_channels", None)
    if config.get("q_lora_rank"):
        fields["q_lora_rank"] = config["q_lora_rank"]
    if config.get("n_shared_experts"):
        fields["moe_shared_expert_intermediate_size"] = config["n_shared_experts"] * moe_ffn
    if (config.get("n_group") or 1) > 1 and config.get("topk_group"):  # group-limited routing
        fields["moe_router_num_groups"] = config["n_group"]
        fields["moe_router_group_topk"] = config["topk_group"]
    return fields


_READERS = {
    **{name: _llama_like for name in _LLAMA_LIKE},
    "gpt_neox": _gpt_neox,
    "gpt2": _gpt2,
    "mixtral": _mixtral,
    "qwen3": _qwen3,
    "qwen2_moe": _qwen_moe,
    "qwen3_moe": _qwen_moe,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
}


def _traced_outline(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """What a traced inventory takes from the config of a model type paraplan cannot describe
    by its fields (Gemma-2, Mamba-2, Nemotron-H, ...): the sizes its embedding, LM head, pipeline
    messages and layer count read (``inventory.job``), and whether it is a mixture of experts;
    every layer's operators come from its traced code."""
    merged = {**_class_defaults(config), **config}
    hidden = int(_get(config, path, "hidden_size", "d_model", "n_embd"))
    heads = int(config.get("num_attention_heads") or config.get("num_heads") or config.get("n_head") or 1)
    fields: dict[str, Any] = {
        "num_layers": _get(config, path, "num_hidden_layers", "n_layer", "num_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_query_groups": int(config.get("num_key_value_heads") or heads),
        "ffn_hidden_size": int(config.get("intermediate_size") or 4 * hidden),
        "vocab_size": _get(config, path, "vocab_size"),
        "normalization": "rmsnorm" if any("rms" in k for k in config) or config.get("rms_norm") else "layernorm",
        "position_embedding": "rotary" if any(k.startswith("rope") for k in config) else "none",
        # the config class's default when the file does not say (PretrainedConfig's: tied)
        "untie_embeddings_and_output_weights": not merged.get("tie_word_embeddings", True),
        "add_bias_linear": False,
    }
    head_dim = config.get("head_dim")
    if head_dim and int(head_dim) * heads != hidden:
        fields["kv_channels"] = int(head_dim)
    elif hidden % heads:
        fields["num_attention_heads"] = fields["num_query_groups"] = 1
    experts = next((merged[k] for k in _EXPERT_KEYS if isinstance(merged.get(k), int) and merged[k] > 1), None)
    if experts:
        fields["num_moe_experts"] = int(experts)
        fields["moe_router_topk"] = int(next((merged[k] for k in _TOPK_KEYS if isinstance(merged.get(k), int)), 1))
    return fields


# transformers' names for a mixture of experts' expert count and top-k, across its model types
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOPK_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk", "moe_top_k", "top_k_experts", "moe_k",
              "num_experts_per_token")


def _class_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """The values transformers' config class of ``config`` gives the fields the file leaves out
    (Jamba's 16 experts, top-2), when transformers is installed; {} otherwise or when it cannot
    build the config (the trace then says why)."""
    try:
        import transformers

        fields = {k: v for k, v in config.items() if k != "model_type"}
        logging = transformers.utils.logging
        before = logging.get_verbosity()
        logging.set_verbosity_error()  # its warnings about the file are the trace's to raise, not printed here
        try:
            built = transformers.AutoConfig.for_model(str(config.get("model_type")), **fields)
        finally:
            logging.set_verbosity(before)
        return dict(getattr(built, "get_text_config", lambda: built)().to_dict())
    except Exception:  # optional: any failure leaves the file's own fields
        return {}


def model_from_hf_config(path: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """ModelSpec fields derived from a Hugging Face config.json, then ``overrides`` applied.

    ``overrides`` is the job's model mapping; it must give ``seq_length`` (the config only
    knows the longest sequence the model accepts), and every other key except ``hf_config``
    replaces the derived value. ``path`` may also be a model directory holding ``config.json``.
    """
    path = Path(path)
    config = _read(path)
    model_type = config.get("model_type")
    reader = _READERS.get(str(model_type))
    if reader is None and overrides.get("inventory") == "traced":
        reader = _traced_outline  # the layers come from the model's own code
    if reader is None:
        raise _fail(
            f"model_type {model_type!r} in {path.name} is not supported "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    try:
        fields = reader(config, path)
    except (TypeError, ValueError, ArithmeticError) as err:
        raise _fail(f"{path.name} has a value of the wrong type ({err})") from None
    if overrides.get("seq_length") is None:
        longest = _get(config, path, "max_position_embeddings", "n_positions", "n_ctx", default=None)
        accepts = f"its max_position_embeddings ({longest}) is" if longest else "that is"
        raise ConfigError(
            f"model.seq_length: required with hf_config: {path.name} holds no training sequence "
            f"length ({accepts} the longest sequence the model accepts); give the length of the "
            "sequences the job trains on, e.g. seq_length: 4096"
        )
    source_dir = path if path.is_dir() else path.parent
    # a config saved under another name than config.json names the model by its file
    own = path.stem if not path.is_dir() and path.name != "config.json" else source_dir.name
    fields["name"] = str(config.get("_name_or_path") or own or "hf-model")
    fields["source"] = f"Hugging Face config.json ({model_type}): {path}"
    fields.update({k: v for k, v in overrides.items() if k != "hf_config"})
    if fields.get("inventory") == "traced":
        # the traced inventory builds the model from this file (paraplan.inventory.tp_plan)
        fields["hf_config"] = str(path.resolve())
    return fields
