"""Validate predictions against published Megatron-LM runs (``../shared/data/published``).

``runs_dev.json`` holds runs from Narayanan et al. SC'21 (table 1) and Korthikanti et al.
2022 (table 5) on Selene (DGX A100 nodes, NVSwitch, 8x HDR InfiniBand). Each record's
configuration becomes a job on the catalog's ``dgx-a100`` cluster (datasheet links); the
measured (or, for Narayanan et al., derived from the printed TFLOP/s) iteration time is the
reference. Nothing is fitted to these runs.
"""

from __future__ import annotations

from typing import Any

from paraplan.backends import ModelSet, make_cost_model
from paraplan.catalog import resolve_job
from paraplan.prediction import predict
from paraplan.validate.gpumodeling import RunValidation

# Megatron-LM GPT defaults of the time: learned positions, LayerNorm, GELU, tied embeddings,
# biases, fused (unfused-attention) softmax and dropout 0.1 on attention and hidden states.
_MEGATRON_GPT = {
    "position_embedding": "learned",
    "normalization": "layernorm",
    "attention": "unfused",
    "attention_dropout": 0.1,
    "hidden_dropout": 0.1,
    "untie_embeddings_and_output_weights": False,
    "add_bias_linear": True,
}


def is_published_record(run: dict[str, Any]) -> bool:
    return "num_gpus" in run and "measured" in run and "components_best_iteration_us" not in run["measured"]


def job_mapping_from_published(run: dict[str, Any]) -> dict[str, Any]:
    m, p = run["model"], run["parallel"]
    vpp = p.get("virtual_pipeline") or 1
    return {
        "name": run["id"],
        "model": {
            "name": run["id"],
            "num_layers": m["num_layers"],
            "hidden_size": m["hidden_size"],
            "num_attention_heads": m["num_attention_heads"],
            "num_query_groups": m.get("num_kv_heads") or m["num_attention_heads"],
            "ffn_hidden_size": m["ffn_hidden_size"],
            "seq_length": m["seq_length"],
            "vocab_size": m["vocab_size"],
            "activation": m.get("activation", "gelu"),
            **_MEGATRON_GPT,
        },
        "cluster": {"name": "dgx-a100", "num_nodes": run["num_gpus"] // run["gpus_per_node"]},
        "parallel": {
            "tp": p["tp"],
            "pp": p["pp"],
            "dp": p["dp"],
            "cp": p.get("cp") or 1,
            "sequence_parallel": bool(p.get("sp")),
            "vpp": vpp if vpp > 1 else None,
            "zero_stage": p.get("zero_stage") or 0,
            "micro_batch_size": p["micro_batch_size"],
            "global_batch_size": p["global_batch_size"],
            "recompute": run["recompute"],
            "framework": "megatron",
            # Megatron-LM of 2021-22 sent 1/tp of the activation between stages and
            # all-gathered it (Narayanan et al. SC'21, section 4.1, scatter/gather).
            "scatter_gather_p2p": True,
        },
        "precision": "fp16" if run["precision"].startswith("fp16") else "bf16",
    }


def measured_iteration_s(run: dict[str, Any]) -> float:
    measured = run["measured"].get("iteration_time_s")
    return measured if measured is not None else run["derived"]["iteration_time_s"]


def validate_published(
    runs: list[dict[str, Any]], backend: str = "analytical", models: ModelSet | None = None
) -> list[RunValidation]:
    results = []
    for run in runs:
        job = resolve_job(job_mapping_from_published(run))
        pred = predict(job, make_cost_model(job, backend, models))
        results.append(
            RunValidation(
                run_id=run["id"],
                measured_iteration_s=measured_iteration_s(run),
                prediction=pred,
                components=(),
                their_error=None,
            )
        )
    return results
