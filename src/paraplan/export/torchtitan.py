"""A plan as a torchtitan configuration: a Python module with one function that returns a
``Trainer.Config``.

Targets torchtitan 0.3.0 (PyPI, 2026-09; :data:`TORCHTITAN_VERSION`). torchtitan's configuration
refactor removed the TOML job files (``--job.config_file``): a run is now a Python function
returning ``Trainer.Config``, named on the command line with ``--module`` (any importable module)
and ``--config`` (the function), and the ``--section.option`` flags are frozen, kept only for old
scripts (pytorch/torchtitan ``torchtitan/config/README.md``, commit 1b4a5ca; ``ConfigManager``
in ``torchtitan/config/manager.py`` of 0.3.0). So the recipe is a module, run as::

    PYTHONPATH=<its folder> torchrun ... -m torchtitan.train --module <file name> --config paraplan_config

Names checked against torchtitan 0.3.0 (and, where torchtitan is installed, ``pip install -e
".[frameworks]"``, part of ``dev``, the tests import each recipe and parse it with torchtitan's own
``ConfigManager``): ``TrainingConfig`` and ``ParallelismConfig`` (``torchtitan/config/configs.py``:
``local_batch_size``, ``global_batch_size``, ``seq_len``, ``max_norm``, ``steps``,
``disable_cuda_graphs``, ``mixed_precision_param``, ``mixed_precision_reduce`` (``"float32"``
only); ``data_parallel_replicate_degree``, ``data_parallel_shard_degree``,
``fsdp_reshard_after_forward``, ``tensor_parallel_degree``, ``enable_sequence_parallel``,
``pipeline_parallel_degree``, ``pipeline_parallel_schedule``, ``pipeline_parallel_microbatch_size``,
``module_fqns_per_model_part``, ``context_parallel_degree``); ``FullAC`` / ``SelectiveAC``
(``torchtitan/distributed/activation_checkpoint.py``); ``CheckpointManager.Config`` (``enable``,
``folder``, ``interval``); the Llama 3 flavors of ``torchtitan/models/llama3/__init__.py``
(``model_registry("8B" | "70B" | "405B")``). Batch semantics (``torchtitan/trainer.py``,
``torchtitan/distributed/pipeline_parallel.py``): the pipeline runs ``local_batch_size /
pipeline_parallel_microbatch_size`` micro-batches per step, gradient accumulation is
``global_batch_size / (local_batch_size * dp)``, ``module_fqns_per_model_part`` lists each
(virtual) stage's modules (``tok_embeddings``, ``layers.<i>``, ``norm``, ``lm_head``) placed on pp
ranks round-robin, and CUDA graphs (on by default) refuse pipeline parallelism.

What torchtitan cannot express, stated in the module's docstring as ``NOTE(paraplan)`` lines:

- ZeRO-1 and ZeRO-2: torchtitan shards data parallelism with FSDP2 or replicates it with DDP.
  ZeRO-0 is DDP (``data_parallel_replicate_degree = dp``); ZeRO-3 is FSDP with torchtitan's
  ``"default"`` resharding (after forward, except with pipeline parallelism, as the memory model
  takes it); ZeRO-1/2 become FSDP that keeps parameters gathered between forward
  and backward (``"never"``, FSDP's ZeRO-2-like mode): less memory than ZeRO-1, more traffic.
- selective recompute: torchtitan's per-op policy (``SelectiveAC``) saves matmul and attention
  outputs, close to but not the same as Megatron-LM's "recompute core attention"; every n-th layer
  (``recompute: layer``) is gone from 0.3.0, whose ``FullAC`` recomputes every layer.
- gradients reduced in bf16: ``mixed_precision_reduce`` takes ``"float32"`` only.
- a model that is not one of torchtitan's Llama 3 flavors: ``model_spec()`` raises until the
  user registers the architecture the note lists.

Hybrid sharding (HSDP): torchtitan's ``data_parallel_shard_degree`` counts data-parallel ranks
and FSDP shards over those times cp (``_dp_shard``); paraplan's counts the shard group's dp x cp
ranks, so the recipe divides it by cp, and refuses a group that cp does not divide, naming
``parallel.data_parallel_shard_degree``.

Mixtures of experts: ``ParallelismConfig.expert_parallel_degree`` (0.3.0 has no
``expert_tensor_parallel_degree``: its experts are never tensor-parallel, and
``ParallelDims`` folds EP into the dp_shard x cp x tp ranks, efsdp = dp_shard * cp * tp / ep), so
etp > 1 and an ep that does not divide those ranks are refused naming ``parallel.etp`` /
``parallel.ep``; EP turns CUDA graphs off (``Trainer.Config._validate_cuda_graphs`` refuses the
standard all-to-all dispatcher). The MoE flavors are those of ``torchtitan/models/deepseek_v3`` (16B,
236B, 671B) and ``torchtitan/models/qwen3`` (30B-A3B, 235B-A22B), matched by layers, width, heads,
experts, top-k, expert width and vocabulary; any other MoE model gets the placeholder ``model_spec()``.

fp16 is refused with a ConfigError naming ``precision``: torchtitan trains in bfloat16 or
float32 (``training.mixed_precision_param``) and has no loss scaling.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from paraplan.export._common import (
    EDIT,
    NOTE,
    PLACEHOLDER,
    check_prediction,
    common_notes,
    framework_notes,
    fused_rmsnorm_note,
    header_lines,
    layer_split,
    layers_per_virtual_stage,
    projections_note,
    train_iterations,
)
from paraplan.specs import ConfigError, FP8Recipe, Framework, Job, Precision, Recompute, Schedule

if TYPE_CHECKING:
    from paraplan.prediction import Prediction

TORCHTITAN_VERSION = "0.3.0"  # the release the recipe targets (and the tests parse it with)
# torchtitan/components/loss.py ChunkedLossWrapper.Config.num_chunks, the loss the recipe writes
LOSS_CHUNKS = 8
CONFIG_FUNCTION = "paraplan_config"  # the --config name
CHECKPOINT_EVERY_S = 3600.0  # a checkpoint about every hour of predicted training

# torch.distributed.pipelining's schedule names (torchtitan's parallelism.pipeline_parallel_schedule);
# ScheduleInterleavedZeroBubble with one stage per rank issues ZB-H1's order
_SCHEDULE = {Schedule.ONE_F_ONE_B: "1F1B", Schedule.INTERLEAVED: "Interleaved1F1B", Schedule.GPIPE: "GPipe",
             Schedule.ZB_H1: "InterleavedZeroBubble", Schedule.ZB_V: "ZBVZeroBubble"}
# torchtitan/models/llama3/__init__.py: (layers, dim, heads, kv heads, ffn hidden, vocab) of each flavor
_LLAMA3_FLAVORS = {
    "8B": (32, 4096, 32, 8, 14336, 128256),
    "70B": (80, 8192, 64, 8, 28672, 128256),
    "405B": (126, 16384, 128, 8, 53248, 128256),
}
# torchtitan/models/deepseek_v3/__init__.py and qwen3/__init__.py (0.3.0): (layers, dim, heads, experts,
# top-k, expert hidden, vocab) of each mixture-of-experts flavor
_MOE_FLAVORS = {
    ("deepseek_v3", "16B"): (27, 2048, 16, 64, 6, 1408, 102400),
    ("deepseek_v3", "236B"): (60, 5120, 128, 160, 6, 1536, 102400),
    ("deepseek_v3", "671B"): (61, 7168, 128, 256, 8, 2048, 129280),
    ("qwen3", "30B-A3B"): (48, 2048, 32, 128, 8, 768, 151936),
    ("qwen3", "235B-A22B"): (94, 4096, 64, 128, 8, 1536, 151936),
}
_RESHARD = {0: None, 1: "never", 2: "never", 3: "default"}  # ZeRO-3: torchtitan's default reshards unless pp > 1,
#  as the memory model takes it (prediction.memory: FSDP with pipeline parallelism keeps the stage gathered)

#: torchtitan 0.3.0's own defaults for the keys the recipe writes (torchtitan/config/configs.py:
#: TrainingConfig, ParallelismConfig; torchtitan/components/checkpointer/base.py: the checkpoint
#: Config). A key whose value is torchtitan's default is not written: the default already does it.
TORCHTITAN_DEFAULTS: dict[str, dict[str, Any]] = {
    "training": {"local_batch_size": 8, "global_batch_size": -1, "seq_len": 2048, "max_norm": 1.0, "steps": 10000,
                 "enable_cpu_offload": False, "disable_cuda_graphs": False, "mixed_precision_param": "bfloat16",
                 "mixed_precision_reduce": "float32"},
    "parallelism": {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": -1,
                    "fsdp_reshard_after_forward": "default", "tensor_parallel_degree": 1,
                    "enable_sequence_parallel": True, "pipeline_parallel_degree": 1,
                    "pipeline_parallel_schedule": "1F1B", "pipeline_parallel_microbatch_size": 1,
                    "context_parallel_degree": 1, "expert_parallel_degree": 1},
    "checkpoint": {"enable": False, "folder": "checkpoint", "interval": 500},
}


def _stated(block: str, values: dict[str, Any]) -> dict[str, Any]:
    """The keys of one block of the recipe whose value is not torchtitan's default."""
    defaults = TORCHTITAN_DEFAULTS[block]
    return {k: v for k, v in values.items() if k not in defaults or defaults[k] != v}
# paraplan's recompute policy -> torchtitan's activation-checkpointing class (None: off)
_AC = {Recompute.NONE: None, Recompute.FULL: "FullAC", Recompute.SELECTIVE: "SelectiveAC",
       Recompute.LAYER: "FullAC", Recompute.OP: "SelectiveAC"}


def notes(job: Job, prediction: Prediction | None = None) -> list[str]:
    """What torchtitan will do differently from the plan paraplan predicted."""
    m, p = job.model, job.parallel
    out = common_notes(job, prediction) + framework_notes(job, Framework.FSDP)
    out += fused_rmsnorm_note(job, "torchtitan (F.rms_norm)")
    # torchtitan 0.3.0's Llama 3: FusedQKVLinear (fuse_qkv=True), FeedForward's w1 and w3 apart
    out += projections_note(job, "torchtitan 0.3 (wqkv; w1, w3)", qkv=True, gate_up=False)
    if p.schedule is Schedule.ZB_H1:
        out.append("parallel.schedule: zb-h1 runs as InterleavedZeroBubble with one model part per rank "
                   "(PyTorch's one-chunk order is ZB-H1's); a release that wants two parts per rank "
                   "for it needs zb-v instead")
    elif p.schedule is Schedule.ZB_V:
        out.append("parallel.schedule: ZBVZeroBubble places rank 0's two parts at both ends of the model "
                   "(embedding and LM head on one rank); paraplan's stages keep the LM head on the last "
                   "stage, so stage 0's memory and the ends' times are placed differently")
    if p.zero_stage in (1, 2) and p.dp > 1:
        closest = ("less memory, more communication than predicted; re-predict with zero_stage: 2 for "
                   "closer numbers" if p.zero_stage == 1 else
                   "close to ZeRO-2, but parameters are still all-gathered again every step")
        out.append(f"parallel.zero_stage: torchtitan has no ZeRO-{p.zero_stage}; the recipe uses FSDP over "
                   f"dp={p.dp} with fsdp_reshard_after_forward = \"never\" (optimizer states, gradients and "
                   f"parameters sharded, parameters kept gathered from forward to backward): {closest}")
    if p.tp_comm_overlap or p.overlap_p2p_comm:
        out.append("parallel.tp_comm_overlap / overlap_p2p_comm: Megatron-LM's overlaps; torchtitan's async "
                   "TP is CompileConfig.enable_async_tensor_parallel (with torch.compile), not set here: "
                   "predict with async_tp: true for it")
    if p.recompute is Recompute.SELECTIVE:
        out.append("parallel.recompute: torchtitan's selective recompute is per-op (saves matmul and attention "
                   "outputs), not Megatron-LM's core-attention recompute the prediction assumed; "
                   "predict with recompute: op for torchtitan's own")
    if p.recompute is Recompute.LAYER:
        out.append(f"parallel.recompute: torchtitan {TORCHTITAN_VERSION} has no every-n-th-layer policy; the "
                   "recipe recomputes every layer (FullAC): more recompute than predicted; predict with "
                   "recompute: full for torchtitan's own")
    if (p.loss_chunks or 1) == 1:  # the recipe's loss is ChunkedLossWrapper (num_chunks 8)
        out.append(f"parallel.loss_chunks: the recipe computes the LM head and loss in {LOSS_CHUNKS} chunks "
                   "(ChunkedLossWrapper's num_chunks); the prediction held the whole logits: re-predict with "
                   f"loss_chunks: {LOSS_CHUNKS} for the recipe's memory")
    if p.fsdp_version == 1:  # a preset of an FSDP1 stack (fms-fsdp, Composer) or a stated one
        out.append("parallel.fsdp_version: the prediction followed FSDP1 (FullyShardedDataParallel: flat "
                   "parameters); torchtitan runs FSDP2 (fully_shard): re-predict with fsdp_version: 2 for its numbers")
    if p.optimizer_impl == "foreach":  # a preset of a 2024 stack (fms-fsdp, torchtitan 0.1) or a stated one
        out.append("parallel.optimizer_impl: the prediction ran torch's foreach AdamW (eight passes over the "
                   "shards); the recipe's optimizer is fused (OptimizersContainer implementation \"fused\"): "
                   "re-predict with optimizer_impl: fused for its step")
    if p.grad_reduce_in_fp32 is False and not job.precision.full_width:
        out.append("parallel.grad_reduce_in_fp32: torchtitan reduces gradients in float32 "
                   "(training.mixed_precision_reduce takes \"float32\" only); the prediction reduced them in bf16")
    if _flavor(job) is None and m.is_moe:
        shipped = ", ".join(f"{family} {flavor}" for family, flavor in _MOE_FLAVORS)
        out.append(
            f"model: {m.name} is not one of torchtitan's mixture-of-experts flavors ({shipped}); register a "
            f"model with num_layers={m.num_layers}, hidden_size={m.hidden_size}, heads={m.num_attention_heads}, "
            f"kv_heads={m.num_query_groups}, num_experts={m.num_moe_experts}, top_k={m.moe_router_topk}, "
            f"expert hidden={m.moe_ffn_hidden_size}, shared expert hidden="
            f"{m.moe_shared_expert_intermediate_size or 0}, MoE layers={sum(m.moe_layers)} of {m.num_layers} "
            f"(dense hidden {m.ffn_hidden_size}), router score={m.moe_router_score_function}, "
            f"vocab_size={m.vocab_size} and return its ModelSpec from model_spec()"
        )
    elif _flavor(job) is None:
        out.append(
            f"model: {m.name} is not one of torchtitan's llama3 flavors (8B, 70B, 405B); register a model "
            f"with num_layers={m.num_layers}, hidden_size={m.hidden_size}, heads={m.num_attention_heads}, "
            f"kv_heads={m.num_query_groups}, ffn_hidden_size={m.ffn_hidden_size}, "
            f"vocab_size={m.vocab_size}, activation={m.activation}, normalization={m.normalization}, "
            f"position_embedding={m.position_embedding}, bias={m.add_bias_linear}, "
            f"parallel_residual={m.parallel_residual} and return its ModelSpec from model_spec()"
        )
    if job.precision is Precision.FP8:
        out.append("precision: FP8 uses torchao's float8 converter (Float8LinearConverter, rowwise scaling by "
                   "default) under torch.compile, not Transformer Engine's recipe")
    return out


def torchtitan_config(job: Job, prediction: Prediction | None = None) -> dict[str, dict[str, Any]]:
    """What the recipe sets, by ``Trainer.Config`` field: ``training`` and ``parallelism`` (the
    keyword arguments of ``TrainingConfig`` and ``ParallelismConfig``), ``model`` (flavor and
    FP8), ``activation_checkpoint`` (the class name, or None) and ``checkpoint``."""
    m, p = job.model, job.parallel
    if job.precision is Precision.FP16:
        raise ConfigError("precision: torchtitan trains in bfloat16 or float32 "
                          "(training.mixed_precision_param) and has no fp16 loss scaling")
    recipe = p.fp8_recipe if job.precision is Precision.FP8 else None
    if recipe is FP8Recipe.NVFP4:
        # torchtitan's NVFP4 converter (pytorch/torchtitan#3914, torchao's NVFP4Linear) is configured
        # through the model registry's converters, not the float8 section this recipe writes
        raise ConfigError("parallel.fp8_recipe: nvfp4 is not exported to torchtitan (its NVFP4 converter is "
                          "set through the model registry, not [float8]); export to megatron")
    if recipe not in (None, FP8Recipe.ROWWISE):
        # torchtitan Float8LinearConverter.Config.recipe_name: Literal["rowwise", "rowwise_with_gw_hp"]
        raise ConfigError(f"parallel.fp8_recipe: torchtitan's Float8LinearConverter runs rowwise scaling "
                          f"(recipe_name rowwise | rowwise_with_gw_hp), not {recipe.value}; re-predict with "
                          "fp8_recipe rowwise, or export to megatron")
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
    training["mixed_precision_param"] = "float32" if job.precision.full_width else "bfloat16"
    training["mixed_precision_reduce"] = "float32"
    if p.offload_optimizer != p.offload_param or p.offload_param == "nvme":
        raise ConfigError("parallel.offload_optimizer: torchtitan's training.enable_cpu_offload moves parameters, "
                          "gradients and optimizer state together to the CPU; offload_optimizer and offload_param "
                          f"must both be 'cpu' or both 'none' (got {p.offload_optimizer!r}, {p.offload_param!r})")
    if p.cpu_offloading:
        raise ConfigError("parallel.cpu_offloading: torchtitan has no activation offload")
    if p.offload_param == "cpu":  # FSDP2's CPUOffloadPolicy: parameters, gradients, optimizer state
        training["enable_cpu_offload"] = True
    if p.pp > 1 or (m.is_moe and p.ep > 1):
        # torchtitan's CUDA graphs refuse pipeline parallelism and the standard all-to-all expert
        # dispatcher (its CPU synchronisation; Trainer.Config._validate_cuda_graphs)
        training["disable_cuda_graphs"] = True
    sharded = p.zero_stage > 0 and p.dp > 1
    shard = _dp_shard(job) if sharded else 1  # hybrid sharding (HSDP): replicas of the shard groups
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": p.dp // shard,
        "data_parallel_shard_degree": shard,
    }
    if sharded:
        parallelism["fsdp_reshard_after_forward"] = _RESHARD[p.zero_stage]
    parallelism["tensor_parallel_degree"] = p.tp
    if p.tp > 1:
        parallelism["enable_sequence_parallel"] = p.sequence_parallel
    parallelism["pipeline_parallel_degree"] = p.pp
    parallelism["pipeline_parallel_schedule"] = _SCHEDULE[p.schedule]
    parallelism["pipeline_parallel_microbatch_size"] = p.micro_batch_size
    if p.pp > 1:
        parallelism["module_fqns_per_model_part"] = _module_fqns(job)
    parallelism["context_parallel_degree"] = p.cp
    if m.is_moe:
        _check_experts(job, parallelism["data_parallel_shard_degree"])
        parallelism["expert_parallel_degree"] = p.ep
    family, flavor = _flavor(job) or (None, None)
    return {
        "model": {"family": family, "flavor": flavor, "float8": job.precision is Precision.FP8,
                  **({"float8_recipe": recipe.value} if recipe is not None else {})},
        "training": training,
        "parallelism": parallelism,
        "activation_checkpoint": {"class": _AC[p.recompute]},
        "checkpoint": {"enable": True, "folder": "checkpoint", "interval": _checkpoint_interval(prediction)},
    }


def render_torchtitan(job: Job, prediction: Prediction | None = None) -> str:
    """The recipe: a Python module whose ``paraplan_config()`` returns the ``Trainer.Config``."""
    check_prediction(job, prediction)
    config = torchtitan_config(job, prediction)
    c = job.cluster
    family, flavor, float8 = config["model"]["family"], config["model"]["flavor"], config["model"]["float8"]
    ac = config["activation_checkpoint"]["class"]
    ckpt = config["checkpoint"]
    head = header_lines(job, prediction, f"torchtitan configuration for torchtitan {TORCHTITAN_VERSION}",
                        Framework.FSDP)
    head += [f"{NOTE} {n}" for n in notes(job, prediction)]
    head += [
        "",
        "Save this file under a module name (letters, digits, _) and run on every node, its folder on",
        "PYTHONPATH:",
        f"  torchrun --nnodes {c.num_nodes} --nproc-per-node {c.gpus_per_node} --rdzv-backend c10d \\",
        "      --rdzv-endpoint <first node>:29500 -m torchtitan.train \\",
        f"      --module <file name without .py> --config {CONFIG_FUNCTION}",
        f"Resume: checkpoints go to ./outputs/{ckpt['folder']} (torchtitan's dump_folder) every {ckpt['interval']}",
        "steps; the same command run again loads the latest one there.",
        f"Names checked against torchtitan {TORCHTITAN_VERSION} (torchtitan/config/configs.py, trainer.py);",
        "torchtitan's defaults are not repeated.",
    ]
    imports = [
        "from torchtitan.components.checkpoint import CheckpointManager",
        "from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss",
        "from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw",
    ]
    if float8:
        imports.append("from torchtitan.components.quantization import Float8LinearConverter")
    async_tp = _async_tp(job)
    imports.append("from torchtitan.config import " + ", ".join(
        (["CompileConfig"] if float8 or async_tp or job.parallel.compile_loss else [])
        + ["ParallelismConfig", "TrainingConfig"]))
    if ac is not None:
        imports.append(f"from torchtitan.distributed.activation_checkpoint import {ac}")
    imports += [
        "from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader",
        "from torchtitan.models.common.config_utils import decoder_vocab_size",
    ]
    if flavor is not None:
        imports.append(f"from torchtitan.models.{family} import model_registry")
    imports.append("from torchtitan.trainer import Trainer")

    if flavor is None:
        spec_body = [
            f'    """{PLACEHOLDER}: {job.model.name} is not one of torchtitan\'s model flavors; register the',
            '    architecture of the model note above and return its ModelSpec here."""',
            f'    raise NotImplementedError("{PLACEHOLDER}: register {job.model.name} with torchtitan '
            'and return its ModelSpec")',
        ]
    elif float8:
        spec_body = [
            f"    # torchtitan's {family} {flavor}; FP8 matmuls through torchao's float8 (compiled: see compile=)",
            f'    return model_registry("{flavor}", converters=[Float8LinearConverter.Config('
            + (f'recipe_name="{config["model"]["float8_recipe"]}", ' if "float8_recipe" in config["model"] else "")
            + "model_compile_enabled=True)])",
        ]
    else:
        spec_body = [f"    # torchtitan's {family} {flavor}", f'    return model_registry("{flavor}")']

    steps_note = "" if "steps" in config["training"] else \
        f"  # {EDIT} the job has no train_tokens: torchtitan's default is 10000 steps"
    body = [
        f"def {CONFIG_FUNCTION}() -> Trainer.Config:",
        "    spec = model_spec()",
        "    return Trainer.Config(",
        "        model_spec=spec,",
        f'        hf_assets_path="./assets/hf/{PLACEHOLDER}",  # {EDIT} the folder with the tokenizer files',
        "        loss=ChunkedLossWrapper.Config(",
        *([f"            num_chunks={job.parallel.loss_chunks},"]
          if (job.parallel.loss_chunks or 1) not in (1, LOSS_CHUNKS) else []),
        "            loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(spec)),",
        "        ),",
        f"        optimizer=default_adamw(lr=3e-4),  # {EDIT} optimiser, schedule and data: placeholders",
        "        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=200),",
        '        dataloader=HuggingFaceTextDataLoader.Config(dataset="c4"),',
        "        training=TrainingConfig(" + steps_note,
        *[f"            {k}={_py(v, 12)}," for k, v in _stated("training", config["training"]).items()],
        "        ),",
        "        parallelism=ParallelismConfig(",
        *[f"            {k}={_py(v, 12)}," for k, v in _stated("parallelism", config["parallelism"]).items()],
        "        ),",
        f"        activation_checkpoint={'None' if ac is None else ac + '.Config()'},",
        "        checkpoint=CheckpointManager.Config("
        + ", ".join(f"{k}={_py(v)}" for k, v in _stated("checkpoint", ckpt).items()) + "),",
    ]
    # float8 needs the model compiled; the loss is compiled where the prediction's is (compile_loss:
    # a compiled loss holds fewer copies of the logits, ``prediction.framework_memory.loss_logits_bytes``)
    # async TP (parallel.async_tp) is inductor's micro-pipeline pass over the compiled model
    components = (["model"] if float8 or async_tp else []) + (["loss"] if job.parallel.compile_loss else [])
    if components:
        fused = ", enable_async_tensor_parallel=True" if async_tp else ""
        body.append(f"        compile=CompileConfig(enable=True, components={components!r}{fused}),".replace("'", '"'))
    body.append("    )")
    quotes = '"' * 3
    docstring = "r" + quotes + "\n".join(head).replace(quotes, "'" * 3) + "\n" + quotes
    parts = [docstring, "\n".join(imports), "\n".join(["def model_spec():", *spec_body]), "\n".join(body)]
    return "\n\n\n".join(parts) + "\n"


def _async_tp(job: Job) -> bool:
    """Whether the recipe turns on async TP (CompileConfig.enable_async_tensor_parallel): the plan's
    ``async_tp`` where there is TP to fuse (tp > 1, sequence parallel)."""
    p = job.parallel
    return bool(p.async_tp) and p.tp > 1 and p.sequence_parallel


def _checkpoint_interval(prediction: Prediction | None) -> int:
    """Steps between checkpoints: about an hour of predicted steps (torchtitan's 500 without one)."""
    if prediction is None:
        return 500
    return max(1, math.floor(CHECKPOINT_EVERY_S / prediction.iteration_s))


def _dp_shard(job: Job) -> int:
    """torchtitan's ``data_parallel_shard_degree`` for a plan that shards. torchtitan's
    ``ParallelDims`` (0.3.0 ``torchtitan/distributed/parallel_dims.py``: ``_validate``, world size
    = dp_replicate x dp_shard x cp x tp x pp; ``build_mesh``: FSDP shards over the ``fsdp`` mesh
    of dp_shard x cp ranks, ``dp_shard_cp`` in earlier releases, and replicates over
    ``dp_replicate``) counts the shard degree
    over the data-parallel ranks and always shards over every context-parallel rank besides;
    paraplan's ``data_parallel_shard_degree`` (``ParallelPlan.zero_shards``) counts the shard
    group's ranks of the dp x cp gradient group. So dp_shard = zero_shards / cp, which needs cp
    to divide the shard group."""
    p = job.parallel
    if p.zero_shards % p.cp:
        raise ConfigError(
            f"parallel.data_parallel_shard_degree: torchtitan shards over every context-parallel rank "
            f"(its dp_shard x cp mesh), so a shard group of {p.zero_shards} ranks needs a multiple of cp={p.cp}"
        )
    return p.zero_shards // p.cp


def _check_experts(job: Job, shard: int) -> None:
    """torchtitan 0.3.0 folds expert parallelism into the FSDP x CP x TP ranks
    (``ParallelDims``: efsdp = dp_shard * cp * tp / ep) and never splits an expert over TP ranks."""
    p = job.parallel
    if p.dispatcher != "alltoall":
        raise ConfigError(
            f"parallel.moe_token_dispatcher_type: the recipe writes torchtitan {TORCHTITAN_VERSION}'s all-to-all "
            f"dispatcher (its DeepEPTokenDispatcher is chosen in the model's own config, not a parallelism key); "
            f"{p.dispatcher!r}: re-predict with alltoall or export it as megatron"
        )
    if p.etp != 1:
        raise ConfigError(
            f"parallel.etp: torchtitan {TORCHTITAN_VERSION} has no expert_tensor_parallel_degree (its experts "
            f"are never tensor-parallel, etp=1); etp={p.etp}: re-predict with etp: 1"
        )
    ranks = shard * p.cp * p.tp
    if ranks % p.ep:
        raise ConfigError(
            f"parallel.ep: torchtitan {TORCHTITAN_VERSION} takes expert_parallel_degree from "
            f"data_parallel_shard_degree x cp x tp = {shard} x {p.cp} x {p.tp} = {ranks} ranks, which ep={p.ep} "
            "does not divide (ZeRO-0 replicates data parallelism and gives it no ranks)"
        )


def _flavor(job: Job) -> tuple[str, str] | None:
    """The torchtitan model (module, flavor) with exactly this architecture, if there is one."""
    m = job.model
    if m.is_moe:
        shape = (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_moe_experts, m.moe_router_topk,
                 m.moe_ffn_hidden_size, m.vocab_size)
        return next((key for key, dims in _MOE_FLAVORS.items() if dims == shape), None)
    if m.multi_latent_attention or m.qk_layernorm:
        return None
    if not (m.activation == "swiglu" and m.normalization == "rmsnorm" and m.position_embedding == "rotary"
            and m.rotary_percent == 1.0 and not m.add_bias_linear and not m.parallel_residual
            and m.untie_embeddings_and_output_weights):
        return None
    shape = (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.ffn_hidden_size,
             m.vocab_size)
    return next((("llama3", name) for name, dims in _LLAMA3_FLAVORS.items() if dims == shape), None)


def _module_fqns(job: Job) -> list[list[str]]:
    """Each (virtual) pipeline stage's modules in model order, as paraplan split the layers."""
    p = job.parallel
    if p.schedule is Schedule.ZB_V:  # 2 parts per rank, placed in a V by torchtitan
        parts_n = 2 * p.pp
        sizes = [job.model.num_layers // parts_n + (k < job.model.num_layers % parts_n) for k in range(parts_n)]
    elif p.vpp > 1:
        sizes = [layers_per_virtual_stage(job)] * (p.pp * p.vpp)
    else:
        sizes = list(layer_split(job))
    parts, start = [], 0
    for size in sizes:
        parts.append([f"layers.{i}" for i in range(start, start + size)])
        start += size
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "lm_head"]
    return parts


def _py(value: Any, indent: int = 0) -> str:
    """A Python literal; a list of lists with one inner list a line."""
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        pad = " " * (indent + 4)
        return "[\n" + "".join(f"{pad}{v!r},\n" for v in value) + " " * indent + "]"
    return repr(value)
