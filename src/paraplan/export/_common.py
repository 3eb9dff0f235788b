"""What every launch recipe shares: the plan in one line, the prediction in a few, notes, numbers."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from paraplan.inventory.partition import count_layers_per_stage
from paraplan.specs import ConfigError, Framework, Job, Precision
from paraplan.units import format_bytes, format_tokens

if TYPE_CHECKING:
    from paraplan.prediction import Prediction

NOTE = "NOTE(paraplan):"  # a plan feature the target expresses differently, or not at all
EDIT = "EDIT:"  # a value the plan does not know (data, tokenizer, learning rate...); the user sets it
PLACEHOLDER = "EDIT-ME"  # a value left for the user; every target rejects it until it is replaced


# paraplan's ``parallel.framework`` values: the runtime whose behaviour (gradient sync, buffers,
# schedule) the prediction follows, and the runtime each export target is
FRAMEWORK_NAMES = {Framework.MEGATRON: "Megatron-LM", Framework.DEEPSPEED: "DeepSpeed",
                   Framework.FSDP: "PyTorch FSDP2 (torchtitan)"}


def framework_line(job: Job, runs_on: Framework) -> str:
    """Which framework the prediction (and the plan's numbers in this recipe) was made for, and,
    when the recipe launches another one, that its numbers do not carry over as they are."""
    from paraplan._version import __version__

    made_for = job.parallel.framework
    line = f"predicted for {made_for.value} ({FRAMEWORK_NAMES[made_for]}), paraplan {__version__}"
    preset = getattr(job, "preset", None)
    if preset is not None:  # the framework preset the plan's unstated fields came from: they are in the recipe
        line = f"predicted for {preset.preset} ({preset.label}) on {made_for.value} ({FRAMEWORK_NAMES[made_for]}), " \
               f"paraplan {__version__}"
        if preset.taken:
            line += "; the preset's defaults taken: " + ", ".join(
                f"{k} {str(v).lower() if isinstance(v, bool) else v}" for k, v in preset.taken.items())
    if made_for is not runs_on:
        line += (f"; this recipe runs it on {FRAMEWORK_NAMES[runs_on]}, whose behaviour the prediction did not "
                 f"follow: re-predict with framework: {runs_on.value} for its numbers")
    return line


def framework_notes(job: Job, runs_on: Framework) -> list[str]:
    """A ``parallel.framework`` note when the recipe launches another framework than the one the
    prediction followed (targets with notes of their own on it add theirs instead)."""
    made_for = job.parallel.framework
    if made_for is runs_on:
        return []
    return [f"parallel.framework: the prediction followed {FRAMEWORK_NAMES[made_for]} (framework: {made_for.value}); "
            f"this recipe runs on {FRAMEWORK_NAMES[runs_on]}: re-predict with framework: {runs_on.value} for its "
            "gradient synchronisation, buffers and schedule"]


def check_prediction(job: Job, prediction: Prediction | None) -> None:
    """A recipe's numbers must describe the job it launches."""
    if prediction is not None and prediction.job != job:
        raise ValueError("export: the prediction was made for a different job than the one exported")


def refuse_zero_bubble(job: Job, framework: str) -> None:
    """A framework without zero-bubble schedules gets no recipe for one."""
    schedule = job.parallel.schedule
    if schedule.splits_backward:
        raise ConfigError(
            f"parallel.schedule: {framework} has no {schedule.value!r} schedule; export to torchtitan, "
            "or re-predict with schedule 1f1b"
        )


def plan_summary(job: Job) -> str:
    """The resolved plan in one line, in paraplan's vocabulary."""
    p = job.parallel
    parts = [
        f"tp={p.tp}", f"pp={p.pp}", f"dp={p.dp}", f"cp={p.cp}", f"vpp={p.vpp}",
        f"sequence_parallel={'on' if p.sequence_parallel else 'off'}", f"zero_stage={p.zero_stage}",
        f"micro_batch_size={p.micro_batch_size}", f"global_batch_size={p.global_batch_size}",
        f"({micro_batches(job)})", f"recompute={p.recompute.value}",
        f"schedule={p.schedule.value}", f"framework={p.framework.value}",
        f"precision={job.precision.value}",
    ]
    if p.layers_per_stage is not None:
        parts.insert(5, f"layers_per_stage={list(p.layers_per_stage)}")
    return " ".join(parts)


def header_lines(job: Job, prediction: Prediction | None, what: str, runs_on: Framework) -> list[str]:
    """The comment lines that open a recipe: what it is, the framework the prediction was made for,
    the job, the plan, the prediction."""
    from paraplan._version import __version__

    c = job.cluster
    place = prediction.placement if prediction is not None else None
    gpus = c.gpu.name if place is None else prediction.gpu_name
    name = c.name if place is None else place.cluster
    lines = [
        f"{what}, exported by paraplan {__version__}",
        framework_line(job, runs_on),
        f"job {job.name!r}: model {job.model.name} on {c.num_nodes} node(s) x {c.gpus_per_node} GPUs "
        f"({gpus}; {c.num_gpus} GPUs, cluster {name})",
        f"plan: {plan_summary(job)}",
    ]
    if prediction is not None:
        mem = prediction.worst_memory
        lines.append(
            f"predicted ({prediction.backend} backend): {prediction.iteration_s:.3g} s per iteration, "
            f"{prediction.tokens_per_s:,.0f} tokens/s, MFU {prediction.mfu:.1%}, "
            f"{format_bytes(mem.total)} of {format_bytes(prediction.hbm_bytes[mem.stage])} per GPU "
            f"({'fits' if prediction.fits else 'does NOT fit'} with {prediction.memory.headroom:.0%} headroom)"
        )
        if prediction.time_to_train_s is not None:
            lines.append(
                f"predicted time to train {format_tokens(job.train_tokens)} tokens: "
                f"{format_duration(prediction.time_to_train_s)}"
            )
    return lines


def common_notes(job: Job, prediction: Prediction | None) -> list[str]:
    """Notes that hold whatever the target: a plan that does not fit is still exported."""
    notes = []
    if prediction is not None and not prediction.fits:
        mem = prediction.worst_memory
        notes.append(
            f"the plan does not fit: the worst stage needs {format_bytes(mem.total)} per GPU, "
            f"the {prediction.gpu_name} has {format_bytes(prediction.hbm_bytes[mem.stage])} "
            f"({format_bytes(-prediction.memory.margin)} short after the {prediction.memory.headroom:.0%} headroom); "
            "expect out-of-memory"
        )
    if prediction is not None and prediction.placement is not None:
        notes.append(placement_note(prediction))
    if job.precision is Precision.TF32:
        notes.append(tf32_note())
    p = job.parallel
    if job.model.is_moe:
        balance = " (perfect balance)" if p.expert_load_imbalance == 1.0 else ""
        notes.append(f"parallel.expert_load_imbalance: not a launch setting; the prediction assumed the busiest "
                     f"expert-parallel rank gets {p.expert_load_imbalance:g}x the mean routed tokens{balance}")
    return notes


def fused_rmsnorm_note(job: Job, target: str) -> list[str]:
    """``rmsnorm_fusion: false`` (Hugging Face's eager RMSNorm, its float32 copy of the input) is
    no setting of a target that runs RMSNorm as one fused kernel (Megatron-LM's Transformer
    Engine, torchtitan's ``F.rms_norm``): say that its run keeps and moves less."""
    if job.model.normalization != "rmsnorm" or job.model.rmsnorm_fusion:
        return []
    return [f"model.rmsnorm_fusion: the prediction ran Hugging Face's eager RMSNorm (a float32 copy of each "
            f"norm's input kept for the backward pass); {target} runs RMSNorm as one fused kernel: less memory "
            "and time than predicted; re-predict with rmsnorm_fusion: true for its numbers"]


def projections_note(job: Job, target: str, *, qkv: bool, gate_up: bool) -> list[str]:
    """Where the job's projections (``qkv_fusion``, ``gate_up_fusion``) are not what ``target``'s
    model code runs (``qkv``, ``gate_up``: whether it fuses them), say which way the run differs."""
    m = job.model
    parts = []
    if not m.multi_latent_attention and m.qkv_fusion != qkv:
        parts.append(f"q, k and v as {'one GEMM' if qkv else 'three GEMMs'} (the prediction ran "
                     f"{'one' if m.qkv_fusion else 'three'}; model.qkv_fusion)")
    if m.activation == "swiglu" and m.gate_up_fusion != gate_up:
        parts.append(f"the MLP's gate and up projections as {'one GEMM' if gate_up else 'two GEMMs'} (the "
                     f"prediction ran {'one' if m.gate_up_fusion else 'two'}; model.gate_up_fusion)")
    if not parts:
        return []
    return [f"{target} runs " + " and ".join(parts) + "; separate GEMMs are thinner and each reads the layer "
            "input: re-predict with its values for its numbers"]


def tf32_note() -> str:
    """No framework has a TF32 switch: the recipe trains in fp32, and the matmuls reach the
    TF32 peak the prediction used only where PyTorch lets cuBLAS use TF32."""
    return ("precision: tf32 is no launch setting (Megatron-LM, DeepSpeed and torchtitan have none); the recipe "
            "trains in fp32 and "
            "its matmuls run on TF32 tensor cores only with torch.backends.cuda.matmul.allow_tf32 = True "
            "(or torch.set_float32_matmul_precision('high')) in the training script; PyTorch's default "
            "since 1.12 is False, at the fp32 peak (predict with precision: fp32 for that)")


def placement_note(prediction: Prediction) -> str:
    """Node groups of different GPUs: every node runs the same arguments; the order of the
    nodes (node rank 0 first) decides which GPUs each pipeline stage gets."""
    place = prediction.placement
    runs: list[list] = []
    for gpu in place.node_order:
        if runs and runs[-1][0] == gpu:
            runs[-1][1] += 1
        else:
            runs.append([gpu, 1])
    order = ", ".join(f"{n} x {gpu}" for gpu, n in runs)
    return (f"node_order: the nodes must be ranked in this order (node rank 0 first; the hostfile / SLURM "
            f"nodelist order): {order} nodes; pipeline stages then run on {', '.join(place.stage_gpus)}")


def layer_split(job: Job) -> tuple[int, ...]:
    """Transformer layers per pipeline stage, as paraplan predicted them."""
    return count_layers_per_stage(job.model, job.parallel)


def layers_per_virtual_stage(job: Job) -> int:
    """Layers in one model chunk of the interleaved schedule (num_layers / (pp * vpp))."""
    p = job.parallel
    return job.model.num_layers // (p.pp * p.vpp)


def train_iterations(job: Job) -> int | None:
    """Iterations (global batches) to consume ``train_tokens``, rounded up; None without them."""
    if job.train_tokens is None:
        return None
    return math.ceil(job.train_tokens / job.tokens_per_iteration)


def micro_batches(job: Job) -> str:
    """``16 micro-batches`` (or ``1 micro-batch``) per iteration."""
    n = job.parallel.num_microbatches
    return f"{n} micro-batch{'' if n == 1 else 'es'}"


def format_duration(seconds: float) -> str:
    """``1d 02:03:04`` style, for comments."""
    total = round(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}d {clock}" if days else clock


def comment(lines: list[str], prefix: str = "# ") -> str:
    """Lines as comments; long notes stay on one line each so that a grep finds them whole."""
    return "\n".join(f"{prefix}{line}".rstrip() for line in lines)
