"""Published run records (``../shared/data/published/runs_*.json``) as paraplan jobs.

A record states the model, the parallel plan, the GPU, the node size, sometimes the network,
and the framework in words ("NVIDIA NeMo/Megatron-Core (MLPerf v3.0 submission)", "torchtitan
(FSDP2)", "IBM fms-fsdp (PyTorch FSDP + SDPA FlashAttention-2)"). This module reads those
words into the settings paraplan has, by tables (``_FAMILIES``, ``_ARCHITECTURES``) rather
than one branch per run, and says what it had to assume (``JobFromRecord.assumed``). Only the
configuration is read: the measured figures never shape the job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from paraplan.catalog import load_catalog_entry, load_gpu
from paraplan.specs import ConfigError


@dataclass(frozen=True, slots=True)
class Family:
    """How one framework family runs a job, where the record does not say."""

    name: str
    keywords: tuple[str, ...]  # lower-case words of the record's ``framework`` that name it
    framework: str  # paraplan's framework setting
    sharded_data_parallel: bool  # FSDP: a null zero_stage means FULL_SHARD (ZeRO-3)
    grad_reduce_in_fp32: bool | None = None  # None: the framework's default
    fsdp_version: int | None = None  # PyTorch FSDP1 (flat parameters) or FSDP2; None: the default
    tp_comm_overlap: bool = False  # with sequence parallelism
    # billions of parameters up to which the family shards within a node (HYBRID_SHARD)
    hybrid_shard_below: float = 0.0
    overlap_p2p_comm: bool = False  # with interleaving


# First match wins; the order puts the specific names before the generic ones.
_FAMILIES = (
    Family("torchtitan", ("torchtitan",), "fsdp", True),
    # fms-fsdp's mixed precision reduces in bf16 (policies/mixed_precision.py, bfSixteen); it
    # runs FSDP1 (FullyShardedDataParallel) and shards within a node up to ~30B parameters: the
    # README's runs are HSDP for 7B and 13B, FULL_SHARD for 34B and 70B (blog: "HSDP is feasible
    # only when the model can be sharded within a single node, limiting the size of models to
    # around 30B parameters")
    Family("fms-fsdp", ("fms-fsdp", "fms_fsdp"), "fsdp", True, grad_reduce_in_fp32=False, fsdp_version=1,
           hybrid_shard_below=30.0),
    # Composer wraps models in FSDP1's FullyShardedDataParallel
    Family("mosaicml", ("mosaic", "llm-foundry", "composer"), "fsdp", True, fsdp_version=1),
    Family("deepspeed", ("deepspeed", "gpt-neox"), "deepspeed", False),
    Family("fsdp", ("fsdp",), "fsdp", True),
    # NVIDIA's MLPerf GPT-3 NeMo configs (training_results_v3.0 .../gpt3/implementations/pytorch:
    # megatron_gpt_config.yaml overlap_p2p_comm: True; config_tp_h100.sh TP_COMM_OVERLAP=True)
    Family("megatron", ("mlperf",), "megatron", False, tp_comm_overlap=True, overlap_p2p_comm=True),
    Family("megatron", ("megatron", "nemo"), "megatron", False),
)
_DEFAULT_FAMILY = _FAMILIES[-1]

# Architecture defaults by MLP activation: GPT-3-style (Megatron-LM's GPT) or Llama-style.
_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "gelu": {
        "position_embedding": "learned",
        "normalization": "layernorm",
        "untie_embeddings_and_output_weights": False,
        "add_bias_linear": True,
    },
    "swiglu": {
        "position_embedding": "rotary",
        "normalization": "rmsnorm",
        "untie_embeddings_and_output_weights": True,
        "add_bias_linear": False,
    },
}

# Vocabulary of a model family when the record leaves it null: the dataset README names GPT-3's,
# Llama 2's and Llama 3's; the others are the families' published tokenizers (HF config.json).
_VOCAB_BY_NAME = (
    ("llama3", 128256), ("llama-3", 128256), ("llama2", 32000), ("llama-2", 32000), ("llama", 32000),
    ("gpt3", 50257), ("gpt-3", 50257), ("mpt", 50432), ("pythia", 50304), ("neox", 50432),
    ("falcon", 65024), ("mistral", 32000), ("mixtral", 32000), ("qwen2", 151936), ("qwen", 151936),
    ("gemma", 256000), ("nemotron", 256000), ("bloom", 250880), ("opt", 50272),
)
_FALLBACK_VOCAB = 32000

_RECOMPUTE = {"none": "none", "selective": "selective", "full": "full"}
_OP_POLICY = re.compile(r"selective\s*\(op\)", re.IGNORECASE)
_TP_OVERLAP = re.compile(r"tp[ _]comm(unication)?[ _]overlap(\s*(on|true|=\s*true))", re.IGNORECASE)
_P2P_OVERLAP = re.compile(r"overlap[ _]p2p[ _]comm(unication)?(\s*(on|true|=\s*true|:\s*true))", re.IGNORECASE)
_HYBRID = re.compile(r"\b(hsdp|hybrid[ _]shard)", re.IGNORECASE)
_FULL_SHARD = re.compile(r"full[ _]shard", re.IGNORECASE)
_DIST_OPT = re.compile(r"distributed[ _]optimi[sz]er", re.IGNORECASE)


def _words(run: dict[str, Any]) -> str:
    """The free text a record says its settings in."""
    return " ".join(str(run.get(key) or "") for key in ("notes", "framework", "recompute"))


_NODE_BANDWIDTH = re.compile(r"(\d+(?:\.\d+)?)\s*(gbps|gb/s)\s*inter-node", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class JobFromRecord:
    """A job mapping (for ``catalog.resolve_job``) and what the mapping assumed."""

    mapping: dict[str, Any]
    family: str
    gpu: str
    assumed: tuple[str, ...]


def family_of(run: dict[str, Any]) -> Family:
    text = str(run.get("framework") or "").lower()
    for family in _FAMILIES:
        if any(word in text for word in family.keywords):
            return family
    return _DEFAULT_FAMILY


def _precision(text: str) -> str:
    low = text.lower()
    for word in ("fp8", "bf16", "fp16", "tf32", "fp32"):
        if word in low:
            return word
    raise ConfigError(f"precision: cannot read a precision from {text!r}")


def _gpu_name(text: str) -> str:
    """The catalog GPU a record's ``gpu`` names ("H100-SXM5-80GB (DGX H100)" -> H100-SXM5-80GB)."""
    return load_gpu(text.split("(")[0].strip()).name


def _vocab(run: dict[str, Any], assumed: list[str]) -> int:
    vocab = run["model"].get("vocab_size")
    if vocab:
        return int(vocab)
    key = " ".join(str(run.get(k, "")) for k in ("id", "source")).lower().replace("_", "-")
    for word, size in _VOCAB_BY_NAME:
        if word in key:
            assumed.append(f"vocab_size {size} (the family's tokenizer; the record gives none)")
            return size
    assumed.append(f"vocab_size {_FALLBACK_VOCAB} (the record gives none and names no known family)")
    return _FALLBACK_VOCAB


_EAGER = ("torchtitan", "fms-fsdp")  # families whose published runs are eager PyTorch
_MOE_KEYS = ("num_experts", "num_moe_experts", "moe_num_experts", "experts")
# the record's model fields that are ModelSpec's own (Megatron-LM names), copied when given
_MODEL_FIELDS = ("kv_channels", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
                 "moe_router_score_function", "multi_latent_attention", "q_lora_rank", "kv_lora_rank",
                 "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
_LAYER_RUN = re.compile(r"\[([01])\]\s*\*\s*(\d+)")


def _moe_pattern(value: Any, num_layers: int) -> dict[str, Any]:
    """Megatron-LM's --moe-layer-freq: an int, or a list expression such as "([0]*3+[1]*58)"."""
    if value is None or isinstance(value, int):
        return {} if value in (None, 1) else {"moe_layer_freq": value}
    runs = _LAYER_RUN.findall(str(value))
    pattern = tuple(int(bit) for bit, n in runs for _ in range(int(n)))
    if len(pattern) != num_layers:
        raise ConfigError(f"moe_layer_freq: cannot read {value!r} as a pattern of {num_layers} layers")
    return {"moe_layer_freq": pattern}


def _experts(run: dict[str, Any], assumed: list[str]) -> dict[str, Any]:
    """The mixture-of-experts and MLA fields a record gives (none for a dense model)."""
    m = run["model"]
    experts = next((m[k] for k in _MOE_KEYS if isinstance(m.get(k), int)), None)
    fields: dict[str, Any] = {k: m[k] for k in _MODEL_FIELDS if m.get(k) not in (None, False)}
    if m.get("qk_layernorm") and not m.get("multi_latent_attention"):
        fields["qk_layernorm"] = True
    if experts is None or experts <= 1:
        return {k: v for k, v in fields.items() if not k.startswith("moe_")}
    fields["num_moe_experts"] = experts
    fields.update(_moe_pattern(m.get("moe_layer_freq"), m["num_layers"]))
    if "moe_layer_freq" not in fields and m.get("first_k_dense_replace"):
        fields["moe_first_k_dense"] = m["first_k_dense_replace"]
    if m.get("mtp_num_layers"):
        assumed.append(f"{m['mtp_num_layers']} multi-token-prediction layer(s) left out (not modelled)")
    return fields


def _model(run: dict[str, Any], family: Family, assumed: list[str]) -> dict[str, Any]:
    m = run["model"]
    activation = m.get("activation", "gelu")
    arch = dict(_ARCHITECTURES[activation])
    if family.name == "megatron" and activation == "gelu":
        # Megatron-LM's GPT: dropout 0.1 on attention and hidden states (its defaults).
        arch.update(attention_dropout=0.1, hidden_dropout=0.1)
    old_megatron = family.name == "megatron" and "(202" in str(run.get("framework", ""))
    return {
        "name": run["id"],
        "num_layers": m["num_layers"],
        "hidden_size": m["hidden_size"],
        "num_attention_heads": m["num_attention_heads"],
        "num_query_groups": m.get("num_kv_heads") or m["num_attention_heads"],
        "ffn_hidden_size": m["ffn_hidden_size"],
        "seq_length": m["seq_length"],
        "vocab_size": _vocab(run, assumed),
        "activation": activation,
        # Megatron-LM of 2021-22 ran its own fused softmax on the full score matrix.
        "attention": "unfused" if old_megatron else "flash",
        **arch,
        # torchtitan's (Aug 2024) and fms-fsdp's published numbers ran without torch.compile:
        # SwiGLU as silu, then a multiply; Megatron/NeMo fuse it
        **({"swiglu_fusion": False} if family.name in _EAGER and activation == "swiglu" else {}),
        **_experts(run, assumed),
    }


def _cluster(run: dict[str, Any], gpu_name: str, assumed: list[str]) -> dict[str, Any]:
    gpu = load_gpu(gpu_name)
    if gpu.reference_node is None:
        raise ConfigError(f"{run['id']}: gpu {gpu_name} has no reference node in the catalog")
    per_node = int(run["gpus_per_node"])
    nodes = int(run["num_gpus"]) // per_node
    cluster: dict[str, Any] = {"name": gpu.reference_node, "num_nodes": nodes, "gpus_per_node": per_node}
    stated = _NODE_BANDWIDTH.search(str(run.get("interconnect") or ""))
    if stated and nodes > 1:
        raw = load_catalog_entry("clusters", gpu.reference_node)
        node_gbit = float(stated.group(1))
        # the stated fabric was not measured: the reference node's latency, a generic efficiency
        cluster["inter_node"] = {
            "latency": raw["inter_node"].get("latency", "10 us"),
            "bandwidth": f"{node_gbit / 8 / per_node:g} GB/s",
        }
    elif nodes > 1:
        assumed.append(f"network of the {gpu.reference_node} reference node (the record states none)")
    return cluster


def _parallel(run: dict[str, Any], family: Family, assumed: list[str]) -> dict[str, Any]:
    p = run["parallel"]
    words = _words(run)
    gbs = p["global_batch_size"]
    dp = p.get("dp") or int(run["num_gpus"]) // (p["tp"] * p["pp"] * (p.get("cp") or 1))
    mbs = p.get("micro_batch_size")
    if mbs is None:
        mbs = gbs // dp
        assumed.append(f"micro_batch_size {mbs} (global batch / dp: no gradient accumulation)")
    zero = p.get("zero_stage")
    if zero is None and not family.sharded_data_parallel and _DIST_OPT.search(words):
        zero = 1  # Megatron's distributed optimizer shards the optimizer states: ZeRO-1
    if zero is None:
        zero = 3 if family.sharded_data_parallel else 0
        assumed.append(f"zero_stage {zero} ({'FULL_SHARD' if zero == 3 else 'plain data parallel'})")
    vpp = p.get("virtual_pipeline") or 1
    recompute = str(run.get("recompute") or "none").split()[0].lower()
    if recompute not in _RECOMPUTE:
        raise ConfigError(f"{run['id']}: recompute {run.get('recompute')!r} is not none, selective or full")
    recompute = _RECOMPUTE[recompute]
    if recompute == "selective" and family.framework == "fsdp":
        # torchtitan's "selective" is per op or every n-th layer (its default n = 2);
        # fms-fsdp's checkpoints every n-th block (n not stated: 2 assumed)
        if _OP_POLICY.search(words):
            recompute = "op"
        else:
            recompute = "layer"
            assumed.append("selective checkpointing of every 2nd layer")
    parallel = {
        "tp": p["tp"],
        "pp": p["pp"],
        "dp": dp,
        "cp": p.get("cp") or 1,
        "sequence_parallel": bool(p.get("sp")),
        "vpp": vpp if vpp > 1 else None,
        "zero_stage": zero,
        "micro_batch_size": mbs,
        "global_batch_size": gbs,
        "recompute": recompute,
        "framework": family.framework,
    }
    if family.grad_reduce_in_fp32 is not None:
        parallel["grad_reduce_in_fp32"] = family.grad_reduce_in_fp32
    if family.fsdp_version is not None:
        parallel["fsdp_version"] = family.fsdp_version
    tp_overlap = family.tp_comm_overlap or bool(_TP_OVERLAP.search(words))
    if tp_overlap and parallel["sequence_parallel"] and parallel["tp"] > 1:
        parallel["tp_comm_overlap"] = True
    billions = run["model"].get("params_billion")
    node = int(run["gpus_per_node"])
    hybrid = zero >= 1 and dp > node and dp % node == 0 and not _FULL_SHARD.search(words)
    if hybrid and _HYBRID.search(words):
        parallel["data_parallel_shard_degree"] = node
    elif hybrid and p.get("zero_stage") is None and billions is not None and billions <= family.hybrid_shard_below:
        parallel["data_parallel_shard_degree"] = node
        assumed.append(f"hybrid sharding within each {node}-GPU node ({family.name}'s rule)")
    if (family.overlap_p2p_comm or _P2P_OVERLAP.search(words)) and parallel["vpp"]:
        parallel["overlap_p2p_comm"] = True
    if (p.get("ep") or 1) > 1 or p.get("etp"):
        parallel["expert_model_parallel_size"] = p.get("ep") or 1
        parallel["expert_tensor_parallel_size"] = p.get("etp") or p["tp"]
        assumed.append("expert load perfectly balanced (the record gives no imbalance)")
    if p.get("moe_a2a_overlap"):
        parallel["overlap_moe_expert_parallel_comm"] = True
    if family.name == "megatron" and "(202" in str(run.get("framework", "")):
        # Megatron-LM of 2021-22 sent 1/tp of the activation between stages and all-gathered
        # it (Narayanan et al. SC'21, section 4.1, scatter/gather).
        parallel["scatter_gather_p2p"] = True
    return parallel


def job_from_record(run: dict[str, Any]) -> JobFromRecord:
    """The job a published record describes (its configuration only)."""
    family = family_of(run)
    assumed: list[str] = []
    gpu = _gpu_name(str(run["gpu"]))
    mapping = {
        "name": run["id"],
        "model": _model(run, family, assumed),
        "cluster": _cluster(run, gpu, assumed),
        "parallel": _parallel(run, family, assumed),
        "precision": _precision(str(run["precision"])),
    }
    return JobFromRecord(mapping, family.name, gpu, tuple(assumed))
