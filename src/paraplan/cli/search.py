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
    cluster: Annotated[str | None, Opt(help="Catalog cluster name.")] = None,
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
    framework: Annotated[str, Opt(help="megatron | deepspeed")] = "megatron",
    allow_tp_across_nodes: Annotated[bool, Opt(help="Also try tensor parallelism across nodes.")] = False,
    top: Annotated[int, Opt(help="How many plans to show.")] = 10,
    output: Annotated[OutputFormat, Opt("--format", "-f", help="table | json | csv")] = OutputFormat.table,
) -> None:
    """Enumerate tp x pp x dp x micro-batch x ZeRO x recompute plans; prune by divisibility
    and memory (saying why), time the rest and rank them."""
    from paraplan.catalog.jobs import apply_overrides, demo_job_mapping, read_job_mapping, resolve_job
    from paraplan.report.search import render_search, search_rows
    from paraplan.search import SearchSpace, search_plans
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
        mapping["parallel"] = {"global_batch_size": mapping["parallel"].get("global_batch_size")}
        if num_gpus is not None:
            node = resolve_job({**mapping, "parallel": {}}).cluster
            if num_gpus % node.gpus_per_node:
                raise ConfigError(f"num_gpus: {num_gpus} is not a multiple of {node.gpus_per_node} GPUs per node")
            mapping["cluster"] = {**mapping["cluster"], "num_nodes": num_gpus // node.gpus_per_node}
        base = resolve_job({**mapping, "parallel": {}}, base_dir=job_file.parent if job_file else ".")
        gbs = mapping["parallel"]["global_batch_size"] or base.parallel.global_batch_size
        with err.status(f"searching plans for {base.model.name} on {base.cluster.num_gpus} x {base.cluster.gpu.name}"):
            result = search_plans(
                base.model, base.cluster, gbs, base.precision,
                SearchSpace(framework=framework, allow_tp_across_nodes=allow_tp_across_nodes),
                objective=objective, train_tokens=base.train_tokens,
                budget_usd=parse_usd(budget) if budget else None,
                deadline_s=parse_seconds(deadline) if deadline else None,
            )
    rows = search_rows(result, top)
    if output is OutputFormat.json:
        from paraplan.report.formats import render_json

        write_text(render_json({"plans": rows, "excluded": dict(result.excluded), "considered": result.considered}))
    elif output is OutputFormat.csv:
        from paraplan.report.formats import render_csv

        write_text(render_csv(rows))
    else:
        out.print(render_search(result, rows))
