"""Published run records (``../shared/data/published/runs_*.json``) as paraplan jobs.

A record states the model, the parallel plan, the GPU, the node size, sometimes the network,
and the framework in words ("NVIDIA NeMo/Megatron-Core (MLPerf v3.0 submission)", "torchtitan
(FSDP2)", "IBM fms-fsdp (PyTorch FSDP + SDPA FlashAttention-2)"). This module reads those
words into the settings paraplan has, by tables (the framework presets of
``catalog/frameworks``, found by their keywords; ``_ARCHITECTURES``) rather than one branch per run, and says what it had to assume (``JobFromRecord.assumed``). Only the
configuration is read: the measured figures never shape the job.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from paraplan.catalog import load_catalog_entry, load_gpu
from paraplan.catalog.presets import Preset, apply_model_defaults, apply_preset, preset_for_words
from paraplan.specs import ConfigError
from paraplan.specs.pipeline_layout import SPLIT_FIELDS
from paraplan.units import parse_bandwidth

# A record's framework words name a framework preset (``catalog/frameworks/*.yaml``: each
# file's ``keywords``, tried in its ``priority`` order); the preset says what that framework
# does by default for what the record leaves out. A record that names none runs on the
# megatron engine with the plan's own defaults.
_NO_PRESET_ENGINE = "megatron"


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
# plan fields a record may state under their Megatron-LM names (in ``parallel`` or at the top):
# --pipeline-model-parallel-layout, --decoder-first/last-pipeline-num-layers,
# --account-for-embedding/loss-in-pipeline-split, --recompute-modules (with recompute selective)
_MEGATRON_SPLIT = (*SPLIT_FIELDS, "recompute_modules")
_OP_POLICY = re.compile(r"selective\s*\(op\)", re.IGNORECASE)
_TP_OVERLAP = re.compile(r"tp[ _]comm(unication)?[ _]overlap(\s*(on|true|=\s*true))", re.IGNORECASE)
_P2P_OVERLAP = re.compile(r"overlap[ _]p2p[ _]comm(unication)?(\s*(on|true|=\s*true|:\s*true))", re.IGNORECASE)
_HYBRID = re.compile(r"\b(hsdp|hybrid[ _]shard)", re.IGNORECASE)
_FULL_SHARD = re.compile(r"full[ _]shard", re.IGNORECASE)
_DIST_OPT = re.compile(r"distributed[ _]optimi[sz]er", re.IGNORECASE)
# a record stating its data-parallel gradient reduction overlaps the backward: Megatron-LM's
# --overlap-grad-reduce (a YAML config's "--overlap-grad-reduce: true"), NeMo's optim
# overlap_grad_sync, or Megatron-LM 2021-22's --DDP-impl torch (torch DDP's bucketed hooks; its
# schedules.py runs all but the last micro-batch under model.no_sync())
_GRAD_OVERLAP = re.compile(r"--overlap-grad-reduce(?![\w-])(?!\s*[:=]\s*false)|overlap[ _]grad[ _]sync\s*[:=]\s*true"
                           r"|ddp[ _-]impl\s*[:=]?\s*torch", re.IGNORECASE)
_GRAD_BF16 = re.compile(r"grad[ _-]reduce[ _-]in[ _-]bf16", re.IGNORECASE)
_FP8_RECIPE = re.compile(r"--fp8-recipe\s+(\w+)", re.IGNORECASE)
_MEGATRON_RECIPES = {"tensorwise": "current"}  # Megatron-LM's names of paraplan's recipes where they differ


def _words(run: dict[str, Any]) -> str:
    """The free text a record says its settings in."""
    return " ".join(str(run.get(key) or "") for key in ("notes", "framework", "recompute"))


_NODE_BANDWIDTH = re.compile(r"(\d+(?:\.\d+)?)\s*(gbps|gb/s)\s*inter-node", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class JobFromRecord:
    """A job mapping (for ``catalog.resolve_job``) and what the mapping assumed."""

    mapping: dict[str, Any]
    family: str  # the preset's name-version, or the engine when the record names no preset
    gpu: str
    assumed: tuple[str, ...]


def preset_of(run: dict[str, Any]) -> Preset | None:
    """The framework preset a record's ``framework`` words name (None: none does)."""
    return preset_for_words(str(run.get("framework") or ""))


def _engine(preset: Preset | None) -> str:
    return preset.engine.value if preset is not None else _NO_PRESET_ENGINE


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


_MOE_KEYS = ("num_experts", "num_moe_experts", "moe_num_experts", "experts")
# the record's model fields that are ModelSpec's own (Megatron-LM names), copied when given
_MODEL_FIELDS = ("kv_channels", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
                 "moe_router_score_function", "multi_latent_attention", "q_lora_rank", "kv_lora_rank",
                 "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "moe_router_fusion", "moe_permute_fusion")
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
    if m.get("mtp_num_layers"):  # DeepSeek-V3's multi-token prediction, on the last stage (inventory.mtp)
        fields["mtp_num_layers"] = int(m["mtp_num_layers"])
    return fields


def _model(run: dict[str, Any], preset: Preset | None, assumed: list[str]) -> dict[str, Any]:
    m = run["model"]
    activation = m.get("activation", "gelu")
    arch = dict(_ARCHITECTURES[activation])
    if _engine(preset) == "megatron" and activation == "gelu":
        # Megatron-LM's GPT: dropout 0.1 on attention and hidden states (its defaults), unless
        # the preset states its own configuration's (the job takes those from the preset)
        own = {d.field for d in preset.model_defaults} if preset is not None else set()
        arch.update({k: 0.1 for k in ("attention_dropout", "hidden_dropout") if k not in own})
    # the preset's attention kernel, where the model has it (Megatron-LM of 2021-22 ran its own
    # fused softmax on the full score matrix)
    kernel = preset.recorded.get("attention_kernel", ("",))[0] if preset is not None else ""
    if preset is not None:  # the kernels its model code runs (the job takes them from the preset)
        _, taken, _ = apply_model_defaults({"normalization": arch["normalization"], "activation": activation}, preset)
        assumed.extend(f"{k} {_shown(v)} ({preset.id}'s default)" for k, v in taken.items())
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
        "attention": "unfused" if kernel == "unfused" else "flash",
        **arch,
        **_experts(run, assumed),
    }


def _cluster(run: dict[str, Any], gpu_name: str, assumed: list[str]) -> dict[str, Any]:
    gpu = load_gpu(gpu_name)
    if gpu.reference_node is None:
        raise ConfigError(f"{run['id']}: gpu {gpu_name} has no reference node in the catalog")
    per_node = int(run["gpus_per_node"])
    nodes = int(run["num_gpus"]) // per_node
    cluster: dict[str, Any] = {"name": gpu.reference_node, "num_nodes": nodes, "gpus_per_node": per_node}
    if run.get("scale_up_domain"):
        # the GPUs the run's placement keeps in one NVLink domain (Megatron-LM's GB200 guide
        # schedules every 32 GPUs on one rack, `sbatch --segment 8`): its groups of that size
        # stay on NVLink, where the rack's own 72 would have them straddle two racks
        cluster["scale_up_domain"] = int(run["scale_up_domain"])
    stated = _NODE_BANDWIDTH.search(str(run.get("interconnect") or ""))
    raw = load_catalog_entry("clusters", gpu.reference_node) if stated and nodes > 1 else {}
    per_gpu = float(stated.group(1)) / 8 / per_node * 1e9 if raw else 0.0  # bytes/s
    if raw and math.isclose(per_gpu, parse_bandwidth(raw["inter_node"]["bandwidth"]), rel_tol=1e-6):
        pass  # the reference node's own fabric (e.g. 8 x 400 Gb/s NDR on DGX H100): its measured network
    elif raw:
        # another fabric, never measured: the reference node's latency, a generic efficiency
        cluster["inter_node"] = {
            "latency": raw["inter_node"].get("latency", "10 us"),
            "bandwidth": f"{per_gpu / 1e9:g} GB/s",
        }
    elif nodes > 1:
        assumed.append(f"network of the {gpu.reference_node} reference node (the record states none)")
    return cluster


def _parallel(run: dict[str, Any], preset: Preset | None, assumed: list[str]) -> dict[str, Any]:
    """The plan the record states; what it leaves out is the preset's to fill
    (``parallel.framework`` names it), or the plan's own default where no preset is named."""
    p = run["parallel"]
    words = _words(run)
    engine = _engine(preset)
    sharded = engine == "fsdp"
    gbs = p["global_batch_size"]
    dp = p.get("dp") or int(run["num_gpus"]) // (p["tp"] * p["pp"] * (p.get("cp") or 1))
    mbs = p.get("micro_batch_size")
    if mbs is None:
        mbs = gbs // dp
        assumed.append(f"micro_batch_size {mbs} (global batch / dp: no gradient accumulation)")
    vpp = p.get("virtual_pipeline") or 1
    parallel: dict[str, Any] = {
        "tp": p["tp"],
        "pp": p["pp"],
        "dp": dp,
        "cp": p.get("cp") or 1,
        "vpp": vpp if vpp > 1 else None,
        "micro_batch_size": mbs,
        "global_batch_size": gbs,
        "framework": preset.id if preset is not None else engine,
    }
    if p.get("sp") is not None:
        parallel["sequence_parallel"] = bool(p["sp"])
    zero = p.get("zero_stage")
    if zero is None and not sharded and _DIST_OPT.search(words):
        zero = 1  # Megatron's distributed optimizer shards the optimizer states: ZeRO-1
    if zero is None and preset is None:
        zero = 0
        assumed.append("zero_stage 0 (plain data parallel)")
    if zero is not None:
        parallel["zero_stage"] = zero
    recompute = run.get("recompute", p.get("recompute_granularity"))
    if recompute is not None or preset is None:
        parallel["recompute"] = _recompute(run, engine, words, assumed)
    if _TP_OVERLAP.search(words) and parallel.get("sequence_parallel") and parallel["tp"] > 1:
        parallel["tp_comm_overlap"] = True
    node = int(run["gpus_per_node"])
    if _FULL_SHARD.search(words) or p.get("zero_stage") is not None:
        parallel["data_parallel_shard_degree"] = None  # stated: FULL_SHARD, or the record's own stage
    elif _HYBRID.search(words) and (zero or 0) >= (0 if zero is None and sharded else 1) and dp > node and dp % node == 0:
        parallel["data_parallel_shard_degree"] = node
    if _P2P_OVERLAP.search(words) and parallel["vpp"]:
        parallel["overlap_p2p_comm"] = True
    if (p.get("ep") or 1) > 1 or p.get("etp"):
        parallel["expert_model_parallel_size"] = p.get("ep") or 1
        parallel["expert_tensor_parallel_size"] = p.get("etp") or p["tp"]
        if not p.get("moe_router_force_load_balancing"):  # forced balance is stated, not assumed
            assumed.append(_expert_balance(p))
    if p.get("moe_a2a_overlap") and p["pp"] > 1 and not parallel["vpp"]:
        # Megatron-Core pairs the all-to-alls only with pp 1 or interleaving; a record overlapping
        # them at pp > 1 without it ran another schedule (DeepSeek-V3's DualPipe)
        assumed.append("all-to-alls not overlapped: the record's overlap at pp > 1 without interleaving "
                       "is another schedule's (DualPipe), not modelled")
    elif p.get("moe_a2a_overlap"):
        parallel["overlap_moe_expert_parallel_comm"] = True
    _dispatcher(p, parallel, assumed)
    if p.get("cuda_graph_scope"):  # Megatron-Core's --cuda-graph-scope, as the record's command gives it
        parallel["cuda_graph_scope"] = list(p["cuda_graph_scope"])
    for key in _MEGATRON_SPLIT:  # Megatron-LM's pipeline split and recompute modules, where stated
        value = p.get(key, run.get(key))
        if value not in (None, False):
            parallel[key] = value
    if engine == "megatron" and _GRAD_OVERLAP.search(words):
        parallel["overlap_grad_reduce"] = True
    _grad_reduce(run, engine, words, parallel, assumed)
    recipe = _FP8_RECIPE.search(str(run.get("precision") or ""))
    if recipe:  # Megatron-LM's --fp8-recipe as the record states it (tensorwise: current scaling)
        parallel["fp8_recipe"] = _MEGATRON_RECIPES.get(recipe.group(1).lower(), recipe.group(1).lower())
    if preset is not None:
        # what the preset fills in, said as the reader's assumptions
        _, use = apply_preset(parallel, preset, num_gpus=int(run["num_gpus"]), gpus_per_node=node,
                              params_billion=run["model"].get("params_billion"),
                              precision=_precision(str(run["precision"])))
        assumed.extend(f"{k} {_shown(v)} ({preset.id}'s default)" for k, v in use.taken.items())
    return parallel


def _expert_balance(p: dict[str, Any]) -> str:
    """The assumption behind pricing the experts' load as balanced (``expert_load_imbalance``
    1.0) for a run not launched with Megatron-Core's --moe-router-force-load-balancing (a record
    stating ``parallel.moe_router_force_load_balancing: true`` needs none); said against the
    source where the record states false (its own router, dropless: the busiest rank's load not
    published)."""
    if p.get("moe_router_force_load_balancing") is False:
        return ("expert load perfectly balanced, although the run routed with its own router (no "
                "--moe-router-force-load-balancing): its busiest rank's load is not published")
    return "expert load perfectly balanced (the record gives no imbalance)"


def _grad_reduce(run: dict[str, Any], engine: str, words: str, parallel: dict[str, Any], assumed: list[str]) -> None:
    """Megatron-LM's gradient reduce dtype: a record stating --grad-reduce-in-bf16 reduces in
    bf16; otherwise a bf16 (or FP8, which runs with --bf16) model reduces in fp32
    (megatron/training/arguments.py: ``accumulate_allreduce_grads_in_fp32`` is set for bf16 unless
    --grad-reduce-in-bf16; training.py ``get_model`` passes it as the DDP config's
    ``grad_reduce_in_fp32``, Megatron-FSDP's too). Under Megatron-FSDP (ZeRO-3 on the megatron
    engine) the gradients are reduce-scattered every micro-batch (megatron_fsdp.py ``no_sync``:
    "for grads shard mode there will actually always be gradient sync"), so there the unstated
    dtype prices every micro-batch's traffic and is said as an assumption."""
    if engine != "megatron":
        return
    if _GRAD_BF16.search(words):
        parallel["grad_reduce_in_fp32"] = False
        return
    if parallel.get("zero_stage") == 3 and _precision(str(run["precision"])) in ("bf16", "fp8"):
        assumed.append("gradients reduce-scattered in fp32 every micro-batch (Megatron-LM's default for bf16 "
                       "without --grad-reduce-in-bf16; the record does not say)")


_DISPATCHER = re.compile(r"^\s*(allgather|alltoall|flex)\b(?:\s*\((deepep|hybridep)\))?", re.IGNORECASE)


def _dispatcher(p: dict[str, Any], parallel: dict[str, Any], assumed: list[str]) -> None:
    """The record's Megatron-Core token dispatcher ('alltoall', 'flex (DeepEP)', 'flex (HybridEP)');
    a custom one (DeepSeek's own kernels) is read as the nearest, DeepEP's."""
    given = p.get("moe_token_dispatcher_type")
    if not given or (p.get("ep") or 1) * (p.get("etp") or 1) <= 1:
        return
    match = _DISPATCHER.match(str(given))
    if match is None:
        parallel["moe_token_dispatcher_type"] = "flex"
        assumed.append(f"dispatcher {given!r} read as flex (DeepEP's normal kernels)")
        return
    parallel["moe_token_dispatcher_type"] = match.group(1).lower()
    if match.group(2):
        parallel["moe_flex_dispatcher_backend"] = match.group(2).lower()


def _recompute(run: dict[str, Any], engine: str, words: str, assumed: list[str]) -> str:
    # parallel.recompute_granularity: Megatron-LM's --recompute-granularity, where the source states it
    stated = run["parallel"].get("recompute_granularity")
    recompute = str(stated or run.get("recompute") or "none").split()[0].lower()
    said = str(run.get("recompute") or "").split()
    if stated is not None and said and said[0].lower() != recompute:
        raise ConfigError(f"{run['id']}: parallel.recompute_granularity {stated!r} disagrees with recompute "
                          f"{run.get('recompute')!r}")
    if recompute not in _RECOMPUTE:
        raise ConfigError(f"{run['id']}: recompute {run.get('recompute')!r} is not none, selective or full")
    recompute = _RECOMPUTE[recompute]
    if recompute == "selective" and engine == "fsdp":
        # torchtitan's "selective" is per op or every n-th layer (its default n = 2);
        # fms-fsdp's checkpoints every n-th block (n not stated: 2 assumed)
        if _OP_POLICY.search(words):
            return "op"
        assumed.append("selective checkpointing of every 2nd layer")
        return "layer"
    return recompute


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def job_from_record(run: dict[str, Any]) -> JobFromRecord:
    """The job a published record describes (its configuration only)."""
    preset = preset_of(run)
    assumed: list[str] = []
    gpu = _gpu_name(str(run["gpu"]))
    mapping = {
        "name": run["id"],
        "model": _model(run, preset, assumed),
        "cluster": _cluster(run, gpu, assumed),
        "parallel": _parallel(run, preset, assumed),
        "precision": _precision(str(run["precision"])),
    }
    return JobFromRecord(mapping, preset.id if preset is not None else _NO_PRESET_ENGINE, gpu, tuple(assumed))
