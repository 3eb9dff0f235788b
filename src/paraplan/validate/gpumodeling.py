"""Validate predictions against the measured GPUModeling25 Perlmutter runs.

``runs_perlmutter.json`` (see ../shared/data/gpumodeling/README.md) holds five real
3D-parallel GPT-NeoX/DeepSpeed runs with their configuration, the measured iteration time and
per-component times of the fastest iteration on the first, a middle and the last pipeline
stage. This module turns each record's *configuration* into a job, predicts it, and compares.
Nothing here feeds back into any estimate: measured runs are for validation only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paraplan.catalog import resolve_job
from paraplan.catalog.userdata import load_json
from paraplan.prediction import Prediction, StageTiming, predict
from paraplan.prediction.backends import ModelSet, make_cost_model
from paraplan.specs import ConfigError
from paraplan.validate.result import ComponentError, RunValidation

# The clusters as the GPUModeling authors measured them (links fitted to their NCCL samples).
_CLUSTERS = {"perlmutter": "perlmutter-gpumodeling", "vista": "vista-gpumodeling"}


def load_runs(path: Path | str) -> list[dict[str, Any]]:
    path = Path(path)
    try:
        runs = load_json(path.read_text(encoding="utf-8"), str(path))
    except OSError as err:
        raise ConfigError(f"{path}: cannot read ({err.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (it is not UTF-8)") from None
    if not isinstance(runs, list) or not all(isinstance(r, dict) and "parallel" in r for r in runs):
        raise ConfigError(
            f"{path}: expected a list of run records as in runs_perlmutter.json or runs_dev.json"
        )
    return runs


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
        "stage_fwd": t.forward_mb_s + t.tp_fwd_mb_s,
        "stage_bwd": t.backward_mb_s + t.recompute_mb_s + t.tp_bwd_mb_s,
        "dp_allreduce": t.grad_reduce_s,
        "dp_allgather": t.param_gather_s,
        "optimizer_step": t.optimizer_s + t.param_gather_s,
    }


def _compare(run: dict[str, Any], pred: Prediction) -> tuple[ComponentError, ...]:
    measured = run["measured"]["components_best_iteration_us"]
    stages = pred.stages
    picks = {"first": stages[0], "middle": stages[1] if len(stages) > 2 else stages[0], "last": stages[-1]}
    # One layer forward (with its TP all-reduces) and backward (with recompute), as traced.
    layer_f = sum(o.fwd_s for o in pred.layer_ops)
    layer_b = sum(o.bwd_s + o.recompute_s for o in pred.layer_ops)
    layer_tp_f = sum(c.seconds for c in pred.layer_collectives if c.phase == "fwd")
    layer_tp_b = sum(c.seconds for c in pred.layer_collectives if c.phase != "fwd")
    recompute_tp = layer_tp_f if pred.job.parallel.recompute.value == "full" else 0.0
    per_layer = {"fwd": layer_f + layer_tp_f, "bwd": layer_b + layer_tp_b + recompute_tp}
    out: list[ComponentError] = []
    for index, (where, timing) in enumerate(picks.items()):
        predicted = _stage_components(timing, per_layer)
        for name, value in predicted.items():
            got = measured.get(name)
            if got is None or got[index] <= 0:
                continue
            out.append(ComponentError(name, where, got[index] * 1e-6, value))
    tp_calls = [c for c in pred.layer_collectives if c.name == "tp_allreduce"]
    if tp_calls and measured.get("mp_allreduce"):
        one_call = tp_calls[0].seconds / tp_calls[0].count
        out.append(ComponentError("mp_allreduce", "-", sorted(measured["mp_allreduce"])[1] * 1e-6, one_call))
    if pred.stages[0].p2p_s > 0 and measured.get("pp_p2p"):
        # one forward send (DeepSpeed's _exec_send_activations: the activation and the mask)
        sent = [v for v in measured["pp_p2p"] if v > 0]
        if sent:
            out.append(ComponentError("pp_p2p", "-", min(sent) * 1e-6, pred.stages[0].p2p_fwd_s))
    return tuple(out)


def validate_runs(
    runs: list[dict[str, Any]],
    backend: str = "analytical",
    models: ModelSet | None = None,
    skipped: list[tuple[str, str]] | None = None,
) -> list[RunValidation]:
    """Predict every run from its configuration and compare with what was measured.
    Accepts GPUModeling25 records (runs_perlmutter.json) and published records (runs_dev*.json);
    ``backend``/``models`` choose the cost model; published records paraplan cannot read are
    listed in ``skipped`` when it is given (see ``validate_published``)."""
    from paraplan.validate.published import is_published_record, validate_published

    traced = any("components_best_iteration_us" in r.get("measured", {}) for r in runs)
    if runs and not traced and any(is_published_record(r) for r in runs):
        return validate_published(runs, backend, models, skipped)
    results = []
    for run in runs:
        job = resolve_job(job_mapping_from_run(run))
        pred = predict(job, make_cost_model(job, backend, models))
        their = run.get("their_prediction", {}).get("derived_error_vs_statistics_pct", {}).get("vs_min")
        results.append(
            RunValidation(
                run_id=run["id"],
                measured_iteration_s=run["measured"]["iteration_time_s"]["min"],
                prediction=pred,
                components=_compare(run, pred),
                their_error=None if their is None else their / 100.0,
                gpu=job.cluster.gpu.name,
            )
        )
    return results
