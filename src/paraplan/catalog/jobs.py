"""Turn a job mapping (from YAML, flags or Python) into a validated Job, resolving catalog names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from paraplan.catalog.loader import hetero_cluster, load_catalog_entry, load_cluster, load_gpu, load_model
from paraplan.catalog.userdata import load_data, load_yaml, read_text
from paraplan.specs import (
    PLAN_ALIASES,
    ClusterSpec,
    ConfigError,
    GpuSpec,
    HeteroClusterSpec,
    HeteroJob,
    Job,
    ModelSpec,
    ParallelPlan,
    format_validation_error,
    short_repr,
)

_JOB_KEYS = {"name", "model", "cluster", "parallel", "precision", "train_tokens", "node_order", "memory_headroom"}


def _model(value: Any, base_dir: Path) -> ModelSpec | dict[str, Any]:
    if isinstance(value, str):
        return load_model(value)
    if isinstance(value, dict) and "hf_config" in value:
        from paraplan.catalog.hf import model_from_hf_config

        if not isinstance(value["hf_config"], str):
            raise ConfigError("model.hf_config: expected the path of a config.json (a string)")
        path = Path(value["hf_config"])
        return model_from_hf_config(path if path.is_absolute() else base_dir / path, value)
    name = value.get("name") if isinstance(value, dict) else None
    if isinstance(name, str) and _in_catalog("models", name):
        # a catalog model with some fields changed: no longer the catalog entry
        raw = load_catalog_entry("models", name)
        changed = {k: v for k, v in value.items() if k != "name"}
        raw.update(changed)
        raw.pop("aliases", None)
        if changed:
            raw["name"] = f"{raw['name']} (modified)"
        return raw
    return value


def _gpu(value: Any) -> GpuSpec | Any:
    if isinstance(value, str):
        return load_gpu(value)
    if not isinstance(value, dict | GpuSpec):
        raise ConfigError("cluster.gpu: expected a catalog GPU name or a mapping of GPU fields")
    return value


def _cluster_value(value: Any) -> str | dict[str, Any]:
    """A job's ``cluster``: a catalog name (or cluster file) or a mapping with string keys."""
    if isinstance(value, str):
        return value
    if not isinstance(value, dict):
        raise ConfigError(
            f"cluster: expected a catalog cluster name or a mapping (gpu, num_nodes, ...), got {short_repr(value)}"
        )
    _string_keys(value, "cluster")
    groups = value.get("node_groups")
    for i, group in enumerate(groups if isinstance(groups, list | tuple) else ()):
        if isinstance(group, dict):
            _string_keys(group, f"cluster.node_groups.{i}")
    return value


def _string_keys(mapping: dict[Any, Any], where: str) -> None:
    bad = next((k for k in mapping if not isinstance(k, str)), None)
    if bad is not None:
        raise ConfigError(f"{where}.{short_repr(bad)}: unknown key (keys are names, not {type(bad).__name__}s)")


def _cluster(value: Any) -> Any:
    """A catalog name, or a mapping: with a catalog ``name`` its fields override that entry
    (``{name: dgx-h100, num_nodes: 8}``); otherwise a cluster described by its GPU, which takes
    what it does not state of its nodes (``gpus_per_node``, ``intra_node``, ``inter_node``)
    from the GPU's reference node in the catalog, as ``--gpu`` does (``_on_reference_node``)."""
    if isinstance(value, str):
        return load_cluster(value)
    if not isinstance(value, dict):
        raise ConfigError("cluster: expected a catalog cluster name or a mapping (gpu, num_nodes, ...)")
    value = dict(value)
    if "gpu" in value:
        value["gpu"] = _gpu(value["gpu"])
    name = value.get("name")
    if isinstance(name, str) and _in_catalog("clusters", name):
        value.pop("name")
        return load_cluster(name, **value)
    if "gpu" not in value and isinstance(name, str):
        return load_cluster(name)  # not in the catalog: says so, with the closest names
    return _on_reference_node(value) if "gpu" in value else value


def _on_reference_node(value: dict[str, Any]) -> Any:
    """A cluster described by its GPU, completed from the GPU's reference node when it lacks
    its node size or a link its jobs use: the reference node's links, with the mapping's own
    fields laid over them. Its name says which node: ``dgx-h100 with H100-SXM5-80GB``, or the
    mapping's own name followed by ``(dgx-h100 network)``. A mapping that states all of them,
    or whose GPU has no reference node, is validated as it is."""
    gpu = value["gpu"]
    reference = gpu.reference_node if isinstance(gpu, GpuSpec) else dict(gpu).get("reference_node")
    per_node = value.get("gpus_per_node")
    lacks = (
        per_node is None
        or ("intra_node" not in value and per_node != 1)
        or ("inter_node" not in value and value.get("num_nodes", 1) != 1)
    )
    if not lacks:
        return value
    if not isinstance(reference, str):
        nodes = value.get("num_nodes", 1)
        if "inter_node" not in value and nodes != 1:
            gpu_name = gpu.name if isinstance(gpu, GpuSpec) else dict(gpu).get("name", "the GPU")
            raise ConfigError(
                f"cluster.inter_node: {nodes} nodes need an inter-node link, and the catalog has no "
                f"reference node for {gpu_name} to take one from (give inter_node: {{bandwidth, "
                "latency}, or name a catalog cluster)"
            )
        return value
    own_name = value.pop("name", None)
    cluster = load_cluster(reference, **value)
    if own_name is not None:
        cluster = cluster.model_copy(update={"name": f"{own_name} ({reference} network)"})
    return cluster


def _parallel(value: Any) -> Any:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError("parallel: expected a mapping (tp, pp, micro_batch_size, ...)")
    for short, long in _SHORT.items():
        if short in value and long in value:
            raise ConfigError(f"parallel.{short}: given twice, as {short} and as {long}")
    return value


def _in_catalog(kind: str, name: str) -> bool:
    try:
        load_catalog_entry(kind, name)  # type: ignore[arg-type]
    except ConfigError:
        return False
    return True


def resolve_job(raw: dict[str, Any], base_dir: Path | str = ".") -> Job | HeteroJob:
    """A Job from a mapping whose model, cluster and GPU may be catalog names (a HeteroJob
    when the cluster has node groups of different GPUs; ``node_order`` then orders its nodes).

    Every problem is raised as a one-line ConfigError naming the field.
    """
    if not isinstance(raw, dict):
        raise ConfigError("job: expected a mapping with model, cluster and parallel")
    unknown = sorted(set(raw) - _JOB_KEYS)
    if unknown:
        raise ConfigError(
            f"{unknown[0]}: unknown key (expected one of: {', '.join(sorted(_JOB_KEYS))})"
        )
    for required in ("model", "cluster"):
        if required not in raw:
            raise ConfigError(f"{required}: required but missing")
    data = dict(raw)
    base = Path(base_dir)
    cluster = data["cluster"]
    cluster = expand_cluster({"name": cluster} if isinstance(cluster, str) else cluster, base)
    data["cluster"] = cluster if set(cluster) != {"name"} else cluster["name"]
    hetero = isinstance(cluster, dict) and is_hetero(cluster)
    if "node_order" in data and not hetero:
        raise ConfigError("node_order: only a cluster with node groups (node_groups) has a node order")
    try:
        data["model"] = _model(data["model"], base)
    except ConfigError as err:
        message = str(err)
        raise ConfigError(message if message.startswith("model") else f"model: {message}") from None
    try:
        data["cluster"] = resolve_hetero(cluster) if hetero else _cluster(data["cluster"])
    except ConfigError as err:
        message = str(err)
        raise ConfigError(message if message.startswith("cluster") else f"cluster: {message}") from None
    data["parallel"] = _parallel(data.get("parallel"))
    _apply_preset(data)
    if hetero and "node_order" in data:
        data["node_order"] = _node_order(data["node_order"], data["cluster"])
    try:
        return (HeteroJob if hetero else Job).model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def _apply_preset(data: dict[str, Any]) -> None:
    """Lay the framework preset ``parallel.framework`` names (``nemo-24.07``) under the plan's
    stated fields, and keep what it did for the prediction to say (``Job.preset``); a plan with a
    degree the framework never runs (its ``runs``) is refused."""
    from paraplan.catalog.presets import apply_model_defaults, apply_preset, find_preset, plan_runs_problem

    preset = find_preset(data["parallel"].get("framework"))
    if preset is None:
        return
    cluster = data["cluster"]
    if isinstance(cluster, dict):  # a cluster described in full, validated with the job
        per_node = int(cluster.get("gpus_per_node") or 1)
        nodes, num_gpus = per_node, int(cluster.get("num_nodes") or 1) * per_node
    else:
        nodes, num_gpus = cluster.gpus_per_node, cluster.num_gpus
    data["parallel"], use = apply_preset(
        data["parallel"], preset, num_gpus=num_gpus, gpus_per_node=nodes, model=data["model"],
        precision=data.get("precision"))
    data["model"], taken, overridden = apply_model_defaults(data["model"], preset)
    data["preset"] = use.model_copy(update={"model_taken": taken, "model_overridden": overridden})
    problem = plan_runs_problem(preset, data["parallel"])
    if problem is not None:
        raise ConfigError(problem)


def _node_order(value: Any, cluster: HeteroClusterSpec) -> list[int]:
    """Group indices from a list of indices or of node-group names."""
    names = [g.name for g in cluster.node_groups]
    if not isinstance(value, list | tuple):
        raise ConfigError("node_order: expected a list with one node group (index or name) per node")
    out = []
    for v in value:
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(names):
            out.append(v)
        elif isinstance(v, str) and names.count(v) == 1:
            out.append(names.index(v))
        else:
            raise ConfigError(f"node_order: {short_repr(v)} is not a node group (indices 0-{len(names) - 1} or one of: "
                              f"{', '.join(names)})")
    return out


def load_job(path: Path | str) -> Job | HeteroJob:
    """Read a job file (YAML or JSON) and resolve it."""
    path = Path(path)
    return resolve_job(read_job_file(path), base_dir=path.parent)


# a job file's short plan names (tp, pp, dp, cp, vpp, dp_shard, ep, etp): the plan's own aliases
_SHORT = PLAN_ALIASES


def demo_job_mapping() -> dict[str, Any]:
    """The built-in demo job (``paraplan predict`` with no file)."""
    from importlib import resources

    text = (resources.files("paraplan.catalog") / "demo-job.yaml").read_text(encoding="utf-8")
    return load_yaml(text, "demo-job.yaml")


def demo_for_flags(demo: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """The demo job as ``flags`` (``apply_overrides``' keys) are laid over it. Its values are an
    example, not the user's: its number of nodes belongs to its cluster, so a cluster or GPU
    flag leaves it out (a job file's stays); and where the flags name a framework preset
    (``--framework nemo``), the plan values the preset sets are left out for the preset's
    defaults to replace. A value a flag gives is the user's and always wins."""
    from paraplan.catalog.presets import find_preset

    given = {PLAN_ALIASES.get(k, k) for k, v in flags.items() if v is not None}
    out = dict(demo)
    cluster = out.get("cluster")
    if given & {"cluster", "gpu"} and isinstance(cluster, dict):
        out["cluster"] = {k: v for k, v in cluster.items() if k != "num_nodes"}
    preset = find_preset(flags.get("framework"))
    parallel = out.get("parallel")
    if preset is not None and isinstance(parallel, dict):
        preset_sets = {d.field for d in preset.defaults} - given
        out["parallel"] = {k: v for k, v in parallel.items() if PLAN_ALIASES.get(k, k) not in preset_sets}
    return out


def read_job_file(path: Path | str) -> dict[str, Any]:
    """A job file's mapping, named after the file when it names itself nothing (a report's
    heading then reads "llama-70b-tp8", not Job's default "job")."""
    raw = read_job_mapping(path)
    return raw if "name" in raw else {"name": Path(path).stem.removesuffix(".job"), **raw}


def read_job_mapping(path: Path | str) -> dict[str, Any]:
    """The raw mapping of a job file (YAML or JSON), before resolution."""
    path = Path(path)
    text = read_text(path, "the job file")
    raw = load_data(text, str(path), is_json=path.suffix.lower() == ".json")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with model, cluster and parallel")
    return raw


def apply_overrides(raw: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """A job mapping with command-line values laid over it (``None`` means not given).

    ``model`` and ``cluster`` replace the file's (a job name then says the model changed);
    ``gpu`` replaces the cluster's GPU, and without a cluster flag describes the cluster by its
    GPU, which takes its node and links from the GPU's reference node in the catalog as the
    same mapping in a file does; cluster and parallel flags override single fields;
    ``hf_config`` (a config.json) replaces the model, keeping the job's sequence length unless
    ``seq_length`` gives one, which alone changes the sequence length of the job's model.
    """
    job = dict(raw)
    given = {k: v for k, v in flags.items() if v is not None}
    if "model" in given:
        if isinstance(job.get("name"), str) and "name" not in given and job.get("model") != given["model"]:
            job["name"] = f"{job['name']} (--model {given['model']})"  # not the job the file named
        job["model"] = given["model"]
    _model_overrides(job, given)
    cluster = given.get("cluster", job.get("cluster"))
    if "gpu" in given and "cluster" not in given:
        gpu = load_gpu(given["gpu"])
        if gpu.reference_node is None:
            raise ConfigError(
                f"gpu: the catalog has no reference node for {gpu.name}; name a --cluster too"
            )
        cluster = {}  # a cluster described by its GPU: the reference node's network (_cluster)
    cluster = {} if cluster is None else _cluster_value(cluster)
    cluster = {"name": cluster} if isinstance(cluster, str) else dict(cluster)
    if given.keys() & {"cluster", "gpu"}:
        cluster.update(_kept_nodes(job.get("cluster"), cluster))
    parallel = {_SHORT.get(k, k): v for k, v in _parallel(job.get("parallel")).items()}
    for key, value in given.items():  # each into the part of the job whose field it is
        if key in ParallelPlan.model_fields:
            parallel[key] = value
        elif key in Job.model_fields:
            if key not in ("model", "cluster", "parallel"):  # (laid over above)
                job[key] = value
        elif key in ClusterSpec.model_fields:
            cluster[key] = value
    job["cluster"] = cluster
    job["parallel"] = parallel
    return job


def _kept_nodes(stated: Any, cluster: dict[str, Any]) -> dict[str, Any]:
    """The number of nodes a job's ``stated`` cluster gives, kept when a cluster or GPU flag
    replaces its node: a job on 8 nodes stays on 8 nodes of the new one, as a SLURM
    ``--nodes`` stays when the partition changes (so its GPUs are 8 x the new node's). Nothing
    when the job states no number of nodes (the new cluster's own stands), or when the new
    cluster has node groups (each group says its own)."""
    if not isinstance(stated, dict) or stated.get("num_nodes") is None:
        return {}
    if isinstance(cluster.get("name"), str):  # a catalog cluster: its node groups are the catalog's
        grouped = is_hetero(expand_cluster(cluster))
    else:
        grouped = "node_groups" in cluster
    if grouped:
        return {}
    return {"num_nodes": stated["num_nodes"]}


def _model_overrides(job: dict[str, Any], given: dict[str, Any]) -> None:
    """``hf_config`` (a Hugging Face config.json) replaces the job's model and keeps its
    sequence length unless ``seq_length`` is given; ``seq_length`` alone changes the model's."""
    seq = given.get("seq_length")
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or seq < 1):
        raise ConfigError(f"seq_length: expected a positive whole number of tokens, got {short_repr(seq)}")
    if "hf_config" in given:
        if "model" in given:
            raise ConfigError("hf_config: --hf-config and --model both name the model; give one of them")
        if seq is None:
            seq = job_seq_length(job.get("model"))
        if isinstance(job.get("name"), str) and "name" not in given:
            job["name"] = f"{job['name']} (--hf-config {Path(given['hf_config']).name})"
        job["model"] = {"hf_config": str(given["hf_config"]), **({"seq_length": seq} if seq is not None else {})}
    elif seq is not None:
        model = job.get("model")
        if isinstance(model, str):
            job["model"] = {"name": model, "seq_length": seq}
        elif isinstance(model, dict):
            job["model"] = {**model, "seq_length": seq}


def job_seq_length(model: Any) -> int | None:
    """The sequence length of a job's ``model`` (a catalog name or a mapping), None when it
    states none."""
    if isinstance(model, dict) and model.get("seq_length") is not None:
        return model["seq_length"]
    name = model if isinstance(model, str) else model.get("name") if isinstance(model, dict) else None
    if isinstance(name, str) and _in_catalog("models", name):
        return load_catalog_entry("models", name).get("seq_length")
    return None


_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def expand_cluster(cluster: Any, base_dir: Path | str = ".") -> dict[str, Any]:
    """A cluster mapping whose ``name`` may be the path of a cluster file (YAML/JSON): the
    file's mapping with the other keys laid over it. Anything but a mapping with string keys
    is a ConfigError."""
    cluster = _cluster_value(cluster)
    if isinstance(cluster, str):
        cluster = {"name": cluster}
    name = cluster.get("name")
    if isinstance(name, str) and name.endswith(_FILE_SUFFIXES):
        path = Path(name) if Path(name).is_absolute() else Path(base_dir) / name
        if not path.exists() and Path(name).exists():
            path = Path(name)
        try:
            raw = read_job_mapping(path)
        except ConfigError as err:
            raise ConfigError(f"cluster: {err}") from None
        return _cluster_value({**raw, **{k: v for k, v in cluster.items() if k != "name"}})
    return cluster


def is_hetero(cluster: dict[str, Any]) -> bool:
    """Whether a (expanded) cluster mapping describes node groups of different GPUs."""
    if "node_groups" in cluster:
        return True
    name = cluster.get("name")
    return isinstance(name, str) and _in_catalog("clusters", name) and "node_groups" in load_catalog_entry("clusters", name)


def resolve_hetero(cluster: dict[str, Any]) -> HeteroClusterSpec:
    """A heterogeneous cluster from a catalog name with node groups, or a mapping with them."""
    raw = dict(cluster)
    name = raw.get("name")
    if "node_groups" not in raw and isinstance(name, str):
        raw = {**load_catalog_entry("clusters", name), **{k: v for k, v in raw.items() if k != "name"}}
    for key in ("num_nodes", "gpus_per_node", "gpu", "price_per_gpu_hour"):
        if key in raw:
            raise ConfigError(f"cluster.{key}: a heterogeneous cluster sets it per node group (node_groups)")
    return hetero_cluster(raw)


def load_cluster_file(path: Path | str) -> ClusterSpec:
    """A cluster of one GPU type from a cluster file (YAML/JSON), as a job's ``cluster:`` names it."""
    path = Path(path)
    cluster = _cluster(expand_cluster({"name": str(path)}))
    if isinstance(cluster, dict):
        if is_hetero(cluster):
            raise ConfigError(f"{path}: a cluster of node groups; name a cluster of one GPU type")
        try:
            return ClusterSpec.model_validate(cluster)
        except ValidationError as err:
            raise ConfigError(f"{path}: {format_validation_error(err)}") from None
    return cluster
