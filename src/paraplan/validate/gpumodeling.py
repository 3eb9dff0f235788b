"""Validate predictions against the measured GPUModeling25 Perlmutter runs.

``runs_perlmutter.json`` (see ../shared/data/gpumodeling/README.md) holds five real
3D-parallel GPT-NeoX/DeepSpeed runs with their configuration, the measured iteration time and
per-component times of the fastest iteration on the first, a middle and the last pipeline
stage. This module reads each record as a ``MeasuredRun`` (its *configuration* as the job) and
compares the components paraplan predicts with those measured (``runs.validate_runs`` predicts).
Nothing here feeds back into any estimate: measured runs are for validation only.
"""

from __future__ import annotations

from typing import Any

from paraplan.catalog import resolve_job
from paraplan.prediction import Prediction, StageTiming
from paraplan.validate.measured import MeasuredComponent, MeasuredRun
from paraplan.validate.result import ComponentError

# The clusters as the GPUModeling authors measured them (links fitted to their NCCL samples).
_CLUSTERS = {"perlmutter": "perlmutter-gpumodeling", "vista": "vista-gpumodeling"}


def job_mapping_from_run(run: dict[str, Any]) -> dict[str, Any]:
    """The job a run record describes, as a job-file mapping (its configuration only)."""
    m, p = run["model"], run["parallel"]
    flash = "flash" in m.get("attention_impl", "")
    model = {
        "name": run["id"],
        "num_layers": m["num_layers"],
        "hidden_size": m["hidden_size"],
        "num_attention_heads": m["num_attention_heads"],
        "ffn_hidden_size": m["ffn_hidden_size"],
        "seq_length": m["seq_length"],
        "vocab_size": m["vocab_size"],
        "padded_vocab_size": m["padded_vocab_size"],
        "activation": m["activation"],
        "normalization": m["norm"],
        "position_embedding": m["position_embedding"],
        "rotary_percent": m.get("rotary_pct", 1.0),
        "attention": "flash" if flash else "unfused",
        "parallel_residual": bool(m.get("gpt_j_residual", False)),
        "untie_embeddings_and_output_weights": not m.get("tied_embeddings", True),
        "add_bias_linear": bool(m.get("bias_in_attn_linear", True)),
        "add_bias_mlp": "use_bias_in_mlp=True" in m.get("mlp", "use_bias_in_mlp=True"),
        # GPT-NeoX's defaults, as the runs' logged arguments show ("bias_dropout_fusion ...
        # False ... default"); the 20B config turns bias_gelu_fusion on, the llama ones do not
        "bias_dropout_fusion": False,
        "bias_gelu_fusion": m["name"].startswith("GPT-NeoX"),
        # GPT-NeoX's apply_rotary_pos_emb: slices, a negation, a concatenation, multiplies (the
        # form GPUModeling25's RoPE sampler copied and the RoPE curves time), not a fused kernel
        "rope_fusion": False,
    }
    recompute = "full" if p.get("activation_checkpointing", {}).get("enabled") else "none"
    return {
        "name": run["id"],
        "model": model,
        "cluster": {"name": _CLUSTERS.get(run["cluster"], run["cluster"]), "num_nodes": run["nodes"]},
        "parallel": {
            "tp": p["tp"],
            "pp": p["pp"],
            "dp": p["dp"],
            "zero_stage": p["zero_stage"],
            "micro_batch_size": p["micro_batch_size"],
            "global_batch_size": p["global_batch_size"],
            "recompute": recompute,
            "partition_activations": recompute == "full"
            and bool(p.get("activation_checkpointing", {}).get("partition_activations")),
            "schedule": "1f1b",
            "framework": "deepspeed",
            "layers_per_stage": m["transformer_layers_per_pipeline_stage"],
        },
        "precision": m.get("precision", "fp16"),
    }


def _stage_components(t: StageTiming, per_layer: dict[str, float]) -> dict[str, float]:
    return {
        "encoder_fwd": per_layer["fwd"],
        "encoder_bwd": per_layer["bwd"],
        "stage_fwd": t.fwd_pass_mb_s,
        "stage_bwd": t.bwd_pass_mb_s,
        "dp_allreduce": t.grad_reduce_s,
        "dp_allgather": t.param_gather_s,
        "optimizer_step": t.optimizer_s + t.param_gather_s,
    }


#: The per-stage components, in the order tables show them (``_stage_components``'s keys).
STAGE_COMPONENTS = (
    "encoder_fwd", "encoder_bwd", "stage_fwd", "stage_bwd", "dp_allreduce", "dp_allgather", "optimizer_step",
)
_STAGES = ("first", "middle", "last")


def measured_from_gpumodeling(run: dict[str, Any]) -> MeasuredRun:
    """A GPUModeling25 record as a measured run: the fastest iteration (the reference), the
    components of its first, middle and last stage, one TP all-reduce and one forward p2p send."""
    measured = run["measured"]["components_best_iteration_us"]
    components = [
        MeasuredComponent(name, where, index, measured[name][index] * 1e-6)
        for index, where in enumerate(_STAGES)
        for name in STAGE_COMPONENTS
        if measured.get(name) is not None and measured[name][index] > 0
    ]
    if measured.get("mp_allreduce"):
        components.append(MeasuredComponent("mp_allreduce", "-", None, sorted(measured["mp_allreduce"])[1] * 1e-6))
    sent = [v for v in measured.get("pp_p2p") or () if v > 0]
    if sent:
        # one forward send (DeepSpeed's _exec_send_activations: the activation and the mask)
        components.append(MeasuredComponent("pp_p2p", "-", None, min(sent) * 1e-6))
    their = run.get("their_prediction", {}).get("derived_error_vs_statistics_pct", {}).get("vs_min")
    job = resolve_job(job_mapping_from_run(run))
    return MeasuredRun(
        id=run["id"],
        kind="gpumodeling25",
        source="gpumodeling25",
        job=job,
        measured_iteration_s=run["measured"]["iteration_time_s"]["min"],
        components=tuple(components),
        gpu=job.cluster.gpu.name,
        their_error=None if their is None else their / 100.0,
    )


def compare_gpumodeling(run: MeasuredRun, pred: Prediction) -> tuple[ComponentError, ...]:
    """Each measured component beside paraplan's value of the same part."""
    stages = pred.stages
    picks = (stages[0], stages[1] if len(stages) > 2 else stages[0], stages[-1])
    # One layer forward (with its TP all-reduces) and backward (with recompute), as traced.
    layer_f = sum(o.fwd_s for o in pred.layer_ops)
    layer_b = sum(o.bwd_s + o.recompute_s for o in pred.layer_ops)
    layer_tp_f = sum(c.seconds for c in pred.layer_collectives if c.phase == "fwd")
    layer_tp_b = sum(c.seconds for c in pred.layer_collectives if c.phase != "fwd")
    recompute_tp = layer_tp_f if pred.job.parallel.recompute.value == "full" else 0.0
    per_layer = {"fwd": layer_f + layer_tp_f, "bwd": layer_b + layer_tp_b + recompute_tp}
    tp_calls = [c for c in pred.layer_collectives if c.name == "tp_allreduce"]
    out: list[ComponentError] = []
    for c in run.components:
        if c.stage_index is not None:
            predicted = _stage_components(picks[c.stage_index], per_layer)[c.name]
        elif c.name == "mp_allreduce" and tp_calls:
            predicted = tp_calls[0].seconds / tp_calls[0].count
        elif c.name == "pp_p2p" and stages[0].p2p_s > 0:
            predicted = stages[0].p2p_fwd_s
        else:
            continue
        out.append(ComponentError(c.name, c.stage, c.seconds, predicted))
    return tuple(out)
