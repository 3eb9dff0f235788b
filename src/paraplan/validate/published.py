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

from paraplan.catalog import resolve_job
from paraplan.specs import ConfigError
from paraplan.validate.measured import MeasuredRun
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
    tokens = run["parallel"]["global_batch_size"] * run["model"]["seq_length"]
    per_gpu = measured.get("tokens_per_s_per_gpu")
    if per_gpu:
        return tokens / (float(per_gpu) * run["num_gpus"])
    if measured.get("tokens_per_s"):
        return tokens / float(measured["tokens_per_s"])
    for key in ("samples_per_s", "sequences_per_s"):
        if measured.get(key):
            return run["parallel"]["global_batch_size"] / float(measured[key])
    raise ConfigError(
        f"{run['id']}: measured: no iteration_time_s, tokens_per_s(_per_gpu) or samples_per_s to compare with"
    )


def source_of(run: dict[str, Any]) -> str:
    """A short name of the run's source: the id's first word (mlperf, torchtitan, ibm...)."""
    return str(run["id"]).split("-")[0]


def measured_from_published(run: dict[str, Any]) -> MeasuredRun:
    """A published record as a measured run: its configuration as a job on the catalog's
    reference node of its GPU, its iteration time measured (or derived from its throughput).
    A record paraplan cannot read raises ConfigError (or KeyError/TypeError/ValueError for a
    malformed one), naming why."""
    mapped = job_from_record(run)
    job = resolve_job(mapped.mapping)
    return MeasuredRun(
        id=run["id"],
        kind="published",
        source=source_of(run),
        job=job,
        measured_iteration_s=measured_iteration_s(run),
        gpu=mapped.gpu,
        assumed=mapped.assumed,
    )
