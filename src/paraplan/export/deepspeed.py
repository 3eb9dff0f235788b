"""A plan as a DeepSpeed config JSON (``ds_config.json``).

Targets DeepSpeed 0.19.8 (PyPI, 2026-10, :data:`DEEPSPEED_VERSION`); the tests load every recipe
with that release's own ``deepspeed.runtime.config.DeepSpeedConfig`` (its pydantic models) when
DeepSpeed is installed (``pip install -e ".[frameworks]"``, part of ``dev``).

Keys checked against deepspeedai/DeepSpeed ``deepspeed/runtime/config.py`` (``DeepSpeedConfig``):
``train_batch_size``, ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps`` (it
asserts train_batch_size = micro batch x accumulation steps x world size, where the world size
is ``mpu.get_data_parallel_world_size()`` when the launching framework passes its model-parallel
unit, i.e. the data-parallel size), ``zero_optimization.stage`` (+
``overlap_comm`` where the plan differs from DeepSpeed's default, which depends on the stage: true for
ZeRO-3, false for ZeRO-1/2, ``deepspeed/runtime/zero/config.py`` ``overlap_comm_valid``. ZeRO-3 keeps
true unless the plan sets ``overlap_grad_reduce: false``; ZeRO-1/2 get what the prediction assumed; a
NOTE says where the prediction assumed otherwise), ``fp16`` / ``bf16`` ``enabled`` (the one in use;
both enabled is an error), ``activation_checkpointing.partition_activations`` (with sequence
parallelism), ``steps_per_print``. Keys that would restate DeepSpeed's defaults are left out.
``DeepSpeedConfig`` reads only the keys it knows, so the ``_paraplan`` block below is ignored by DeepSpeed.

What DeepSpeed's JSON cannot hold, and where it comes from instead (recorded in
``_paraplan.launcher`` so that nothing is dropped silently):

- tensor parallelism: DeepSpeed's pipeline engine and ZeRO take TP from the launching
  framework's model-parallel unit (Megatron-DeepSpeed ``--tensor-model-parallel-size``, GPT-NeoX
  ``model_parallel_size``). DeepSpeed's own AutoTP (``"tensor_parallel": {"autotp_size": N}``,
  deepspeed/runtime/tensor_parallel/config.py) shards Hugging Face modules instead; it is not
  used here because it would conflict with the framework's TP.
- pipeline parallelism: ``PipelineModule(num_stages=pp)`` in the framework's code
  (GPT-NeoX ``pipe_parallel_size``); DeepSpeed's ``pipeline`` config block holds only
  partitioning options. Its engine runs 1F1B: no GPipe and no interleaved (vpp) schedule.
- recompute: the framework decides what to wrap in ``deepspeed.checkpointing``; the JSON only
  configures how the checkpoints are stored.
- context parallelism and FP8: not DeepSpeed features (Ulysses sequence parallelism is a
  different algorithm; FP8 GEMMs come from Transformer Engine in the framework).

Mixtures of experts: DeepSpeed's MoE layer is built by the launching framework, so
``_paraplan.launcher.megatron_deepspeed_moe_args`` holds Megatron-DeepSpeed's arguments
(``megatron/arguments.py``: --num-experts, --moe-expert-parallel-size, --topk, --mlp-type standard,
--expert-interval, --disable-moe-token-dropping or --moe-train-capacity-factor, --moe-loss-coeff).
Refused, naming the field: shared experts (its ``residual`` MLP type is PR-MoE, a different model),
MLA, sigmoid routers (``TopKGate`` is softmax), etp > 1, an ep that does not divide dp
(``deepspeed/utils/groups.py`` carves expert groups out of the data-parallel ranks) and MoE layers
that are not every n-th layer (``get_num_experts_per_layer``: layer i, from 0, when (i+1) % n == 0).

ZeRO-2/3 together with pipeline parallelism is refused with a ConfigError: DeepSpeed's pipeline
engine supports ZeRO stage 0 or 1 only.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from paraplan.export._common import (
    check_prediction,
    common_notes,
    framework_notes,
    header_lines,
    layer_split,
    refuse_zero_bubble,
    train_iterations,
)
from paraplan.specs import ConfigError, Framework, Job, Precision, Recompute, Schedule

if TYPE_CHECKING:
    from paraplan.prediction import Prediction

DEEPSPEED_VERSION = "0.19.8"  # the release the recipe targets (and the tests load it with)


# where ZeRO-Infinity's NVMe offload writes: a placeholder, the node's local NVMe mount
NVME_PATH = "/local_nvme"


def notes(job: Job, prediction: Prediction | None = None) -> list[str]:
    """What the DeepSpeed config cannot say, or DeepSpeed will do differently."""
    p = job.parallel
    out = common_notes(job, prediction)
    if "nvme" in (p.offload_optimizer, p.offload_param):
        out.append(f"zero_optimization: nvme_path {NVME_PATH} is a placeholder: point it at each node's local NVMe")
    out.append(f"tp={p.tp} and pp={p.pp} are set in the launching framework, not in this file "
               "(see _paraplan.launcher)")
    if p.recompute is not Recompute.NONE:
        out.append(f"parallel.recompute: {p.recompute.value} recompute is switched on in the launching "
                   "framework (Megatron-DeepSpeed --recompute-granularity, GPT-NeoX checkpoint_activations); "
                   "this file only configures how checkpoints are stored")
    if p.schedule is Schedule.INTERLEAVED:
        out.append(f"parallel.vpp: DeepSpeed's pipeline engine has no interleaved schedule; vpp={p.vpp} "
                   "needs a launching framework with its own interleaved 1F1B")
    elif p.schedule is Schedule.GPIPE and p.pp > 1:
        out.append("parallel.schedule: DeepSpeed's pipeline engine runs 1F1B, not GPipe "
                   "(same bubble, fewer activations in flight than predicted)")
    if p.cp > 1:
        out.append(f"parallel.cp: DeepSpeed has no context parallelism of its own; cp={p.cp} must come "
                   "from the launching framework (DeepSpeed-Ulysses is a different algorithm)")
    if job.precision is Precision.FP8:
        out.append("precision: DeepSpeed has no FP8 switch; bf16 is enabled here and FP8 GEMMs must come "
                   "from Transformer Engine in the launching framework")
    if p.zero_stage > 0 and _overlap_comm(job) != (p.pp == 1 and p.overlaps_grad_reduce):
        out.append(f"parallel.overlap_grad_reduce: overlap_comm is true (DeepSpeed's default for ZeRO-3), but "
                   f"the prediction (framework: {p.framework.value}) did not overlap the ZeRO-3 gathers and "
                   "reduce-scatters with computation; re-predict with overlap_grad_reduce: true for this "
                   "config's numbers, or set overlap_grad_reduce: false to export overlap_comm false")
    elif p.zero_stage > 0 and _overlap_comm(job) != (p.zero_stage == 3):
        default = "true" if p.zero_stage == 3 else "false"
        out.append(f"parallel.overlap_grad_reduce: overlap_comm is {str(_overlap_comm(job)).lower()} as the "
                   f"prediction assumed; DeepSpeed's own default for ZeRO-{p.zero_stage} is {default}")
    out += _moe_notes(job)
    if p.pp > 1 and p.overlaps_grad_reduce:
        out.append("parallel.framework: the prediction overlapped gradient reduction with the last backward "
                   "(framework=megatron); DeepSpeed's pipeline engine reduces after the pipeline drains; "
                   "re-predict with framework: deepspeed")
    if not any(n.startswith("parallel.framework:") for n in out):
        out += framework_notes(job, Framework.DEEPSPEED)
    return out


def deepspeed_config(job: Job, prediction: Prediction | None = None) -> dict[str, Any]:
    """The config as a mapping (what ``render_deepspeed`` writes as JSON)."""
    p = job.parallel
    moe_args = megatron_deepspeed_moe_args(job)
    if p.pp > 1 and p.zero_stage > 1:
        raise ConfigError(
            f"parallel.zero_stage: DeepSpeed's pipeline engine supports ZeRO stage 0 or 1, "
            f"not {p.zero_stage}, with pp={p.pp}"
        )
    zero: dict[str, Any] = {"stage": p.zero_stage}
    if p.zero_stage > 0 and _overlap_comm(job) != (p.zero_stage == 3):  # DeepSpeedZeroConfig's default
        zero["overlap_comm"] = _overlap_comm(job)
    for key, device in (("offload_optimizer", p.offload_optimizer), ("offload_param", p.offload_param)):
        if device != "none":  # ZeRO-Offload / ZeRO-Infinity
            zero[key] = {"device": device, "pin_memory": True}
            if device == "nvme":
                zero[key]["nvme_path"] = NVME_PATH
    if p.cpu_offloading:
        raise ConfigError("parallel.cpu_offloading: DeepSpeed has no activation offload of this kind "
                          "(its cpu_checkpointing moves only checkpointed layer inputs)")
    config: dict[str, Any] = {
        "train_batch_size": p.global_batch_size,
        "train_micro_batch_size_per_gpu": p.micro_batch_size,
        "gradient_accumulation_steps": p.num_microbatches,
        "zero_optimization": zero,
    }
    # DeepSpeed's defaults are left out: fp16 and bf16 off (fp16 with dynamic loss scaling: loss_scale 0,
    # initial_scale_power 16, loss_scale_window 1000, hysteresis 2, min_loss_scale 1), overlap_comm on
    # for ZeRO-3 only, activation checkpoints neither partitioned, contiguous nor on the CPU,
    # wall_clock_breakdown off, gradient_clipping 1.0 (DeepSpeedFP16Config, DeepSpeedBF16Config, DeepSpeedZeroConfig,
    # ACT_CHKPT_DEFAULT, WALL_CLOCK_BREAKDOWN_DEFAULT, GRADIENT_CLIPPING_DEFAULT in DeepSpeed 0.19.8)
    if job.precision is Precision.FP16:
        config["fp16"] = {"enabled": True}
    elif job.precision in (Precision.BF16, Precision.FP8):
        config["bf16"] = {"enabled": True}
    if p.recompute is not Recompute.NONE and p.sequence_parallel and p.tp > 1:
        config["activation_checkpointing"] = {"partition_activations": True}
    if p.pp > 1 and p.tp > 1 and p.sequence_parallel:
        # each tensor-parallel rank's stage output is its own sequence shard, which the pipeline
        # engine must not partition (its default; Megatron-DeepSpeed's scripts turn it off with
        # --sequence-parallel): the buffers ``prediction.framework_memory.deepspeed_pipeline_buffers`` counts
        config["pipeline"] = {"pipe_partitioned": False, "grad_partitioned": False}
    config["steps_per_print"] = 10
    config["_paraplan"] = {
        "comment": [*header_lines(job, prediction, f"DeepSpeed config for DeepSpeed {DEEPSPEED_VERSION}",
                                  Framework.DEEPSPEED),
                    "DeepSpeed ignores this block (DeepSpeedConfig reads only its own keys); for GPT-NeoX "
                    "copy the other keys into your NeoX YAML and drop this one.",
                    "steps_per_print is paraplan's choice, not part of the plan; DeepSpeed's defaults (gradient "
                    "clipping at 1.0 included) are not repeated."],
        "launcher": _launcher(job, moe_args),
        "notes": notes(job, prediction),
    }
    return config


def render_deepspeed(job: Job, prediction: Prediction | None = None) -> str:
    """``ds_config.json`` text."""
    check_prediction(job, prediction)
    refuse_zero_bubble(job, "DeepSpeed's pipeline engine")
    return json.dumps(deepspeed_config(job, prediction), indent=2) + "\n"


def _overlap_comm(job: Job) -> bool:
    """ZeRO's ``overlap_comm`` (``ParallelPlan.deepspeed_overlap_comm``)."""
    return job.parallel.deepspeed_overlap_comm


def megatron_deepspeed_moe_args(job: Job) -> list[str]:
    """Megatron-DeepSpeed's mixture-of-experts arguments (``megatron/arguments.py``) as argv tokens;
    none for a dense model. What it cannot express is refused, naming the field."""
    m, p = job.model, job.parallel
    if not m.is_moe:
        return []
    if m.moe_shared_expert_intermediate_size:
        raise ConfigError("model.moe_shared_expert_intermediate_size: Megatron-DeepSpeed has no shared experts "
                          "(its --mlp-type residual is PR-MoE's residual MLP, a different model)")
    if m.multi_latent_attention:
        raise ConfigError("model.multi_latent_attention: Megatron-DeepSpeed has no multi-head latent attention")
    if m.moe_router_score_function != "softmax":
        raise ConfigError(f"model.moe_router_score_function: DeepSpeed's top-k gate scores with softmax only, "
                          f"not {m.moe_router_score_function}")
    if p.etp > 1:
        raise ConfigError(f"parallel.etp: the DeepSpeed export keeps each expert whole on a rank "
                          f"(expert_tensor_parallel_size 1); etp={p.etp}: re-predict with etp: 1")
    if p.dp % p.ep:
        raise ConfigError(f"parallel.ep: DeepSpeed carves expert-parallel groups out of the data-parallel ranks "
                          f"(deepspeed/utils/groups.py: dp % ep == 0); ep={p.ep} does not divide dp={p.dp}")
    interval = _expert_interval(job)
    if interval is None:
        field = "moe_first_k_dense" if m.moe_first_k_dense else "moe_layer_freq"
        raise ConfigError(f"model.{field}: Megatron-DeepSpeed puts experts in every --expert-interval-th layer "
                          "only (layers n, 2n, ... counted from 1); this model's MoE layers are not such a pattern")
    args = ["--num-experts", str(m.num_moe_experts), "--moe-expert-parallel-size", str(p.ep),
            "--topk", str(m.moe_router_topk), "--mlp-type", "standard", "--expert-interval", str(interval[0])]
    if m.moe_expert_capacity_factor is None:
        args.append("--disable-moe-token-dropping")  # dropless, as predicted
    else:
        args += ["--moe-train-capacity-factor", f"{m.moe_expert_capacity_factor:g}"]
    args += ["--moe-loss-coeff", f"{m.moe_aux_loss_coeff:g}"]
    return args


def _expert_interval(job: Job) -> tuple[int, bool] | None:
    """Megatron-DeepSpeed's ``--expert-interval`` n for the model's MoE layers (it makes layer i, from 0,
    a MoE layer when (i + 1) % n == 0: ``get_num_experts_per_layer`` in megatron/model/transformer.py),
    and whether it shifts them: Megatron-LM's every-N-th pattern (layers 0, N, 2N, ...) becomes
    layers N-1, 2N-1, ..., the same number when N divides the layers. None: not expressible."""
    m = job.model
    pattern = m.moe_layers
    for n in range(1, m.num_layers + 1):
        if pattern == tuple((i + 1) % n == 0 for i in range(m.num_layers)):
            return n, False
    freq = m.moe_layer_freq
    if isinstance(freq, int) and not m.moe_first_k_dense and m.num_layers % freq == 0:
        return freq, True
    return None


def _moe_notes(job: Job) -> list[str]:
    m, p = job.model, job.parallel
    if not m.is_moe:
        return []
    out = [f"model.num_moe_experts: the mixture of experts is set up by Megatron-DeepSpeed's arguments in "
           f"_paraplan.launcher.megatron_deepspeed_moe_args (experts split over ep={p.ep} data-parallel ranks)"]
    interval = _expert_interval(job)
    if interval is not None and interval[1]:
        n = interval[0]
        out.append(f"model.moe_layer_freq: Megatron-DeepSpeed puts the experts in layers {n}, {2 * n}, ... "
                   f"(from 1), Megatron-LM in layers 1, {n + 1}, ...: as many MoE layers, shifted by {n - 1}")
    if m.moe_grouped_gemm:
        out.append("model.moe_grouped_gemm: DeepSpeed's MoE layer runs a rank's experts one after another, "
                   "not as one grouped GEMM as predicted")
    if p.overlap_moe_expert_parallel_comm:
        out.append("parallel.overlap_moe_expert_parallel_comm: DeepSpeed does not overlap the expert all-to-alls "
                   "with another micro-batch's computation; the prediction hid them")
    return out


def _launcher(job: Job, moe_args: list[str]) -> dict[str, Any]:
    """The plan's settings that the launching framework, not DeepSpeed's JSON, applies."""
    p = job.parallel
    iterations = train_iterations(job)
    return {
        "how": "Megatron-DeepSpeed: --tensor-model-parallel-size / --pipeline-model-parallel-size / "
               "--sequence-parallel / --recompute-granularity; GPT-NeoX: model_parallel_size / "
               "pipe_parallel_size / checkpoint_activations",
        "tensor_model_parallel_size": p.tp,
        "pipeline_model_parallel_size": p.pp,
        "data_parallel_size": p.dp,
        "context_parallel_size": p.cp,
        "virtual_pipeline_model_parallel_size": p.vpp if p.vpp > 1 else None,
        "sequence_parallel": p.sequence_parallel,
        "layers_per_stage": list(layer_split(job)),
        "recompute": p.recompute.value,
        "schedule": p.schedule.value,
        "num_microbatches": p.num_microbatches,
        "framework_predicted": p.framework.value,
        "precision": job.precision.value,
        "seq_length": job.model.seq_length,
        "train_iters": iterations,
    } | ({"expert_model_parallel_size": p.ep, "megatron_deepspeed_moe_args": moe_args} if moe_args else {})
