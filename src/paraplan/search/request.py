"""A search asked for in words: the flags of ``paraplan search`` (a job file, a model, a
cluster, comma-separated lists of plan axes) turned into the searches to run, one per cluster
configuration, with the cluster sizing (``--num-gpus``, ``--sizes``, ``--clusters``) done here.

``SearchRequest.from_flags(job_file, SearchFlags(...))`` checks every flag (a bad one raises a
``ConfigError`` naming it) and resolves the job; ``request.run()`` runs the searches."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paraplan.specs import ConfigError, positive_value

if TYPE_CHECKING:
    from paraplan.search.run import SearchResult
    from paraplan.search.space import SearchSpace

SPACES = ("default", "full")

# a flag laid over the job file's (or the demo job's) mapping as ``apply_overrides`` reads it
_JOB = {"job": True}


@dataclass(frozen=True)
class SearchFlags:
    """What ``paraplan search`` is told, as typed on its command line (None: not given; lists
    are comma-separated text, sizes and prices in units). The fields marked ``_JOB`` are laid
    over the job; the others shape the search."""

    model: str | None = field(default=None, metadata=_JOB)
    seq_length: int | None = field(default=None, metadata=_JOB)
    hf_config: str | Path | None = field(default=None, metadata=_JOB)
    cluster: str | None = field(default=None, metadata=_JOB)
    gpu: str | None = field(default=None, metadata=_JOB)
    num_gpus: int | None = None
    num_nodes: int | None = field(default=None, metadata=_JOB)
    global_batch_size: str | None = field(default=None, metadata=_JOB)
    precision: str | None = field(default=None, metadata=_JOB)
    price_per_gpu_hour: str | None = field(default=None, metadata=_JOB)
    objective: str = "time"
    train_tokens: str | None = field(default=None, metadata=_JOB)
    memory_headroom: float | None = field(default=None, metadata=_JOB)
    budget: str | None = None
    deadline: str | None = None
    framework: str | None = None
    space: str = "default"
    tp: str | None = None
    pp: str | None = None
    cp: str | None = None
    vpp: str | None = None
    micro_batch_size: str | None = None
    zero: str | None = None
    recompute: str | None = None
    sp: str | None = None
    ep: str | None = None
    etp: str | None = None
    schedule: str | None = None
    shard_nodes: str | None = None
    offload: str | None = None
    allow_tp_across_nodes: bool = False
    uneven_layers: bool = False
    queued_kernel_gap: bool | None = field(default=None, metadata=_JOB)  # kept on every plan (JOB_STATED)
    sizes: str | None = None
    clusters: str | None = None
    pareto: Any = None  # where the Pareto chart goes (only whether it is asked for matters here)
    pareto_axis: str | None = None
    executor: str = "serial"


@dataclass(frozen=True)
class SearchRequest:
    """The searches ``paraplan search`` runs (``search_plans`` keyword arguments, one mapping
    per cluster configuration) and what its output says about them."""

    searches: tuple[dict[str, Any], ...]
    executor: str
    model_name: str
    pareto_axis: str | None  # cost | memory, when a Pareto front is asked for
    notes: tuple[str, ...] = ()  # what the search leaves out of the job file
    # the demo job's settings (when no job file is given) and the job flags laid over them,
    # for saying what came from the demo job
    demo: dict[str, Any] | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    seq_length: int = 0

    @property
    def num_configurations(self) -> int:
        return len(self.searches)

    def run(self) -> SearchResult:
        """Every search, merged into one ranking."""
        from paraplan.search.executors import run_searches
        from paraplan.search.run import merge_results

        return merge_results(run_searches(list(self.searches), self.executor))

    @classmethod
    def from_flags(cls, job_file: Path | None, flags: SearchFlags) -> SearchRequest:
        """The request of ``flags`` over ``job_file`` (None: the built-in demo job, of which a
        model, cluster or GPU flag keeps only what it does not name). A bad flag raises a
        ``ConfigError`` naming it, before any search runs."""
        from paraplan.catalog.jobs import apply_overrides, demo_for_flags, demo_job_mapping, read_job_mapping
        from paraplan.search.pareto import PARETO_AXES
        from paraplan.search.run import OBJECTIVES
        from paraplan.units import parse_seconds, parse_usd

        f = flags
        for flag, value in (("--num-gpus", f.num_gpus), ("--num-nodes", f.num_nodes)):
            if value is not None and value < 1:
                raise ConfigError(f"{flag}: expected a positive whole number, got {value}")
        budget_usd = positive_value("--budget", f.budget, parse_usd, "amount")
        deadline_s = positive_value("--deadline", f.deadline, parse_seconds, "duration")
        if f.objective not in OBJECTIVES:
            raise ConfigError(f"objective: {f.objective!r} is not one of {', '.join(OBJECTIVES)}")
        if f.pareto_axis is not None and f.pareto_axis not in PARETO_AXES:
            raise ConfigError(f"pareto_axis: {f.pareto_axis!r} is not one of {', '.join(PARETO_AXES)}")
        batches = ints("--global-batch-size", f.global_batch_size) if f.global_batch_size is not None else None
        if job_file is not None:
            raw = read_job_mapping(job_file)
        elif f.model or f.cluster or f.gpu or f.hf_config:
            demo = demo_job_mapping()  # what a flag does not name comes from the demo job
            raw = {"model": demo["model"], "cluster": demo["cluster"], "parallel": demo["parallel"]}
        else:
            raw = demo_job_mapping()
        overrides = {x.name: getattr(f, x.name) for x in fields(f) if x.metadata.get("job")}
        overrides["global_batch_size"] = batches[0] if batches else None  # a list ranks every size together
        if job_file is None:  # the demo's values are an example: a cluster flag or a preset replaces them
            raw = demo_for_flags(raw, {**overrides, "framework": f.framework})
        mapping = apply_overrides(raw, overrides)
        given = dict(mapping.get("parallel") or {})
        framework = f.framework or given.get("framework") or "megatron"
        _check_batch(given.get("global_batch_size"))
        mapping["parallel"] = {"global_batch_size": given.get("global_batch_size")}
        base_dir = job_file.parent if job_file else Path(".")
        bases = _configurations(mapping, f, base_dir)
        base = bases[0][1]
        gbs = mapping["parallel"]["global_batch_size"]
        gbs = base.parallel.global_batch_size if gbs is None else gbs
        space = search_space(f.space, f, framework=framework, memory_headroom=base.memory_headroom,
                             batches=batches if batches and len(batches) > 1 else None,
                             preset_stated=_preset_stated(framework, given), extra=_job_stated(given))
        # the job file's plan fields the space has no axis for (apply_overrides gave the long names)
        ignored = sorted(set(given) - space.plan_fields() - set(space.preset_stated))
        notes = ()
        if job_file is not None and ignored:
            notes = (f"note: the search neither varies nor keeps the job file's {', '.join(ignored)}; "
                     "predict the plan it finds with them",)
        if f.etp is not None and not base.model.is_moe:
            raise ConfigError("etp: the model is dense (it has no num_moe_experts); expert parallelism "
                              "applies to mixtures of experts")
        axis = None
        if f.pareto is not None:
            priced = all(_priced(b) for _, b in bases)
            axis = f.pareto_axis or ("cost" if len(bases) > 1 and priced else "memory")
            if axis == "cost" and not priced:
                raise ConfigError("pareto: the cost axis needs clusters with a price_per_gpu_hour "
                                  "(or --pareto-axis memory)")
        searches = tuple(
            dict(model=b.model, cluster=target, global_batch_size=gbs, precision=b.precision, space=space,
                 objective=f.objective, train_tokens=b.train_tokens, budget_usd=budget_usd,
                 deadline_s=deadline_s, pareto=axis)
            for target, b in bases
        )
        demo_shown = None
        if job_file is None:  # the plan axes are searched, not taken from the demo job
            demo_shown = {**raw, "parallel": {"global_batch_size": (raw.get("parallel") or {}).get("global_batch_size")}}
        return cls(searches=searches, executor=f.executor, model_name=base.model.name, pareto_axis=axis,
                   notes=notes, demo=demo_shown, overrides=overrides, seq_length=base.model.seq_length)


def _configurations(mapping: dict[str, Any], f: SearchFlags, base_dir: Path) -> list[tuple[Any, Any]]:
    """(cluster to search, resolved job for its model, precision and tokens) for each cluster
    of ``--clusters`` (else the job's) and each node count of ``--num-gpus`` / ``--sizes``."""
    from paraplan.catalog.jobs import expand_cluster, is_hetero, resolve_hetero, resolve_job

    mapping["cluster"] = expand_cluster(mapping["cluster"], base_dir)
    targets = []  # (cluster mapping or heterogeneous cluster, node counts to try)
    for name in ([c.strip() for c in f.clusters.split(",")] if f.clusters else [None]):
        c = mapping["cluster"] if name is None else expand_cluster({"name": name}, base_dir)
        if is_hetero(c):
            if f.sizes or f.num_gpus is not None:
                raise ConfigError("sizes: a heterogeneous cluster's size is set by its node groups")
            targets.append(resolve_hetero(c))
        elif name is not None:  # another GPU type at the size of the job's cluster
            main = mapping["cluster"]
            if is_hetero(main):  # as many GPUs as the heterogeneous cluster
                gpus = resolve_hetero(main).num_gpus
                per_node = resolve_job({**mapping, "cluster": {**c, "num_nodes": 1}, "parallel": {}},
                                       base_dir=base_dir).cluster.gpus_per_node
                nodes = max(1, gpus // per_node)
            else:
                nodes = resolve_job({**mapping, "parallel": {}}, base_dir=base_dir).cluster.num_nodes
            targets.append({**c, "num_nodes": c.get("num_nodes", nodes)})
        else:
            targets.append(c)
    return [b for t in targets for b in _sized(mapping, t, f.num_gpus, f.sizes, base_dir)]


def _sized(mapping, target, num_gpus, sizes, base_dir):
    """(cluster to search, resolved job for its model, precision and tokens) per node count."""
    from paraplan.catalog.jobs import resolve_job
    from paraplan.specs import HeteroClusterSpec

    if isinstance(target, HeteroClusterSpec):
        # the model, precision and tokens, resolved against each group (a saved plan's node_order
        # and split do not belong to the search)
        plain = {k: v for k, v in mapping.items() if k != "node_order"}
        jobs = [resolve_job({**plain, "cluster": target.view(g).model_dump(), "parallel": {}}, base_dir=base_dir)
                for g in range(len(target.node_groups))]
        return [(target, jobs[0])]
    if num_gpus is not None:
        node = resolve_job({**mapping, "cluster": target, "parallel": {}}, base_dir=base_dir).cluster
        if num_gpus % node.gpus_per_node:
            raise ConfigError(f"num_gpus: {num_gpus} is not a multiple of {node.gpus_per_node} GPUs per node")
        target = {**target, "num_nodes": num_gpus // node.gpus_per_node}
    out = []
    for nodes in (ints("--sizes", sizes) if sizes is not None else [None]):
        c = dict(target) if nodes is None else {**target, "num_nodes": nodes}
        if c.get("num_nodes") is None:
            c.pop("num_nodes", None)
        job = resolve_job({**mapping, "cluster": c, "parallel": {}}, base_dir=base_dir)
        out.append((job.cluster, job))
    return out


def _priced(job) -> bool:
    return getattr(job.cluster, "price_per_gpu_hour", None) is not None


def _preset_stated(framework: str, given: dict[str, Any]) -> dict[str, Any]:
    """The job file's values of the fields its framework preset would set that no axis varies
    (kept over the preset's in every plan; nothing without a preset)."""
    from paraplan.search.space import PRESET_STATED, find_space_preset

    preset = find_space_preset(framework)
    if preset is None:
        return {}
    return {d.field: given[d.field] for d in preset.defaults if d.field in PRESET_STATED and d.field in given}


def _job_stated(given: dict[str, Any]) -> dict[str, Any]:
    """The job file's values of the plan fields no preset sets and no axis varies that every
    plan keeps (``search.space.JOB_STATED``)."""
    from paraplan.search.space import JOB_STATED

    return {k: given[k] for k in JOB_STATED if k in given}


def search_space(name: str, f: SearchFlags, *, framework: str, batches: list[int] | None,
                 memory_headroom: float | None = None, preset_stated: dict[str, Any] | None = None,
                 extra: dict[str, Any] | None = None) -> SearchSpace:
    """The SearchSpace of ``--space`` with the axes the list flags of ``f`` give; ``extra``: plan
    fields every plan keeps."""
    from paraplan.search.space import SearchSpace
    from paraplan.specs import Recompute

    if name not in SPACES:
        raise ConfigError(f"space: {name!r} is not one of {', '.join(SPACES)}")
    axes: dict = {}
    for key, flag, text in (("tp", "--tp", f.tp), ("pp", "--pp", f.pp), ("cp", "--cp", f.cp),
                            ("vpp", "--vpp", f.vpp), ("micro_batch_size", "--micro-batch-size", f.micro_batch_size)):
        if text is not None:
            axes[key] = tuple(ints(flag, text))
    if f.zero is not None:
        stages = ints("--zero", f.zero, low=0)
        if max(stages) > 3:
            raise ConfigError(f"--zero: ZeRO stages are 0, 1, 2 or 3, got {f.zero!r}")
        axes["zero_stage"] = tuple(stages)
    if f.recompute:
        names = [r.strip() for r in f.recompute.split(",") if r.strip()]
        known = [r.value for r in Recompute]
        bad = [r for r in names if r not in known]
        if bad or not names:
            raise ConfigError(f"recompute: {', '.join(bad) or repr(f.recompute)} is not one of {', '.join(known)}")
        axes["recompute"] = tuple(Recompute(r) for r in dict.fromkeys(names))
    if f.sp:
        values = {v.strip().lower() for v in f.sp.split(",") if v.strip()}
        if not values or values - {"on", "off"}:
            raise ConfigError(f"sp: expected on, off or on,off, got {f.sp!r}")
        axes["sequence_parallel"] = "both" if values == {"on", "off"} else ("with_tp" if values == {"on"} else "off")
    if f.offload:
        axes["offload_optimizer"] = _words(f.offload)
    if batches:
        axes["global_batch_sizes"] = tuple(batches)
    if f.ep is not None:
        axes["ep"] = tuple(ints("--ep", f.ep))
    if f.etp is not None:
        words = [w.strip() for w in f.etp.split(",") if w.strip()]
        numbers = [w for w in words if w.lower() != "tp"]
        if not words or (numbers and not ints("--etp", ",".join(numbers))):
            raise ConfigError(f"--etp: expected tp or comma-separated whole numbers, got {f.etp!r}")
        axes["etp"] = tuple(dict.fromkeys(None if w.lower() == "tp" else int(w) for w in words))
    if f.schedule:
        axes["schedule"] = _words(str(f.schedule))
    if f.shard_nodes is not None:
        words = [w.strip().lower() for w in f.shard_nodes.split(",") if w.strip()]
        numbers = [w for w in words if w != "all"]
        if not words or not all(w.isdigit() and int(w) > 0 for w in numbers):
            raise ConfigError(f"--shard-nodes: expected all or comma-separated node counts, got {f.shard_nodes!r}")
        axes["shard_nodes"] = tuple(dict.fromkeys(None if w == "all" else int(w) for w in words))
    common = dict(framework=framework, allow_tp_across_nodes=f.allow_tp_across_nodes, uneven_layers=f.uneven_layers)
    if preset_stated:
        common["preset_stated"] = preset_stated
    if extra:
        common["extra"] = extra
    if memory_headroom is not None:
        common["memory_headroom"] = memory_headroom
    if name == "full":
        return SearchSpace.full(**common, **axes)
    return SearchSpace(**common, **axes)


def _words(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v.strip().lower() for v in text.split(",") if v.strip()))


def ints(name: str, text: str, low: int = 1) -> list[int]:
    """Comma-separated whole numbers from ``low`` up, each once; else a ConfigError naming ``name``."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{name}: expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < low:
        what = "positive whole numbers" if low == 1 else f"whole numbers from {low}"
        raise ConfigError(f"{name}: expected {what}, got {text!r}")
    return list(dict.fromkeys(values))


def _check_batch(value) -> None:
    """The job file's global batch size, as the plan would validate it."""
    from pydantic import ValidationError

    from paraplan.specs import ParallelPlan, format_validation_error

    if value is None:
        return
    try:
        ParallelPlan(global_batch_size=value)
    except ValidationError as exc:
        raise ConfigError(f"parallel.{format_validation_error(exc)}") from None


__all__ = ["SPACES", "SearchFlags", "SearchRequest", "ints", "search_space"]
