"""A plan as Megatron-LM command-line arguments for ``pretrain_gpt.py``.

Targets Megatron-LM with Megatron Core 0.16 or newer (:data:`TARGET`; megatron-core 0.16.1 on PyPI
has every feature used here: Megatron-FSDP's sharding strategies, ``pipeline_model_parallel_layout``,
the attention backends). Megatron-LM's parser (``megatron/training``) ships with the repository,
not with the megatron-core package, so it cannot be installed here: the tests check the flags
against the definitions listed below, read from the source at the commits named.

Every flag emitted here is one Megatron-LM's parser accepts at commit 080488c7 (:data:`CHECKED_AT`, from the
first stage of Megatron-LM's move of its flags to config dataclasses, after PR #2306 of November 2025): the tests parse every recipe with the parser rebuilt
from tests/fixtures/megatron_flags.json, which scripts/extract_megatron_flags.py reads from the files of
that one commit (``megatron/training/arguments.py``, whose training, validation and straggler flags
``ArgumentGroupFactory`` generates from the dataclasses of ``megatron/training/config.py``; since 2026
more groups are generated, from ``TransformerConfig``, ``CheckpointConfig``, ``DistributedInitConfig``...).
A flag whose default already does the job is left out (the defaults are the extract's). The groups,
as first read in ``megatron/training/arguments.py`` (2025, commit 000c4ac):

- ``_add_network_size_args``: --num-layers, --hidden-size, --ffn-hidden-size,
  --num-attention-heads, --kv-channels, --group-query-attention, --num-query-groups (default 1,
  given with GQA unless the model has one group), --max-position-embeddings, --position-embedding-type
  (choices learned_absolute | rope | mrope | relative | none: no ALiBi), --rotary-percent,
  --rotary-base (an int, default 10000),
  --make-vocab-size-divisible-by, --normalization (LayerNorm | RMSNorm), --swiglu,
  --untie-embeddings-and-output-weights, --attention-backend (flash | fused | unfused | local |
  auto). There is no flag for GPT-NeoX's parallel residual.
- ``TransformerConfig``: --attention-dropout and --hidden-dropout default to 0.1, so the model's
  own values are given unless they are 0.1.
- ``_add_training_args``: --micro-batch-size, --global-batch-size, --recompute-granularity
  (full | selective), --recompute-method (uniform | block), --recompute-num-layers,
  --disable-bias-linear, --sequence-parallel, --train-samples. ``--use-flash-attn`` still
  exists but only steers the legacy models; Megatron-Core picks its kernel with
  --attention-backend, which is what is emitted.
- ``_add_mixed_precision_args``: --fp16, --bf16; ``_add_transformer_engine_args``:
  --fp8-format (e4m3 | hybrid) on top of --bf16, --fp8-recipe (tensorwise | delayed | mxfp8 |
  blockwise; paraplan's current is tensorwise; rowwise is refused naming parallel.fp8_recipe);
  nvfp4 as --fp4-format e2m1 --fp4-recipe nvfp4 (Megatron Core low-precision training guide) on
  top of --bf16, without the FP8 flags.
- ``_add_distributed_args``: --tensor-model-parallel-size, --pipeline-model-parallel-size,
  --context-parallel-size, --num-layers-per-virtual-pipeline-stage,
  --decoder-first-pipeline-num-layers, --decoder-last-pipeline-num-layers,
  --pipeline-model-parallel-layout, --use-distributed-optimizer, --overlap-grad-reduce,
  --no-overlap-p2p-communication (the interleaved schedule overlaps its sends by default; there is no
  --overlap-p2p-communication), --tp-comm-overlap (ModelParallelConfig),
  --use-megatron-fsdp, --data-parallel-sharding-strategy (no_shard | optim | optim_grads |
  optim_grads_params); ``_add_checkpointing_args``: --ckpt-format fsdp_dtensor.
- ``validate_args``: vpp = layers per stage / --num-layers-per-virtual-pipeline-stage; only one
  of that flag, --num-virtual-stages-per-pipeline-rank and --pipeline-model-parallel-layout;
  seq_length divisible by 2*cp when cp > 1; Megatron-FSDP needs --ckpt-format fsdp_dtensor and
  CUDA_DEVICE_MAX_CONNECTIONS != 1, while tp > 1 or cp > 1 (before Blackwell) needs it = 1;
  --recompute-method only with full recompute. ``PipelineParallelLayerLayout.parse_str_to_list``
  (megatron/core/transformer/pipeline_parallel_layer_layout.py): layout strings such as
  ``Et*11|t*12|t*12|t*9L``.

Mixtures of experts (``_add_moe_args`` and the MoE README of Megatron-LM, NVIDIA's DeepSeek-V3 and
Qwen3 launch scripts in NVIDIA's Megatron-MoE-ModelZoo): --num-experts, --moe-router-topk,
--moe-ffn-hidden-size, --moe-shared-expert-intermediate-size, --moe-layer-freq (int N, or a list
expression that ``moe_freq_type`` evaluates), --moe-router-score-function (softmax | sigmoid),
--moe-router-load-balancing-type (aux_loss | seq_aux_loss | sinkhorn | none), --moe-aux-loss-coeff,
--moe-expert-capacity-factor, --moe-grouped-gemm, --moe-token-dispatcher-type (allgather | alltoall |
flex | alltoall_seq; ``TransformerConfig`` accepts the capacity factor and the shared-expert overlap
with alltoall only), --moe-flex-dispatcher-backend (deepep | hybridep, with flex),
--moe-router-num-groups / --moe-router-group-topk (group-limited routing), --expert-model-parallel-size, --expert-tensor-parallel-size,
--moe-shared-expert-overlap, --overlap-moe-expert-parallel-comm with --delay-wgrad-compute (as
NVIDIA's scripts give them); MLA: --multi-latent-attention, --q-lora-rank, --kv-lora-rank,
--qk-head-dim, --qk-pos-emb-head-dim, --v-head-dim; --qk-layernorm.

The recipe is a bash array (``MEGATRON_ARGS=( ... )``) so that comments can sit beside the
flags and a launcher can pass ``"${MEGATRON_ARGS[@]}"``. Data, tokenizer and optimiser
arguments are not part of a parallel plan; the recipe says so instead of inventing them.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from paraplan.export._common import (
    EDIT,
    NOTE,
    check_prediction,
    comment,
    common_notes,
    fused_rmsnorm_note,
    header_lines,
    layer_split,
    layers_per_virtual_stage,
    micro_batches,
    projections_note,
    refuse_zero_bubble,
    train_iterations,
)
from paraplan.specs import ConfigError, FP8Recipe, Framework, Job, Precision, Recompute, Schedule
from paraplan.specs.pipeline_layout import split_given, stage_grid

if TYPE_CHECKING:
    from paraplan.prediction import Prediction

TARGET = "Megatron Core >= 0.16"
CHECKED_AT = "080488c7"  # the Megatron-LM commit of tests/fixtures/megatron_flags.json (a test ties them)
_POSITION = {"rotary": "rope", "learned": "learned_absolute", "none": "none", "alibi": "none"}
_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}  # Megatron-FSDP's names for ZeRO-2 / ZeRO-3


def megatron_args(job: Job) -> list[str]:
    """The flags as argv tokens (what ``"${MEGATRON_ARGS[@]}"`` expands to)."""
    return [token for _, flags in _groups(job) for flag in flags for token in flag]


def notes(job: Job, prediction: Prediction | None = None) -> list[str]:
    """What Megatron-LM will do differently from the plan paraplan predicted."""
    m, p = job.model, job.parallel
    out = common_notes(job, prediction) + fused_rmsnorm_note(job, "Megatron-LM (Transformer Engine)")
    out += projections_note(job, "Megatron-LM (linear_qkv, linear_fc1)", qkv=True, gate_up=True)
    if m.parallel_residual:
        out.append("model.parallel_residual: Megatron-LM's GPT has no parallel-residual flag; "
                   "it runs sequential attention -> MLP (same FLOPs and parameters, different model)")
    if m.position_embedding == "alibi":
        out.append("model.position_embedding: Megatron-LM has no ALiBi; the recipe uses "
                   "--position-embedding-type none")
    if p.schedule is Schedule.GPIPE and p.pp > 1:
        out.append("parallel.schedule: Megatron-LM has no GPipe schedule; it runs 1F1B (same bubble, "
                   "fewer activations in flight than predicted)")
    if p.zero_stage >= 2:
        out.append(f"parallel.zero_stage: ZeRO-{p.zero_stage} maps to Megatron-FSDP "
                   f"(--data-parallel-sharding-strategy {_SHARDING[p.zero_stage]}); it needs "
                   "--ckpt-format fsdp_dtensor and CUDA_DEVICE_MAX_CONNECTIONS unset")
    if p.grad_reduce_in_fp32 is False and job.precision in (Precision.BF16, Precision.FP8):
        out.append("parallel.grad_reduce_in_fp32: Megatron-LM reduces bf16 models' gradients in fp32; the "
                   "prediction reduced them in bf16")
    if p.data_parallel_shard_degree is not None and p.zero_stage >= 2:
        out.append("parallel.data_parallel_shard_degree: Megatron-FSDP shards over the whole data-parallel "
                   "group; hybrid sharding is --num-distributed-optimizer-instances with ZeRO-1 only")
    if p.framework is Framework.FSDP:
        out.append("parallel.framework: the prediction followed PyTorch FSDP; in Megatron-LM, ZeRO-3 is "
                   "Megatron-FSDP and recompute is --recompute-granularity, re-predict with framework: megatron")
    if p.recompute in (Recompute.LAYER, Recompute.OP):
        out.append(f"parallel.recompute: Megatron-LM has no {p.recompute.value!r} policy; closest: "
                   "--recompute-granularity full --recompute-method block")
    if p.framework is Framework.DEEPSPEED:
        out.append("parallel.framework: the prediction followed DeepSpeed (gradients reduced after the "
                   "pipeline drains); Megatron-LM overlaps them only with --overlap-grad-reduce, left out "
                   "to match; re-predict with framework: megatron for Megatron-LM's own behaviour")
    if m.padded_vocab_size is not None and m.padded_vocab_size != _megatron_padded_vocab(job):
        out.append(f"model.padded_vocab_size: the prediction used {m.padded_vocab_size} rows; Megatron-LM "
                   f"pads the tokenizer's vocabulary to {_megatron_padded_vocab(job)} "
                   f"(--make-vocab-size-divisible-by {m.make_vocab_size_divisible_by} x tp)")
    out += _cuda_graph_note(job)
    if p.tp_comm_overlap and p.tp_comm_overlap_cfg:
        out.append(f"parallel.tp_comm_overlap_cfg: the prediction priced Transformer Engine's userbuffers as "
                   f"catalog/userbuffers/{p.tp_comm_overlap_cfg}.yaml configures them; pass that file's "
                   "methods as --tp-comm-overlap-cfg <yaml> (without it TE runs its default methods)")
    split = layer_split(job)
    if p.pp > 1 and len(set(split)) > 1 and _first_last(split) is None and (p.layers_per_stage or not split_given(p)):
        out.append("parallel.layers_per_stage: expressed with --pipeline-model-parallel-layout, "
                   "which needs a 2025 or newer Megatron-LM")
    return out


# Megatron-LM's --fp8-recipe for each recipe paraplan models (megatron/training/arguments.py:
# choices tensorwise | delayed | mxfp8 | blockwise) and its --fp8-format: hybrid (E4M3 forward,
# E5M2 gradients) for the per-tensor recipes, e4m3 for MXFP8 (Transformer Engine's MXFP8
# default: the block scales give the gradients their range)
_MEGATRON_FP8 = {FP8Recipe.DELAYED: ("delayed", "hybrid"), FP8Recipe.CURRENT: ("tensorwise", "hybrid"),
                 FP8Recipe.MXFP8: ("mxfp8", "e4m3")}


def _fp8_flags(recipe: FP8Recipe | None) -> list[list[str]]:
    """--fp8-format and --fp8-recipe for ``recipe`` (None: the format alone, Megatron-LM's
    default recipe delayed); a ConfigError for a recipe Megatron-LM does not run."""
    if recipe is None:
        return [["--fp8-format", "hybrid"]]
    if recipe is FP8Recipe.NVFP4:
        # Megatron-Core's FP4 flags (low-precision training guide: "--fp8-recipe / --fp4-recipe",
        # NVFP4 with --fp4-format e2m1 on Blackwell), in place of the FP8 ones
        return [["--fp4-format", "e2m1"], ["--fp4-recipe", "nvfp4"]]
    if recipe not in _MEGATRON_FP8:
        raise ConfigError(f"parallel.fp8_recipe: Megatron-LM has no {recipe.value} recipe (--fp8-recipe "
                          "tensorwise | delayed | mxfp8 | blockwise, --fp4-recipe nvfp4); re-predict with fp8_recipe delayed "
                          "| current | mxfp8 | nvfp4, or export to torchtitan")
    name, fmt = _MEGATRON_FP8[recipe]
    return [["--fp8-format", fmt], ["--fp8-recipe", name]]


def render_megatron(job: Job, prediction: Prediction | None = None) -> str:
    """A bash snippet defining ``MEGATRON_ARGS`` for ``pretrain_gpt.py``."""
    check_prediction(job, prediction)
    refuse_zero_bubble(job, "Megatron-LM")
    head = header_lines(job, prediction, f"Megatron-LM arguments for pretrain_gpt.py ({TARGET})",
                        Framework.MEGATRON)
    head += [f"{NOTE} {n}" for n in notes(job, prediction)]
    head += [
        f"Flags: those NVIDIA/Megatron-LM's parser accepts at commit {CHECKED_AT} (megatron/training/arguments.py",
        "  and the config dataclasses it generates flags from); Megatron-LM's defaults are not repeated.",
        f"{EDIT} data (--data-path ... or --mock-data), tokenizer (--tokenizer-type ...) and the optimiser",
        "      (--lr, --min-lr, --lr-decay-style, --weight-decay, ...) are not part of the plan; add them.",
        "Use: source this file, then",
        '  torchrun ... pretrain_gpt.py "${MEGATRON_ARGS[@]}" <data, tokenizer and optimiser arguments>',
    ]
    body = ["MEGATRON_ARGS=("]
    for title, flags in _groups(job):
        if not flags:
            continue
        body.append(f"    # {title}")
        body += ["    " + " ".join(_quote(t) for t in flag) for flag in flags]
    body.append(")")
    return comment(head) + "\n" + "\n".join(body) + "\n"


def _groups(job: Job) -> list[tuple[str, list[list[str]]]]:
    m, p = job.model, job.parallel
    model: list[list[str]] = [
        ["--num-layers", str(m.num_layers)],
        ["--hidden-size", str(m.hidden_size)],
        ["--ffn-hidden-size", str(m.ffn_hidden_size)],
        ["--num-attention-heads", str(m.num_attention_heads)],
    ]
    if m.num_query_groups != m.num_attention_heads:
        model.append(["--group-query-attention"])
        if m.num_query_groups != 1:  # --num-query-groups defaults to 1 (multi-query attention)
            model.append(["--num-query-groups", str(m.num_query_groups)])
    if m.kv_channels != m.hidden_size // m.num_attention_heads:
        model.append(["--kv-channels", str(m.kv_channels)])
    model += [
        ["--seq-length", str(m.seq_length)],
        ["--max-position-embeddings", str(m.seq_length)],
    ]
    if _POSITION[m.position_embedding] != "learned_absolute":  # Megatron-LM's default
        model.append(["--position-embedding-type", _POSITION[m.position_embedding]])
    if m.position_embedding == "rotary" and m.rotary_percent != 1.0:
        model.append(["--rotary-percent", f"{m.rotary_percent:g}"])
    if m.rope_theta is not None and round(m.rope_theta) != 10000:  # --rotary-base: an int, default 10000
        model.append(["--rotary-base", f"{m.rope_theta:.0f}"])
    if m.position_embedding == "rotary" and not m.rope_fusion:  # --no-rope-fusion: fused by default
        model.append(["--no-rope-fusion"])
    if m.normalization == "rmsnorm":  # default LayerNorm
        model.append(["--normalization", "RMSNorm"])
    if m.activation == "swiglu":
        model.append(["--swiglu"])
        if not m.swiglu_fusion:
            model.append(["--no-bias-swiglu-fusion"])
    if m.untie_embeddings_and_output_weights:
        model.append(["--untie-embeddings-and-output-weights"])
    if m.mtp_num_layers:  # Megatron-Core's multi-token prediction (DeepSeek-V3 report section 2.2)
        model.append(["--mtp-num-layers", str(m.mtp_num_layers)])
    if not m.add_bias_linear:
        model.append(["--disable-bias-linear"])
    if m.qk_layernorm:
        model.append(["--qk-layernorm"])
    if m.multi_latent_attention:
        model.append(["--multi-latent-attention"])
        if m.q_lora_rank is not None:
            model.append(["--q-lora-rank", str(m.q_lora_rank)])
        # _add_mla_args' defaults: kv-lora-rank 32, qk-head-dim 128, qk-pos-emb-head-dim 64, v-head-dim 128
        model += [[flag, str(value)] for flag, value, default in (
            ("--kv-lora-rank", m.kv_lora_rank, 32), ("--qk-head-dim", m.qk_head_dim, 128),
            ("--qk-pos-emb-head-dim", m.qk_pos_emb_head_dim, 64), ("--v-head-dim", m.v_head_dim, 128))
            if value != default]
    # both dropouts default to 0.1 (TransformerConfig), so the model's own values are given unless equal
    model += [[flag, f"{value:g}"] for flag, value in (("--attention-dropout", m.attention_dropout),
                                                        ("--hidden-dropout", m.hidden_dropout)) if value != 0.1]
    model.append(["--attention-backend", "flash" if m.attention == "flash" else "unfused"])  # default: auto
    if m.make_vocab_size_divisible_by != 128:
        model.append(["--make-vocab-size-divisible-by", str(m.make_vocab_size_divisible_by)])

    if p.cp > 1 and m.seq_length % (2 * p.cp):
        raise ConfigError(
            f"parallel.cp: Megatron-LM needs seq_length ({m.seq_length}) divisible by 2*cp = {2 * p.cp}"
        )
    # each degree defaults to 1
    par: list[list[str]] = [[flag, str(degree)] for flag, degree in (
        ("--tensor-model-parallel-size", p.tp), ("--pipeline-model-parallel-size", p.pp),
        ("--context-parallel-size", p.cp)) if degree > 1]
    if p.cp > 1 and p.cp_comm != "p2p":  # --cp-comm-type defaults to p2p; Transformer Engine takes
        # p2p | all_gather | a2a (its AttnFuncWithCPAndKVAllGather is "all_gather")
        par.append(["--cp-comm-type", "all_gather" if p.cp_comm == "allgather" else p.cp_comm])
    if p.sequence_parallel and p.tp > 1:
        par.append(["--sequence-parallel"])
    par += _pipeline_split(job)
    if p.zero_stage == 1:
        par.append(["--use-distributed-optimizer"])
    elif p.zero_stage >= 2:
        par += [["--use-megatron-fsdp"], ["--data-parallel-sharding-strategy", _SHARDING[p.zero_stage]],
                ["--ckpt-format", "fsdp_dtensor"]]
    if p.overlaps_grad_reduce and p.grad_group > 1:
        par.append(["--overlap-grad-reduce"])
    if p.tp_comm_overlap:
        par.append(["--tp-comm-overlap"])
    if p.vpp > 1 and not p.overlap_p2p_comm:
        # Megatron-LM overlaps the interleaved schedule's sends by default (--no-overlap-p2p-communication,
        # dest overlap_p2p_comm, store_false; validate_args turns it off without interleaving): the plan's
        # blocking sends have to be asked for. There is no --overlap-p2p-communication flag.
        par.append(["--no-overlap-p2p-communication"])
    if p.data_parallel_shard_degree is not None and p.zero_stage == 1 and p.grad_group > p.data_parallel_shard_degree:
        par.append(["--num-distributed-optimizer-instances", str(p.grad_group // p.data_parallel_shard_degree)])

    if p.offload_param != "none" or p.offload_optimizer == "nvme":
        raise ConfigError("parallel.offload_param: Megatron-LM offloads only the optimizer, to the CPU "
                          "(--optimizer-cpu-offload); parameter and NVMe offload are DeepSpeed's")
    if p.offload_optimizer == "cpu":
        # Megatron-Core's HybridDeviceOptimizer with the whole state on the CPU, with the flags its
        # guide names (docs.nvidia.com/megatron-core, "Optimizer CPU offload package"). Its
        # --overlap-cpu-optimizer-d2h-h2d is left off: the prediction keeps the copies in series
        # (--optimizer-offload-fraction defaults to 1.0: the whole state)
        par += [["--optimizer-cpu-offload"], ["--use-precision-aware-optimizer"]]
    if p.cpu_offloading:
        raise ConfigError(
            "parallel.cpu_offloading: Megatron-Core's TransformerConfig.cpu_offloading has no Megatron-LM "
            "command-line flag paraplan can vouch for; set cpu_offloading=True, cpu_offloading_num_layers="
            f"{p.cpu_offloading_num_layers} in the model config (Megatron-Bridge: model.cpu_offloading)"
        )
    batch = [["--micro-batch-size", str(p.micro_batch_size)], ["--global-batch-size", str(p.global_batch_size)]]

    memory: list[list[str]] = []
    if p.recompute is Recompute.FULL:
        memory += [["--recompute-granularity", "full"], ["--recompute-method", p.recompute_method or "uniform"],
                   ["--recompute-num-layers", str(p.recompute_num_layers or 1)]]
    elif p.recompute is Recompute.SELECTIVE:
        memory.append(["--recompute-granularity", "selective"])
        if p.recompute_modules is not None and tuple(p.recompute_modules) != ("core_attn",):  # the default
            memory.append(["--recompute-modules", *p.recompute_modules])
    if p.cross_entropy_loss_fusion:  # store_true, off by default
        memory.append(["--cross-entropy-loss-fusion"])
    if job.precision is Precision.BF16:
        memory.append(["--bf16"])
    elif job.precision is Precision.FP16:
        memory.append(["--fp16"])
    elif job.precision is Precision.FP8:
        memory += [["--bf16"], *_fp8_flags(p.fp8_recipe)]

    length: list[list[str]] = []
    iterations = train_iterations(job)
    if iterations is not None:
        length.append(["--train-samples", str(iterations * p.global_batch_size)])

    return [
        ("model", model),
        *_experts(job),
        (f"parallelism (data-parallel size {p.dp} = {job.cluster.num_gpus} GPUs / (tp*pp*cp); "
         "Megatron-LM derives it)", par),
        (f"batch ({micro_batches(job)} per iteration)", batch),
        ("recompute and precision", memory),
        ("partial CUDA graphs (parallel.cuda_graph_scope)", _cuda_graph_flags(job)),
        (f"training length: {job.train_tokens:.4g} tokens = {iterations} iterations" if iterations else "", length),
    ]


def _experts(job: Job) -> list[tuple[str, list[list[str]]]]:
    """The mixture-of-experts flags (none for a dense model)."""
    m, p = job.model, job.parallel
    if not m.is_moe:
        return []
    model: list[list[str]] = [["--num-experts", str(m.num_moe_experts)]]
    if m.moe_router_topk != 2:  # TransformerConfig.moe_router_topk defaults to 2
        model.append(["--moe-router-topk", str(m.moe_router_topk)])
    model.append(["--moe-ffn-hidden-size", str(m.moe_ffn_hidden_size)])
    if m.moe_shared_expert_intermediate_size:
        model.append(["--moe-shared-expert-intermediate-size", str(m.moe_shared_expert_intermediate_size)])
    if moe_layer_freq(job) != "1":  # default: every layer
        model.append(["--moe-layer-freq", moe_layer_freq(job)])
    if m.moe_router_score_function != "softmax":
        model.append(["--moe-router-score-function", m.moe_router_score_function])
    if m.moe_aux_loss_coeff > 0:  # aux_loss is the default balancing; its coefficient defaults to 0
        model.append(["--moe-aux-loss-coeff", f"{m.moe_aux_loss_coeff:g}"])
    else:
        model.append(["--moe-router-load-balancing-type", "none"])
    if m.moe_router_num_groups and m.moe_router_group_topk:
        model += [["--moe-router-num-groups", str(m.moe_router_num_groups)],
                  ["--moe-router-group-topk", str(m.moe_router_group_topk)]]
    if m.moe_expert_capacity_factor is not None:
        model.append(["--moe-expert-capacity-factor", f"{m.moe_expert_capacity_factor:g}"])
    if m.moe_grouped_gemm:
        model.append(["--moe-grouped-gemm"])
    par: list[list[str]] = []
    if p.ep > 1:
        par.append(["--expert-model-parallel-size", str(p.ep)])
    if p.etp != p.tp:  # Megatron-Core sets expert_tensor_parallel_size = tp when it is not given
        par.append(["--expert-tensor-parallel-size", str(p.etp)])
    why = []
    if p.moe_token_dispatcher_type is not None:
        why.append("as the plan states (parallel.moe_token_dispatcher_type)")
    elif p.ep > 1:
        why.append(f"ep={p.ep}: the all-to-all dispatch and combine paraplan predicted "
                   "(Megatron-LM's default, allgather, gathers every token on every expert rank)")
    if m.moe_expert_capacity_factor is not None:
        why.append("the capacity factor works with alltoall only")
    if p.moe_shared_expert_overlap and p.moe_token_dispatcher_type is None:
        why.append("the shared-expert overlap works with alltoall only")
    if p.overlap_moe_expert_parallel_comm:
        why.append("the expert-parallel overlap hides the all-to-alls")
    dispatcher = p.moe_token_dispatcher_type or "alltoall"
    if why and dispatcher != "allgather":  # allgather: Megatron-LM's default, not restated
        par.append(["--moe-token-dispatcher-type", dispatcher])
    if dispatcher == "flex" and p.dispatcher != "deepep":  # --moe-flex-dispatcher-backend defaults to deepep
        par.append(["--moe-flex-dispatcher-backend", p.dispatcher])
    if p.moe_shared_expert_overlap:
        par.append(["--moe-shared-expert-overlap"])
    if p.overlap_moe_expert_parallel_comm:  # NVIDIA's DeepSeek-V3 / Qwen3 scripts give both
        par += [["--overlap-moe-expert-parallel-comm"], ["--delay-wgrad-compute"]]
    title = (f"experts: ep={p.ep} x etp={p.etp} fold into each stage's tp*cp*dp = {p.tp * p.cp * p.dp} ranks "
             f"(expert data-parallel size {p.edp}; Megatron-LM derives it)")
    if why:
        title += f"; {dispatcher} dispatcher: " + "; ".join(why)
    return [("mixture of experts", model), (title, par)]


def _cuda_graph_flags(job: Job) -> list[list[str]]:
    """parallel.cuda_graph_scope as Megatron-LM's flags: the attention's graphs are
    ``--cuda-graph-impl transformer_engine --cuda-graph-scope attn``, which the parser at
    :data:`CHECKED_AT` accepts (one scope of full | attn | full_iteration); its moe_router and
    moe_preprocess scopes (``--cuda-graph-scope attn moe_router moe_preprocess``, a list in later
    Megatron-LM, as NVIDIA's DeepSeek-V3 GB200 guide runs it) are said in ``notes``."""
    scope = job.parallel.cuda_graph_scope or ()
    if "attn" not in scope:
        return []
    return [["--cuda-graph-impl", "transformer_engine"], ["--cuda-graph-scope", "attn"]]


def _cuda_graph_note(job: Job) -> list[str]:
    moe = [s for s in job.parallel.cuda_graph_scope or () if s != "attn"]
    if not moe:
        return []
    return [f"parallel.cuda_graph_scope: {' '.join(moe)} is not a --cuda-graph-scope of Megatron-LM at "
            f"{CHECKED_AT} (one of full | attn | full_iteration); newer Megatron-LM takes "
            f"--cuda-graph-impl transformer_engine --cuda-graph-scope {' '.join(job.parallel.cuda_graph_scope or ())}"]


def moe_layer_freq(job: Job) -> str:
    """``--moe-layer-freq``: an int N (a MoE layer every N-th layer from the first) or, for any
    other pattern (first dense layers included), Megatron-LM's list expression (``moe_freq_type``
    evaluates it), the shortest of: the runs of equal layers, or runs then a repeated block, e.g.
    ``([0]*3+[1]*58)`` or ``([0]*1+([1]+[0])*4)``."""
    m = job.model
    if isinstance(m.moe_layer_freq, int) and not m.moe_first_k_dense:
        return str(m.moe_layer_freq)
    pattern = [int(v) for v in m.moe_layers]
    best = _runs(pattern)
    n = len(pattern)
    for start in range(n):
        for period in range(1, (n - start) // 2 + 1):
            repeats, rest = divmod(n - start, period)
            block = pattern[start:start + period]
            if rest or block * repeats != pattern[start:]:
                continue
            inner = _runs(block)[1:-1]
            head = _runs(pattern[:start])[1:-1] + "+" if start else ""
            candidate = f"({head}({inner})*{repeats})"
            if len(candidate) < len(best):
                best = candidate
    return best


def _runs(pattern: list[int]) -> str:
    """``([0]*3+[1]*58)``: the pattern as runs of equal values."""
    runs = [(v, len(list(group))) for v, group in itertools.groupby(pattern)]
    return "(" + "+".join(f"[{v}]" if k == 1 else f"[{v}]*{k}" for v, k in runs) + ")"


def _pipeline_split(job: Job) -> list[list[str]]:
    """The flags of the plan's pipeline split: the Megatron-LM fields as the plan states them
    (``specs.pipeline_layout``), or the split paraplan predicted (a layout string where the
    stages' chunks are not num_layers / (pp x vpp) each)."""
    p = job.parallel
    if p.pipeline_model_parallel_layout is not None:  # sets vpp itself: no vpp flag beside it
        return [["--pipeline-model-parallel-layout", p.pipeline_model_parallel_layout]]
    flags = [[flag, str(n)] for flag, n in (("--decoder-first-pipeline-num-layers", p.decoder_first_pipeline_num_layers),
                                           ("--decoder-last-pipeline-num-layers", p.decoder_last_pipeline_num_layers))
             if n is not None]
    flags += [[flag] for flag, on in (("--account-for-embedding-in-pipeline-split", p.account_for_embedding_in_pipeline_split),
                                      ("--account-for-loss-in-pipeline-split", p.account_for_loss_in_pipeline_split)) if on]
    if flags:
        if p.vpp > 1:  # chunks of unequal stages: the count of chunks, not their size
            flags.append(["--num-virtual-stages-per-pipeline-rank", str(p.vpp)])
        return flags
    if p.vpp == 1:
        return _uneven_split(job)
    grid = stage_grid(job.model.num_layers, p)
    if len({n for row in grid for n in row}) == 1:
        return [["--num-layers-per-virtual-pipeline-stage", str(layers_per_virtual_stage(job))]]
    stages = [f"t*{grid[i][c]}" if grid[i][c] else "" for c in range(p.vpp) for i in range(p.pp)]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "L"
    return [["--pipeline-model-parallel-layout", "|".join(stages)]]


def _uneven_split(job: Job) -> list[list[str]]:
    """Flags for a pipeline split that is not num_layers/pp everywhere (none when it is)."""
    split = layer_split(job)
    if job.parallel.pp == 1 or len(set(split)) == 1:
        return []
    first_last = _first_last(split)
    if first_last is not None:
        first, last = first_last
        flags = []
        if first is not None:
            flags.append(["--decoder-first-pipeline-num-layers", str(first)])
        if last is not None:
            flags.append(["--decoder-last-pipeline-num-layers", str(last)])
        return flags
    stages = [f"t*{n}" if n else "" for n in split]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "L"
    return [["--pipeline-model-parallel-layout", "|".join(stages)]]


def _first_last(split: tuple[int, ...]) -> tuple[int | None, int | None] | None:
    """(first, last) layer counts when the middle stages are equal (Megatron-LM's uneven split)."""
    if len(split) == 2:
        return split[0], split[1]
    middle = set(split[1:-1])
    if len(middle) != 1:
        return None
    even = middle.pop()
    if even == 0:
        return None
    return (split[0] if split[0] != even else None), (split[-1] if split[-1] != even else None)


def _megatron_padded_vocab(job: Job) -> int:
    m = job.model
    multiple = m.make_vocab_size_divisible_by * job.parallel.tp
    return -(-m.vocab_size // multiple) * multiple


def _quote(token: str) -> str:
    import shlex

    return shlex.quote(token)
