"""The shipped catalog of GPUs, models and clusters (YAML data files), and job resolution."""

from paraplan.catalog.jobs import load_job, resolve_job
from paraplan.catalog.loader import (
    catalog_names,
    load_catalog_entry,
    load_cluster,
    load_gpu,
    load_host_launch,
    load_model,
    load_runtime_memory,
    load_userbuffers,
)

__all__ = [
    "catalog_names",
    "load_catalog_entry",
    "load_cluster",
    "load_gpu",
    "load_host_launch",
    "load_job",
    "load_model",
    "load_runtime_memory",
    "load_userbuffers",
    "resolve_job",
]
