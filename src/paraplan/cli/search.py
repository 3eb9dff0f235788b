"""`paraplan search`: the best parallel plans for a model on a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from paraplan.cli.common import MODEL_FLAGS, OutputFormat, err, out, takes_flags, user_errors, write_text
from paraplan.cli.loading import cwd_paths, from_demo

Opt = typer.Option


SPACES = ("default", "full")


@takes_flags(MODEL_FLAGS)
def search_command(
    job_file: Annotated[Path | None, typer.Argument(help="Job file whose model, cluster and batch to search for.")] = None,
    model: Annotated[str | None, Opt(help="Catalog model name.")] = None,
    flags: dict[str, Any] | None = None,  # --seq-length, --hf-config
    cluster: Annotated[str | None, Opt(help="Catalog cluster name or cluster file (node_groups: heterogeneous).")] = None,
    gpu: Annotated[str | None, Opt(help="Catalog GPU name (its reference node's links).")] = None,
    num_gpus: Annotated[int | None, Opt(help="GPUs in all (a multiple of the node size).")] = None,
    num_nodes: Annotated[int | None, Opt(help="Nodes.")] = None,
    global_batch_size: Annotated[str | None, Opt(
        help="Global batch size in sequences; a list (512,1024,2048) ranks the plans of every size together "
             "by tokens/s.")] = None,
    precision: Annotated[str | None, Opt(help="fp32 | tf32 | fp16 | bf16 | fp8")] = None,
    price_per_gpu_hour: Annotated[str | None, Opt(help="e.g. '2.5 USD'.")] = None,
    objective: Annotated[str, Opt(help="time (highest tokens/s) | cost (lowest $ per token)")] = "time",
    train_tokens: Annotated[str | None, Opt(help="Tokens to train, e.g. 2T.")] = None,
    memory_headroom: Annotated[float | None, Opt(
        help="Share of each GPU's memory a plan must leave free, e.g. 0.05.",
        show_default="0.05, or the job file's")] = None,
    budget: Annotated[str | None, Opt(help="Dollar budget for train_tokens, e.g. 500000USD.")] = None,
    deadline: Annotated[str | None, Opt(help="Deadline for train_tokens, e.g. 14d.")] = None,
    framework: Annotated[
        str | None, Opt(help="megatron | deepspeed | fsdp: the search tries only what that framework runs "
                             "(fsdp: ZeRO-0 as DDP, ZeRO-3 whole-group and within a node; deepspeed: ZeRO 0-3, "
                             "0-1 with pp, 1F1B only).", show_default="the job file's, else megatron")
    ] = None,
    space: Annotated[str, Opt(
        help="default: tp, pp, micro-batch 1-8, the framework's ZeRO stages (megatron 0-1) and recompute "
             "policies, sequence parallelism with tp. full: also cp 1-8, vpp 1-8, micro-batch 1-16, ZeRO 0-3 "
             "(fsdp 0,3), sequence parallelism on and off, fsdp's zero-bubble schedules. "
             "--tp ... --sp replace one axis of either.")] = "default",
    tp: Annotated[str | None, Opt("--tp", help="Tensor-parallel sizes to try, e.g. 1,2,4,8.",
                                  show_default="powers of two within a node")] = None,
    pp: Annotated[str | None, Opt("--pp", help="Pipeline-parallel sizes to try, e.g. 1,2,4,8.",
                                  show_default="divisors of the GPU count up to the layers")] = None,
    cp: Annotated[str | None, Opt("--cp", help="Context-parallel sizes to try, e.g. 1,2,4.",
                                  show_default="1; full: 1,2,4,8")] = None,
    vpp: Annotated[str | None, Opt("--vpp", help="Virtual stages per GPU (interleaved 1F1B) to try, e.g. 1,2,4.",
                                   show_default="1; full: 1,2,3,4,6,8")] = None,
    micro_batch_size: Annotated[str | None, Opt("--micro-batch-size", "--mbs", help="Micro-batch sizes to try.",
                                                show_default="1,2,4,8; full: 1,2,4,8,16")] = None,
    zero: Annotated[str | None, Opt("--zero", help="ZeRO stages to try (0-3; 1 = Megatron's distributed optimizer); "
                                    "a stage the framework does not run is counted out with its reason.",
                                    show_default="megatron 0,1 (full: 0-3); deepspeed 0-3; fsdp 0,3")] = None,
    recompute: Annotated[str | None, Opt(
        "--recompute", help="Recompute policies to try: none, selective, full (Megatron-LM, DeepSpeed); full, op, "
                            "layer (torchtitan / FSDP).",
        show_default="megatron, deepspeed: none,selective,full; fsdp: none,full,op")] = None,
    sp: Annotated[str | None, Opt("--sp", help="Sequence parallelism: on (whenever tp > 1), off, or on,off (both).",
                                  show_default="on; full: on,off")] = None,
    ep: Annotated[str | None, Opt("--ep", help="Expert-parallel sizes to try (mixtures of experts), e.g. 1,2,4,8.",
                                  show_default="every divisor of the experts; 1 for a dense model")] = None,
    etp: Annotated[str | None, Opt("--etp", help="Expert tensor-parallel sizes to try, e.g. tp,1 (tp: as --tp).",
                                   show_default="tp; full: tp,1")] = None,
    schedule: Annotated[str | None, Opt(
        "--schedule", help="Pipeline schedules to try: 1f1b, interleaved (vpp from --vpp, else 2), gpipe, zb-h1, "
                           "zb-v (zero-bubble: --framework fsdp), e.g. 1f1b,interleaved,zb-h1,zb-v.",
        show_default="1f1b (interleaved with --vpp above 1)")] = None,
    shard_nodes: Annotated[str | None, Opt(
        "--shard-nodes", help="Hybrid sharding (FSDP HYBRID_SHARD) to try: all (ZeRO shards over the whole data-parallel "
                              "group) and/or nodes per shard group, replicated across, e.g. all,1,2.",
        show_default="fsdp: all,1; megatron, deepspeed: all")] = None,
    offload: Annotated[str | None, Opt("--offload", help="Optimizer offload (ZeRO-Offload) to try: none, cpu, nvme, "
                                       "e.g. none,cpu for on and off.", show_default="none")] = None,
    allow_tp_across_nodes: Annotated[bool, Opt("--allow-tp-across-nodes",
                                               help="Also try tensor parallelism across nodes.")] = False,
    uneven_layers: Annotated[bool, Opt("--uneven-layers", help="Let stages hold unequal layer counts (exact partition; "
                                                                "always on for node groups).")] = False,
    sizes: Annotated[str | None, Opt(help="Cluster sizing: node counts to try, e.g. 4,8,16,32.")] = None,
    clusters: Annotated[str | None, Opt(help="GPU/cluster types to compare, e.g. dgx-a100,dgx-h100.")] = None,
    pareto: Annotated[Path | None, Opt(help="Write the Pareto chart (time against --pareto-axis) to this PNG.")] = None,
    pareto_axis: Annotated[str | None, Opt(
        help="What the Pareto front trades time against: cost, or memory per GPU (on one cluster every plan "
             "costs the same per second, so the time-cost front is the fastest plan alone).",
        show_default="cost with several sizes or clusters, else memory")] = None,
    executor: Annotated[str, Opt(help="serial | processes (local cores) | ray (RAY_ADDRESS or a local Ray).")] = "serial",
    top: Annotated[int, Opt(help="How many plans to show.")] = 10,
    save_best: Annotated[Path | None, Opt(help="Write the best plan as a job file (for predict and export).")] = None,
    force: Annotated[bool, Opt("--force", help="Overwrite --save-best / --pareto files that exist.")] = False,
    output: Annotated[OutputFormat, Opt("--format", "-f", help="table | json | csv")] = OutputFormat.table,
) -> None:
    """Enumerate tp x pp x dp x cp x ep x schedule x vpp x micro-batch x ZeRO x recompute plans; prune by
    divisibility and memory (saying why), time the rest and rank them. Exit code 0 with
    plans, 1 when no plan is left (the bound that excluded them and the nearest plan are
    shown), 2 on bad input."""
    from paraplan.catalog.jobs import (
        apply_overrides,
        demo_job_mapping,
        expand_cluster,
        is_hetero,
        read_job_mapping,
        resolve_hetero,
        resolve_job,
    )
    from paraplan.search import merge_results
    from paraplan.search.executors import run_searches
    from paraplan.search.pareto import PARETO_AXES
    from paraplan.search.run import OBJECTIVES
    from paraplan.specs import ConfigError
    from paraplan.units import parse_seconds, parse_usd

    model_flags = cwd_paths(flags or {})
    with user_errors():
        _check_outputs(save_best, pareto, force)  # before the work, not after
        for flag, value in (("--top", top), ("--num-gpus", num_gpus), ("--num-nodes", num_nodes)):
            if value is not None and value < 1:
                raise ConfigError(f"{flag}: expected a positive whole number, got {value}")
        budget_usd = _positive("--budget", budget, parse_usd, "amount")
        deadline_s = _positive("--deadline", deadline, parse_seconds, "duration")
        if objective not in OBJECTIVES:
            raise ConfigError(f"objective: {objective!r} is not one of {', '.join(OBJECTIVES)}")
        if pareto_axis is not None and pareto_axis not in PARETO_AXES:
            raise ConfigError(f"pareto_axis: {pareto_axis!r} is not one of {', '.join(PARETO_AXES)}")
        batches = _ints("--global-batch-size", global_batch_size) if global_batch_size is not None else None
        if job_file is not None:
            raw = read_job_mapping(job_file)
        elif model or cluster or gpu or model_flags.get("hf_config"):
            demo = demo_job_mapping()  # what a flag does not name comes from the demo job
            raw = {"model": demo["model"], "cluster": demo["cluster"], "parallel": demo["parallel"]}
        else:
            raw = demo_job_mapping()
        flags = dict(model=model, cluster=cluster, gpu=gpu, num_nodes=num_nodes, precision=precision,
                     price_per_gpu_hour=price_per_gpu_hour, train_tokens=train_tokens,
                     global_batch_size=batches[0] if batches else None, memory_headroom=memory_headroom,
                     **model_flags)
        mapping = apply_overrides(raw, flags)
        given = dict(mapping.get("parallel") or {})
        framework = framework or given.get("framework") or "megatron"
        ignored = sorted(set(given) - {"global_batch_size", "framework", "tp", "pp", "dp", "cp", "vpp",
                                       "tensor_model_parallel_size", "pipeline_model_parallel_size",
                                       "data_parallel_size", "context_parallel_size",
                                       "virtual_pipeline_model_parallel_size", "micro_batch_size",
                                       "zero_stage", "recompute", "sequence_parallel", "schedule"})
        if job_file is not None and ignored:
            err.print(f"note: the search neither varies nor keeps the job file's {', '.join(ignored)}; "
                      "predict the plan it finds with them", highlight=False, soft_wrap=True)
        _check_batch(given.get("global_batch_size"))
        mapping["parallel"] = {"global_batch_size": given.get("global_batch_size")}
        base_dir = job_file.parent if job_file else Path(".")
        mapping["cluster"] = expand_cluster(mapping["cluster"], base_dir)
        targets = []  # (cluster mapping or heterogeneous cluster, node counts to try)
        for name in ([c.strip() for c in clusters.split(",")] if clusters else [None]):
            c = mapping["cluster"] if name is None else expand_cluster({"name": name}, base_dir)
            if is_hetero(c):
                if sizes or num_gpus is not None:
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
        bases = [_base(mapping, t, num_gpus, sizes, base_dir) for t in targets]
        bases = [b for group in bases for b in group]
        base = bases[0][1]
        gbs = mapping["parallel"]["global_batch_size"]
        gbs = base.parallel.global_batch_size if gbs is None else gbs
        search_space = _space(space, framework=framework, allow_tp_across_nodes=allow_tp_across_nodes,
                              uneven_layers=uneven_layers, tp=tp, pp=pp, cp=cp, vpp=vpp,
                              micro_batch_size=micro_batch_size, zero=zero, recompute=recompute, sp=sp,
                              offload=offload, batches=batches if batches and len(batches) > 1 else None, ep=ep,
                              etp=etp, schedule=schedule, shard_nodes=shard_nodes,
                              memory_headroom=base.memory_headroom)
        if etp is not None and not base.model.is_moe:
            raise ConfigError("etp: the model is dense (it has no num_moe_experts); expert parallelism "
                              "applies to mixtures of experts")
        axis = None
        if pareto is not None:
            axis = pareto_axis or ("cost" if len(bases) > 1 and all(_priced(b) for _, b in bases) else "memory")
            if axis == "cost" and not all(_priced(b) for _, b in bases):
                raise ConfigError("pareto: the cost axis needs clusters with a price_per_gpu_hour "
                                  "(or --pareto-axis memory)")
        searches = [
            dict(
                model=b.model, cluster=target, global_batch_size=gbs, precision=b.precision, space=search_space,
                objective=objective, train_tokens=b.train_tokens,
                budget_usd=budget_usd, deadline_s=deadline_s,
                pareto=axis,
            )
            for target, b in bases
        ]
        with err.status(f"searching plans for {base.model.name} on {len(bases)} cluster configuration(s)"):
            result = merge_results(run_searches(searches, executor))
        front = None
        if pareto is not None and result.ranked:
            from paraplan.report.pareto import pareto_plans, plot_pareto

            front, to_train = pareto_plans(result, axis)
            plot_pareto(result, front, pareto, axis=axis, to_train=to_train)
        if save_best is not None and result.ranked:
            _save_best(result, save_best)
    if job_file is None:  # the plan axes are searched, not taken from the demo job
        shown = {**raw, "parallel": {"global_batch_size": (raw.get("parallel") or {}).get("global_batch_size")}}
        taken = from_demo(shown, flags, base.model.seq_length)
        if taken:
            err.print(f"from the demo job: {' '.join(taken)}", highlight=False, soft_wrap=True)
    with user_errors():  # a non-finite number is an internal error (exit 3), never output
        _print(result, top, output, front, axis, save_best, pareto)
    if not result.ranked:
        from paraplan.report.search import no_plan_message

        unwritten = [str(p) for p in (save_best, pareto) if p is not None]
        tail = f" (nothing written to {', '.join(unwritten)})" if unwritten else ""
        message = no_plan_message(result)  # "no plan ...": which bound excluded everything, the nearest plan
        err.print(f"[bold red]{message[:7]}[/]{escape(message[7:] + tail)}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=1)


def _print(result, top, output, front, axis, save_best, pareto) -> None:
    from rich.console import Group

    from paraplan.report.search import plan_row, render_plans, render_search, search_rows

    rows = search_rows(result, top)
    closest = result.closest
    if output is OutputFormat.json:
        from paraplan.report.formats import render_json
        from paraplan.report.search import no_plan_message

        data: dict = {"plans": rows, "excluded": dict(result.excluded), "considered": result.considered}
        if front is not None:
            data["pareto"] = search_rows(result, plans=front)
            data["pareto_axis"] = axis
        if not result.ranked:
            data["no_plan"] = no_plan_message(result)
            data["closest"] = None if closest is None else {
                **plan_row(closest.pred, 0),
                "misses": {b: {"needed": need, "limit": limit} for b, (need, limit) in closest.over.items()},
            }
        write_text(render_json(data))
    elif output is OutputFormat.csv:
        from paraplan.report.formats import render_csv

        write_text(render_csv(rows) if rows else "")
    else:
        out.print(render_search(result, rows))
        if not result.ranked and closest is not None:
            missed = " and ".join({"memory": "does not fit", "deadline": "misses the deadline",
                                   "budget": "exceeds the budget"}[b] for b in closest.over)
            out.print(Group(*render_plans(result, [plan_row(closest.pred, 1)], f"Nearest plan ({missed})")))
        if save_best is not None and result.ranked:
            err.print(f"wrote {save_best}")
        if front is not None:
            what = "memory per GPU" if axis == "memory" else "cost"
            title = f"Pareto front: time against {what} ({len(front)} plans)"
            out.print(Group(*render_plans(result, search_rows(result, plans=front), title)))
            err.print(f"wrote {pareto}")


def _priced(job) -> bool:
    cluster = job.cluster
    return getattr(cluster, "price_per_gpu_hour", None) is not None


def _space(name: str, *, framework, allow_tp_across_nodes, uneven_layers, tp, pp, cp, vpp, micro_batch_size, zero,
           recompute, sp, batches, offload=None, ep=None, etp=None, schedule=None, shard_nodes=None,
           memory_headroom=None):
    """The SearchSpace of ``--space`` with the axes the list flags give."""
    from paraplan.search import SearchSpace
    from paraplan.specs import ConfigError, Recompute

    if name not in SPACES:
        raise ConfigError(f"space: {name!r} is not one of {', '.join(SPACES)}")
    axes: dict = {}
    if tp is not None:
        axes["tp"] = tuple(_ints("--tp", tp))
    if pp is not None:
        axes["pp"] = tuple(_ints("--pp", pp))
    if cp is not None:
        axes["cp"] = tuple(_ints("--cp", cp))
    if vpp is not None:
        axes["vpp"] = tuple(_ints("--vpp", vpp))
    if micro_batch_size is not None:
        axes["micro_batch_size"] = tuple(_ints("--micro-batch-size", micro_batch_size))
    if zero is not None:
        stages = _ints("--zero", zero, low=0)
        if max(stages) > 3:
            raise ConfigError(f"--zero: ZeRO stages are 0, 1, 2 or 3, got {zero!r}")
        axes["zero_stage"] = tuple(stages)
    if recompute:
        names = [r.strip() for r in recompute.split(",") if r.strip()]
        known = [r.value for r in Recompute]
        bad = [r for r in names if r not in known]
        if bad or not names:
            raise ConfigError(f"recompute: {', '.join(bad) or repr(recompute)} is not one of {', '.join(known)}")
        axes["recompute"] = tuple(Recompute(r) for r in dict.fromkeys(names))
    if sp:
        values = {v.strip().lower() for v in sp.split(",") if v.strip()}
        if not values or values - {"on", "off"}:
            raise ConfigError(f"sp: expected on, off or on,off, got {sp!r}")
        axes["sequence_parallel"] = "both" if values == {"on", "off"} else ("with_tp" if values == {"on"} else "off")
    if offload:
        axes["offload_optimizer"] = tuple(dict.fromkeys(v.strip().lower() for v in offload.split(",") if v.strip()))
    if batches:
        axes["global_batch_sizes"] = tuple(batches)
    if ep is not None:
        axes["ep"] = tuple(_ints("--ep", ep))
    if etp is not None:
        words = [w.strip() for w in etp.split(",") if w.strip()]
        numbers = [w for w in words if w.lower() != "tp"]
        if not words or (numbers and not _ints("--etp", ",".join(numbers))):
            raise ConfigError(f"--etp: expected tp or comma-separated whole numbers, got {etp!r}")
        axes["etp"] = tuple(dict.fromkeys(None if w.lower() == "tp" else int(w) for w in words))
    if schedule:
        axes["schedule"] = tuple(dict.fromkeys(v.strip().lower() for v in str(schedule).split(",") if v.strip()))
    if shard_nodes is not None:
        words = [w.strip().lower() for w in shard_nodes.split(",") if w.strip()]
        numbers = [w for w in words if w != "all"]
        if not words or not all(w.isdigit() and int(w) > 0 for w in numbers):
            raise ConfigError(f"--shard-nodes: expected all or comma-separated node counts, got {shard_nodes!r}")
        axes["shard_nodes"] = tuple(dict.fromkeys(None if w == "all" else int(w) for w in words))
    common = dict(framework=framework, allow_tp_across_nodes=allow_tp_across_nodes, uneven_layers=uneven_layers)
    if memory_headroom is not None:
        common["memory_headroom"] = memory_headroom
    if name == "full":
        return SearchSpace.full(**common, **axes)
    return SearchSpace(**common, **axes)


def _ints(name: str, text: str, low: int = 1) -> list[int]:
    from paraplan.specs import ConfigError

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{name}: expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < low:
        what = "positive whole numbers" if low == 1 else f"whole numbers from {low}"
        raise ConfigError(f"{name}: expected {what}, got {text!r}")
    return list(dict.fromkeys(values))


def _check_outputs(save_best: Path | None, pareto: Path | None, force: bool) -> None:
    """--save-best and --pareto can be written (folder there, no file unless --force, a picture
    suffix and matplotlib for --pareto), checked before the search runs."""
    from paraplan.files.atomic import check_output_path
    from paraplan.files.pictures import check_plot_path
    from paraplan.specs import ConfigError

    try:
        if save_best is not None:
            check_output_path(save_best, overwrite=force, flag="--force", what="job file")
    except ConfigError as exc:
        raise ConfigError(f"--save-best {exc}") from None
    try:
        if pareto is not None:
            check_plot_path(pareto, overwrite=force, flag="--force")
    except ConfigError as exc:
        raise ConfigError(f"--pareto {exc}") from None


def _positive(flag: str, text: str | None, parse, what: str) -> float | None:
    """``text`` read by ``parse`` (units), refused unless it is above zero."""
    from paraplan.specs import ConfigError, short_repr
    from paraplan.units import UnitError

    if text is None:
        return None
    try:
        value = parse(text)
    except UnitError as exc:
        raise ConfigError(f"{flag}: {exc}") from None
    if not value > 0:
        raise ConfigError(f"{flag}: expected a positive {what}, got {short_repr(text)}")
    return value


def _check_batch(value) -> None:
    """The job file's global batch size, as the plan would validate it."""
    from pydantic import ValidationError

    from paraplan.specs import ConfigError, ParallelPlan, format_validation_error

    if value is None:
        return
    try:
        ParallelPlan(global_batch_size=value)
    except ValidationError as exc:
        raise ConfigError(f"parallel.{format_validation_error(exc)}") from None


def _base(mapping, target, num_gpus, sizes, base_dir):
    """(cluster to search, resolved job for its model, precision and tokens) per node count."""
    from paraplan.catalog.jobs import resolve_job
    from paraplan.specs import ConfigError, HeteroClusterSpec

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
    for nodes in (_ints("--sizes", sizes) if sizes is not None else [None]):
        c = dict(target) if nodes is None else {**target, "num_nodes": nodes}
        if c.get("num_nodes") is None:
            c.pop("num_nodes", None)
        job = resolve_job({**mapping, "cluster": c, "parallel": {}}, base_dir=base_dir)
        out.append((job.cluster, job))
    return out


def _save_best(result, path: Path) -> None:
    import yaml

    from paraplan.catalog.jobfile import job_mapping
    from paraplan.specs import ConfigError

    best = result.ranked[0]
    job = best.placement.job if best.placement is not None else best.job
    text = "# the best plan found by `paraplan search`; run `paraplan predict` or `paraplan export` on it\n"
    text += yaml.safe_dump(job_mapping(job), sort_keys=False, default_flow_style=None)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"save_best: cannot write {path} ({exc.strerror})") from None
