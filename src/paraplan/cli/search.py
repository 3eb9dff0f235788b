"""`paraplan search`: the best parallel plans for a model on a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from paraplan.cli.common import OutputFormat, err, out, user_errors, write_text

Opt = typer.Option


def search_command(
    job_file: Annotated[Path | None, typer.Argument(help="Job file whose model, cluster and batch to search for.")] = None,
    model: Annotated[str | None, Opt(help="Catalog model name.")] = None,
    cluster: Annotated[str | None, Opt(help="Catalog cluster name or cluster file (node_groups: heterogeneous).")] = None,
    gpu: Annotated[str | None, Opt(help="Catalog GPU name (its reference node's links).")] = None,
    num_gpus: Annotated[int | None, Opt(help="GPUs in all (a multiple of the node size).")] = None,
    num_nodes: Annotated[int | None, Opt(help="Nodes.")] = None,
    global_batch_size: Annotated[int | None, Opt(help="Global batch size in sequences.")] = None,
    precision: Annotated[str | None, Opt(help="fp32 | fp16 | bf16 | fp8")] = None,
    price_per_gpu_hour: Annotated[str | None, Opt(help="e.g. '2.5 USD'.")] = None,
    objective: Annotated[str, Opt(help="time (highest tokens/s) | cost (lowest $ per token)")] = "time",
    train_tokens: Annotated[str | None, Opt(help="Tokens to train, e.g. 2T.")] = None,
    budget: Annotated[str | None, Opt(help="Dollar budget for train_tokens, e.g. 500000USD.")] = None,
    deadline: Annotated[str | None, Opt(help="Deadline for train_tokens, e.g. 14d.")] = None,
    framework: Annotated[
        str | None, Opt(help="megatron | deepspeed | fsdp", show_default="the job file's, else megatron")
    ] = None,
    allow_tp_across_nodes: Annotated[bool, Opt(help="Also try tensor parallelism across nodes.")] = False,
    uneven_layers: Annotated[bool, Opt(help="Let stages hold unequal layer counts (exact partition; always on for node groups).")] = False,
    sizes: Annotated[str | None, Opt(help="Cluster sizing: node counts to try, e.g. 4,8,16,32.")] = None,
    clusters: Annotated[str | None, Opt(help="GPU/cluster types to compare, e.g. dgx-a100,dgx-h100.")] = None,
    pareto: Annotated[Path | None, Opt(help="Write the time-vs-cost Pareto chart to this PNG.")] = None,
    executor: Annotated[str, Opt(help="serial | processes (local cores) | ray (RAY_ADDRESS or a local Ray).")] = "serial",
    top: Annotated[int, Opt(help="How many plans to show.")] = 10,
    save_best: Annotated[Path | None, Opt(help="Write the best plan as a job file (for predict and export).")] = None,
    force: Annotated[bool, Opt("--force", help="Overwrite --save-best / --pareto files that exist.")] = False,
    output: Annotated[OutputFormat, Opt("--format", "-f", help="table | json | csv")] = OutputFormat.table,
) -> None:
    """Enumerate tp x pp x dp x micro-batch x ZeRO x recompute plans; prune by divisibility
    and memory (saying why), time the rest and rank them."""
    from paraplan.catalog.jobs import (
        apply_overrides,
        demo_job_mapping,
        expand_cluster,
        is_hetero,
        read_job_mapping,
        resolve_hetero,
        resolve_job,
    )
    from paraplan.report.search import render_search, search_rows
    from paraplan.search import SearchSpace, merge_results
    from paraplan.search.executors import run_searches
    from paraplan.search.run import OBJECTIVES
    from paraplan.specs import ConfigError
    from paraplan.units import parse_seconds, parse_usd

    with user_errors():
        if objective not in OBJECTIVES:
            raise ConfigError(f"objective: {objective!r} is not one of {', '.join(OBJECTIVES)}")
        if job_file is not None:
            raw = read_job_mapping(job_file)
        elif model or cluster or gpu:
            demo = demo_job_mapping()  # what a flag does not name comes from the demo job
            raw = {"model": demo["model"], "cluster": demo["cluster"], "parallel": demo["parallel"]}
        else:
            raw = demo_job_mapping()
        flags = dict(model=model, cluster=cluster, gpu=gpu, num_nodes=num_nodes, precision=precision,
                     price_per_gpu_hour=price_per_gpu_hour, train_tokens=train_tokens,
                     global_batch_size=global_batch_size)
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
        gbs = mapping["parallel"]["global_batch_size"] or base.parallel.global_batch_size
        space = SearchSpace(framework=framework, allow_tp_across_nodes=allow_tp_across_nodes,
                            uneven_layers=uneven_layers)
        searches = [
            dict(
                model=b.model, cluster=target, global_batch_size=gbs, precision=b.precision, space=space,
                objective=objective, train_tokens=b.train_tokens,
                budget_usd=parse_usd(budget) if budget else None,
                deadline_s=parse_seconds(deadline) if deadline else None,
            )
            for target, b in bases
        ]
        for path in (save_best, pareto):
            if path is not None and path.exists() and not force:
                raise ConfigError(f"{'save_best' if path is save_best else 'pareto'}: {path} already exists; "
                                  "pass --force to overwrite it")
        with err.status(f"searching plans for {base.model.name} on {len(bases)} cluster configuration(s)"):
            result = merge_results(run_searches(searches, executor))
        front = None
        if pareto is not None:
            from paraplan.report.pareto import plot_pareto
            from paraplan.search import pareto_front

            priced = [p for p in result.ranked if p.usd_per_million_tokens is not None]
            if not priced:
                raise ConfigError("pareto: needs clusters with a price_per_gpu_hour")
            to_train = all(p.time_to_train_s is not None for p in priced)
            if to_train:
                front = pareto_front(priced, lambda p: p.time_to_train_s, lambda p: p.cost_to_train_usd)
            else:
                front = pareto_front(priced, lambda p: 1 / p.tokens_per_s, lambda p: p.usd_per_million_tokens)
            plot_pareto(priced, front, pareto, to_train=to_train)
        if save_best is not None:
            _save_best(result, save_best)
    rows = search_rows(result, top)
    if output is OutputFormat.json:
        from paraplan.report.formats import render_json

        data = {"plans": rows, "excluded": dict(result.excluded), "considered": result.considered}
        if front is not None:
            data["pareto"] = search_rows(type(result)(front, result.excluded, result.considered, objective), len(front))
        write_text(render_json(data))
    elif output is OutputFormat.csv:
        from paraplan.report.formats import render_csv

        write_text(render_csv(rows))
    else:
        out.print(render_search(result, rows))
        if save_best is not None:
            err.print(f"wrote {save_best}")
        if front is not None:
            out.print(render_search(type(result)(front, result.excluded, result.considered, objective),
                                    search_rows(type(result)(front, result.excluded, result.considered, objective), len(front)),
                                    title="Pareto front (time against cost)"))
            err.print(f"wrote {pareto}")


def _ints(name: str, text: str) -> list[int]:
    from paraplan.specs import ConfigError

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{name}: expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ConfigError(f"{name}: expected positive whole numbers, got {text!r}")
    return values


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
    for nodes in (_ints("sizes", sizes) if sizes else [None]):
        c = dict(target) if nodes is None else {**target, "num_nodes": nodes}
        if c.get("num_nodes") is None:
            c.pop("num_nodes", None)
        job = resolve_job({**mapping, "cluster": c, "parallel": {}}, base_dir=base_dir)
        out.append((job.cluster, job))
    return out


def _save_best(result, path: Path) -> None:
    import yaml

    from paraplan.catalog.jobs import job_mapping
    from paraplan.specs import ConfigError

    if not result.ranked:
        raise ConfigError("save_best: no plan fits; nothing to save")
    best = result.ranked[0]
    job = best.placement.job if best.placement is not None else best.job
    text = "# the best plan found by `paraplan search`; run `paraplan predict` or `paraplan export` on it\n"
    text += yaml.safe_dump(job_mapping(job), sort_keys=False, default_flow_style=None)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"save_best: cannot write {path} ({exc.strerror})") from None
