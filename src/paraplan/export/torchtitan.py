"""A plan as a torchtitan job config (TOML, ``--job.config_file``).

Keys checked against pytorch/torchtitan ``torchtitan/config/job_config.py`` (commit 6404b93, the
last TOML-era layout in the reference index): ``[job] dump_folder, description``; ``[model] name,
flavor, converters``; ``[training] local_batch_size, global_batch_size, seq_len, max_norm, steps,
mixed_precision_param ("bfloat16" | "float32"), mixed_precision_reduce, dataset``; ``[parallelism]
data_parallel_replicate_degree, data_parallel_shard_degree, fsdp_reshard_after_forward
("default" | "always" | "never"), tensor_parallel_degree, pipeline_parallel_degree,
pipeline_parallel_schedule, pipeline_parallel_microbatch_size, module_fqns_per_model_part,
context_parallel_degree``; ``[activation_checkpoint] mode ("selective" | "full" | "none"),
selective_ac_option``. Batch semantics from ``torchtitan/distributed/pipeline_parallel.py``:
the pipeline runs ``local_batch_size / pipeline_parallel_microbatch_size`` micro-batches per step
and ``module_fqns_per_model_part`` lists each (virtual) stage's modules, placed on pp ranks
round-robin (loop style) for 1F1B / Interleaved1F1B / GPipe; gradient accumulation is
``global_batch_size / (local_batch_size * dp)``. Model flavors: ``torchtitan/models/llama3/
__init__.py`` (8B, 70B, 405B). Newer torchtitan (2026) moves to Python configs
(``torchtitan/config/README.md``: ``--module/--config``; its ``ParallelismConfig`` renames
``module_fqns_per_model_part`` to ``pipeline_parallel_module_fqns_per_model_part`` and the
micro-batch size to ``num_pp_microbatches``); the TOML keys still map one to one onto its
frozen ``--section.option`` flags.

What torchtitan cannot express, stated in the file as ``NOTE(paraplan)`` comments:

- ZeRO-1 and ZeRO-2: torchtitan shards data parallelism with FSDP2 or replicates it with DDP.
  ZeRO-0 is DDP (``data_parallel_replicate_degree = dp``); ZeRO-3 is FSDP resharding after
  forward (``"always"``); ZeRO-1/2 become FSDP that keeps parameters gathered between forward
  and backward (``"never"``, FSDP's ZeRO-2-like mode): less memory than ZeRO-1, more traffic.
- sequence parallelism off with tp > 1: torchtitan's TP always shards norms along the sequence.
- selective recompute: torchtitan's per-op policy (``selective_ac_option = "op"``) saves matmul
  and attention outputs, close to but not the same as Megatron-LM's "recompute core attention".
- a model that is not one of torchtitan's llama3 flavors: ``name``/``flavor`` are left as
  ``EDIT-ME`` (torchtitan refuses to start) and the note lists the architecture to register.

fp16 is refused with a ConfigError naming ``precision``: torchtitan trains in bfloat16 or
float32 (``training.mixed_precision_param``) and has no loss scaling.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from paraplan.export._common import (
    EDIT,
    NOTE,
    PLACEHOLDER,
    check_prediction,
    comment,
    common_notes,
    header_lines,
    layer_split,
    layers_per_virtual_stage,
    train_iterations,
)
from paraplan.specs import ConfigError, Job, Precision, Recompute, Schedule

if TYPE_CHECKING:
    from paraplan.prediction import Prediction

_SCHEDULE = {Schedule.ONE_F_ONE_B: "1F1B", Schedule.INTERLEAVED: "Interleaved1F1B", Schedule.GPIPE: "GPipe"}
# torchtitan/models/llama3/__init__.py: (layers, dim, heads, kv heads, ffn hidden) of each flavor
_LLAMA3_FLAVORS = {
    "8B": (32, 4096, 32, 8, 14336),
    "70B": (80, 8192, 64, 8, 28672),
    "405B": (126, 16384, 128, 8, 53248),
}
_RESHARD = {0: None, 1: "never", 2: "never", 3: "always"}


def notes(job: Job, prediction: Prediction | None = None) -> list[str]:
    """What torchtitan will do differently from the plan paraplan predicted."""
    m, p = job.model, job.parallel
    out = common_notes(job, prediction)
    if p.zero_stage in (1, 2) and p.dp > 1:
        closest = ("less memory, more communication than predicted; re-predict with zero_stage: 2 for "
                   "closer numbers" if p.zero_stage == 1 else
                   "close to ZeRO-2, but parameters are still all-gathered again every step")
        out.append(f"parallel.zero_stage: torchtitan has no ZeRO-{p.zero_stage}; the recipe uses FSDP over "
                   f"dp={p.dp} with fsdp_reshard_after_forward = \"never\" (optimizer states, gradients and "
                   f"parameters sharded, parameters kept gathered from forward to backward): {closest}")
    if p.zero_stage == 0 and p.dp > 1 and (p.tp > 1 or p.pp > 1 or p.cp > 1):
        out.append("parallel.zero_stage: ZeRO-0 is DDP (data_parallel_replicate_degree); torchtitan releases "
                   "before 2025 refuse DDP combined with TP/PP/CP (\"DDP has not supported > 1D "
                   "parallelism\"); there, use HSDP/FSDP instead")
    if p.tp > 1 and not p.sequence_parallel:
        out.append("parallel.sequence_parallel: torchtitan's tensor parallelism always shards norms along the "
                   "sequence; activations will take less memory than predicted")
    if p.tp_comm_overlap or p.overlap_p2p_comm:
        out.append("parallel.tp_comm_overlap / overlap_p2p_comm: Megatron-LM's overlaps; torchtitan's async "
                   "TP is parallelism.enable_async_tensor_parallel (with torch.compile), not set here")
    if p.recompute is Recompute.SELECTIVE:
        out.append("parallel.recompute: torchtitan's selective recompute is per-op (saves matmul and attention "
                   "outputs), not Megatron-LM's core-attention recompute the prediction assumed; "
                   "predict with recompute: op for torchtitan's own")
    if _flavor(job) is None:
        out.append(
            f"model: {m.name} is not one of torchtitan's llama3 flavors (8B, 70B, 405B); register a model "
            f"with num_layers={m.num_layers}, hidden_size={m.hidden_size}, heads={m.num_attention_heads}, "
            f"kv_heads={m.num_query_groups}, ffn_hidden_size={m.ffn_hidden_size}, "
            f"vocab_size={m.vocab_size}, activation={m.activation}, normalization={m.normalization}, "
            f"position_embedding={m.position_embedding}, bias={m.add_bias_linear}, "
            f"parallel_residual={m.parallel_residual} and set [model] name and flavor"
        )
    if job.precision is Precision.FP8:
        out.append("precision: FP8 uses torchao's float8 converter (tensorwise scaling by default), "
                   "not Transformer Engine's recipe")
    return out


def torchtitan_config(job: Job) -> dict[str, dict[str, Any]]:
    """The config as nested mappings (what ``render_torchtitan`` writes as TOML)."""
    m, p = job.model, job.parallel
    if job.precision is Precision.FP16:
        raise ConfigError("precision: torchtitan trains in bfloat16 or float32 "
                          "(training.mixed_precision_param) and has no fp16 loss scaling")
    flavor = _flavor(job)
    model: dict[str, Any] = {"name": "llama3" if flavor else PLACEHOLDER, "flavor": flavor or PLACEHOLDER}
    if job.precision is Precision.FP8:
        model["converters"] = ["float8"]
    # with pipelining one step pushes all of a DP rank's micro-batches through the pipeline;
    # without it torchtitan accumulates gradients over global / (local * dp) steps
    local = p.micro_batch_size * p.num_microbatches if p.pp > 1 else p.micro_batch_size
    training: dict[str, Any] = {
        "local_batch_size": local,
        "global_batch_size": p.global_batch_size,
        "seq_len": m.seq_length,
        "max_norm": 1.0,
    }
    steps = train_iterations(job)
    if steps is not None:
        training["steps"] = steps
    training["mixed_precision_param"] = "float32" if job.precision is Precision.FP32 else "bfloat16"
    training["mixed_precision_reduce"] = "bfloat16" if p.grad_reduce_in_fp32 is False else "float32"
    training["dataset"] = "c4"
    sharded = p.zero_stage > 0 and p.dp > 1
    shard = min(p.data_parallel_shard_degree or p.dp, p.dp)  # hybrid sharding: HSDP
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": p.dp // shard if sharded else p.dp,
        "data_parallel_shard_degree": shard if sharded else 1,
    }
    if sharded:
        parallelism["fsdp_reshard_after_forward"] = _RESHARD[p.zero_stage]
    parallelism["tensor_parallel_degree"] = p.tp
    parallelism["pipeline_parallel_degree"] = p.pp
    parallelism["pipeline_parallel_schedule"] = _SCHEDULE[p.schedule]
    parallelism["pipeline_parallel_microbatch_size"] = p.micro_batch_size
    if p.pp > 1:
        parallelism["module_fqns_per_model_part"] = _module_fqns(job)
    parallelism["context_parallel_degree"] = p.cp
    ac: dict[str, Any] = {"mode": _AC_MODE[p.recompute]}
    if p.recompute in (Recompute.SELECTIVE, Recompute.OP):
        ac["selective_ac_option"] = "op"
    elif p.recompute is Recompute.LAYER:
        ac["selective_ac_option"] = str(p.checkpoint_every)
    return {
        "job": {"dump_folder": "./outputs", "description": f"paraplan export of {job.name}"},
        "model": model,
        "training": training,
        "parallelism": parallelism,
        "activation_checkpoint": ac,
    }


def render_torchtitan(job: Job, prediction: Prediction | None = None) -> str:
    """torchtitan TOML text, with the plan, prediction and notes as comments."""
    check_prediction(job, prediction)
    config = torchtitan_config(job)
    head = header_lines(job, prediction, "torchtitan job config")
    head += [f"{NOTE} {n}" for n in notes(job, prediction)]
    head += [
        "Keys checked against pytorch/torchtitan torchtitan/config/job_config.py (TOML-era layout).",
        "Run on every node: torchrun --nproc-per-node <gpus> -m torchtitan.train --job.config_file <this file>",
    ]
    extra = {
        "model": [f"{EDIT} tokenizer / HF assets (hf_assets_path, or tokenizer_path in older releases)"],
        "training": [f"{EDIT} dataset (and dataset_path) are placeholders, not part of the plan"]
        + ([] if "steps" in config["training"] else
           [f"{EDIT} steps: the job has no train_tokens; torchtitan's default is 10000"]),
    }
    parts = [comment(head)]
    for section, values in config.items():
        lines = [f"[{section}]"] + [f"# {line}" for line in extra.get(section, [])]
        lines += [f"{key} = {_toml(value)}" for key, value in values.items()]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


# paraplan's recompute policy -> torchtitan's activation_checkpoint.mode
_AC_MODE = {Recompute.NONE: "none", Recompute.FULL: "full", Recompute.SELECTIVE: "selective",
            Recompute.LAYER: "selective", Recompute.OP: "selective"}


def _flavor(job: Job) -> str | None:
    """The torchtitan llama3 flavor with exactly this architecture, if there is one."""
    m = job.model
    if not (m.activation == "swiglu" and m.normalization == "rmsnorm" and m.position_embedding == "rotary"
            and m.rotary_percent == 1.0 and not m.add_bias_linear and not m.parallel_residual
            and m.untie_embeddings_and_output_weights):
        return None
    shape = (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.ffn_hidden_size)
    return next((name for name, dims in _LLAMA3_FLAVORS.items() if dims == shape), None)


def _module_fqns(job: Job) -> list[list[str]]:
    """Each (virtual) pipeline stage's modules in model order, as paraplan split the layers."""
    p = job.parallel
    if p.vpp > 1:
        sizes = [layers_per_virtual_stage(job)] * (p.pp * p.vpp)
    else:
        sizes = list(layer_split(job))
    parts, start = [], 0
    for size in sizes:
        parts.append([f"layers.{i}" for i in range(start, start + size)])
        start += size
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    return parts


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        return "[\n" + "".join(f"    {_toml(v)},\n" for v in value) + "]"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")
