"""Validate predictions against published measured runs (``../shared/data/published``).

``runs_dev.json`` holds Megatron-LM runs on Selene (Narayanan et al. SC'21 table 1,
Korthikanti et al. 2022 table 5); ``runs_dev_modern.json`` MLPerf v3.0 GPT-3 on H100 (FP8),
torchtitan FSDP2 on A100 and IBM's fms-fsdp on A100/H100. Each record's configuration becomes
a job (``validate.records``) on the catalog's reference node of its GPU, with the network the
record states; the measured (or derived from printed throughput) iteration time is the
reference. Nothing is fitted to these runs.
"""

from __future__ import annotations

from typing import Any

from paraplan.backends import ModelSet, make_cost_model
from paraplan.catalog import resolve_job
from paraplan.prediction import predict
from paraplan.validate.gpumodeling import RunValidation
from paraplan.validate.records import job_from_record


def is_published_record(run: dict[str, Any]) -> bool:
    return "num_gpus" in run and "measured" in run and "components_best_iteration_us" not in run["measured"]


def job_mapping_from_published(run: dict[str, Any]) -> dict[str, Any]:
    return job_from_record(run).mapping


def measured_iteration_s(run: dict[str, Any]) -> float:
    """The measured iteration time, or the one the source's throughput implies:
    global batch x sequence / (tokens/s per GPU x GPUs)."""
    measured, derived = run["measured"], run.get("derived") or {}
    if measured.get("iteration_time_s") is not None:
        return float(measured["iteration_time_s"])
    if derived.get("iteration_time_s") is not None:
        return float(derived["iteration_time_s"])
    per_gpu = measured.get("tokens_per_s_per_gpu")
    if per_gpu:
        tokens = run["parallel"]["global_batch_size"] * run["model"]["seq_length"]
        return tokens / (float(per_gpu) * run["num_gpus"])
    raise ValueError(f"{run['id']}: no iteration time or tokens/s per GPU in 'measured'")


def source_of(run: dict[str, Any]) -> str:
    """A short name of the run's source: the id's first word (mlperf, torchtitan, ibm...)."""
    return str(run["id"]).split("-")[0]


def validate_published(
    runs: list[dict[str, Any]], backend: str = "analytical", models: ModelSet | None = None
) -> list[RunValidation]:
    results = []
    for run in runs:
        mapped = job_from_record(run)
        job = resolve_job(mapped.mapping)
        pred = predict(job, make_cost_model(job, backend, models))
        results.append(
            RunValidation(
                run_id=run["id"],
                measured_iteration_s=measured_iteration_s(run),
                prediction=pred,
                components=(),
                their_error=None,
                source=source_of(run),
                gpu=mapped.gpu,
                assumed=mapped.assumed,
            )
        )
    return results
