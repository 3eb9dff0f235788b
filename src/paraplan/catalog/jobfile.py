"""Write a job back as a job file's mapping that reads like an example job: the hardware and
the model by their catalog names, with only the fields the job changed written out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paraplan.catalog.jobs import _cluster, _in_catalog, _model
from paraplan.catalog.loader import catalog_names, load_any_cluster, load_cluster, load_gpu, load_model
from paraplan.specs import (
    PLAN_ALIASES,
    ClusterSpec,
    ConfigError,
    GpuSpec,
    HeteroJob,
    Job,
    LinkSpec,
    ModelSpec,
    ParallelPlan,
)

_WRITTEN = {"name", "model", "cluster", "parallel", "precision", "train_tokens", "node_order", "preset"}
_CLUSTER_FIELDS = ("gpus_per_node", "intra_node", "inter_node", "host_link", "price_per_gpu_hour", "host")


def job_mapping(job: Job | HeteroJob) -> dict[str, Any]:
    """A job file's mapping that ``resolve_job`` turns back into ``job``: catalog names where
    the catalog entry is what the job uses, a catalog name with the changed fields where the
    job changed some (``{name: aws-p5.48xlarge, num_nodes: 4, inter_node: {...}}``), the full
    description otherwise (its GPU still by name when it is a catalog GPU)."""
    if isinstance(job, HeteroJob):
        c = job.cluster
        cluster: Any = c.name if _catalog_equal(c.name, c) else c.model_dump(mode="json")
    else:
        cluster = cluster_mapping(job.cluster)
    parallel = _parallel_mapping(job.parallel)
    if job.preset is not None:  # the preset by name; the fields it filled in are its again
        short = {long: min((k for k, v in PLAN_ALIASES.items() if v == long), key=len, default=long)
                 for long in job.preset.taken}
        parallel = {k: v for k, v in parallel.items() if k not in job.preset.taken and k not in short.values()}
        for key, (mine, _) in job.preset.overridden.items():  # stated, even at the plan's default
            if not any(PLAN_ALIASES.get(k, k) == key for k in parallel):
                parallel[key] = mine
        parallel["framework"] = job.preset.preset
    model = job.model
    if job.preset is not None and job.preset.model_taken:  # the preset's again, as the plan's fields
        model = model.model_copy(update={k: type(model).model_fields[k].default for k in job.preset.model_taken})
    out: dict[str, Any] = {"name": job.name, "model": model_mapping(model), "cluster": cluster,
                           "parallel": parallel, "precision": job.precision.value}
    if job.train_tokens is not None:
        out["train_tokens"] = int(job.train_tokens) if float(job.train_tokens).is_integer() else job.train_tokens
    for key, spec in type(job).model_fields.items():  # any other field the job sets (memory_headroom, ...)
        if key not in _WRITTEN and getattr(job, key) != spec.default:
            out[key] = _dumped(getattr(job, key))
    if isinstance(job, HeteroJob):
        names = [g.name for g in job.cluster.node_groups]
        unique = len(set(names)) == len(names)
        out["node_order"] = [names[g] if unique else g for g in job.node_order]
    return out


def cluster_mapping(c: ClusterSpec) -> str | dict[str, Any]:
    """One cluster as a job file writes it, checked to resolve back to ``c`` exactly."""
    for base in _catalog_bases("clusters", c.name):
        try:
            catalog = load_cluster(base)
            gpu = {} if c.gpu == catalog.gpu else {"gpu": c.gpu}
            entry = load_cluster(base, num_nodes=c.num_nodes, **gpu)
        except ConfigError:
            continue
        mapping: dict[str, Any] = {"name": base, "num_nodes": c.num_nodes}
        if gpu:
            mapping["gpu"] = gpu_mapping(c.gpu)
        for field in _CLUSTER_FIELDS:
            if getattr(c, field) != getattr(entry, field):
                mapping[field] = _dumped(getattr(c, field))
        if _resolves_to(_cluster, mapping, c):
            return mapping
    full = {**c.model_dump(mode="json", exclude_defaults=True), "gpu": gpu_mapping(c.gpu)}
    return full if _resolves_to(_cluster, full, c) else c.model_dump(mode="json")


def model_mapping(m: ModelSpec) -> str | dict[str, Any]:
    """One model as a job file writes it: its catalog name, with the fields the job changed."""
    for base in _catalog_bases("models", m.name):
        entry = load_model(base)
        if entry == m:
            return base
        changed = {k: v for k, v in m.model_dump(mode="json").items()
                   if k not in ("name", "aliases") and v != entry.model_dump(mode="json")[k]}
        mapping = {"name": base, **changed}
        if _resolves_to(lambda v: _model(v, Path(".")), mapping, m):
            return mapping
    full = m.model_dump(mode="json", exclude_defaults=True)
    return full if _resolves_to(lambda v: _model(v, Path(".")), full, m) else m.model_dump(mode="json")


def gpu_mapping(gpu: GpuSpec) -> str | dict[str, Any]:
    """A GPU by its catalog name when it is the catalog's, else described in full."""
    if _in_catalog("gpus", gpu.name) and load_gpu(gpu.name) == gpu:
        return gpu.name
    return gpu.model_dump(mode="json", exclude_defaults=True)


def _catalog_bases(kind: str, name: str) -> list[str]:
    """Catalog names ``name`` is or starts with ("aws-p5.48xlarge with a changed inter_node",
    "llama-3-8b (modified)"), longest first."""
    names = sorted(catalog_names(kind), key=len, reverse=True)  # type: ignore[arg-type]
    return [n for n in names if name == n or name.startswith(n + " ")]


def _resolves_to(resolve: Any, mapping: dict[str, Any], value: Any) -> bool:
    try:
        got = resolve(dict(mapping))
        return (got if not isinstance(got, dict) else type(value).model_validate(got)) == value
    except (ConfigError, ValueError):
        return False


def _dumped(value: Any) -> Any:
    """A field as a job file writes it: without its defaults, a link's bandwidth and latency in
    units ("10 Gb/s" reads better than 1250000000.0) when they read back exactly."""
    dump = getattr(value, "model_dump", None)
    if dump is None:
        return value
    out = dump(mode="json", exclude_defaults=True)
    if isinstance(value, LinkSpec):
        readable = {"bandwidth": f"{value.bandwidth_bytes_per_s / 1e9:.6g} GB/s",
                    **({"latency": f"{value.latency_s * 1e6:.6g} us"} if "latency_s" in out else {}),
                    **{k: v for k, v in out.items() if k not in ("bandwidth_bytes_per_s", "latency_s")}}
        if LinkSpec.model_validate(readable) == value:
            return readable
    return out


# always written (a saved plan reads whole); every other field only where it is not its default
_PLAN_ALWAYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size",
                "context_parallel_size", "sequence_parallel", "zero_stage", "micro_batch_size",
                "global_batch_size", "recompute", "schedule", "framework")


def _parallel_mapping(p: ParallelPlan) -> dict[str, Any]:
    """Every field of the plan that is not its default (all of the plan's, MoE, offload and
    overlap settings included), under its short name where it has one (tp, pp, dp, cp, vpp, ep,
    etp, dp_shard); the degrees, batch, recompute, schedule and framework always."""
    dumped = p.model_dump(mode="json")  # enums by value, tuples as lists
    parallel: dict[str, Any] = {}
    for key, spec in ParallelPlan.model_fields.items():
        if key not in _PLAN_ALWAYS and getattr(p, key) == spec.default:
            continue
        if key == "virtual_pipeline_model_parallel_size" and p.vpp == 1:
            continue
        choices = getattr(spec.validation_alias, "choices", None) or [key]
        parallel[min(choices, key=len)] = dumped[key]
    return parallel


def _catalog_equal(name: str, value: Any) -> bool:
    try:
        return _in_catalog("clusters", name) and load_any_cluster(name) == value
    except ConfigError:
        return False


__all__ = ["cluster_mapping", "gpu_mapping", "job_mapping", "model_mapping"]
