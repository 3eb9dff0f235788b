"""`paraplan search`: the best parallel plans for a model on a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from paraplan.cli.common import (
    MODEL_FLAGS,
    QUEUED_KERNEL_GAP,
    OutputFormat,
    choices,
    cli_flag,
    err,
    out,
    takes_flags,
    user_errors,
    write_text,
)
from paraplan.cli.loading import cwd_paths, from_demo
from paraplan.specs import Precision

Opt = typer.Option

# the options of the search (as ``paraplan.search.request.SearchFlags`` names them); the
# command's own (what to show and write) are its parameters
SEARCH_FLAGS = (
    cli_flag("model", str | None, help="Catalog model name."),
    *MODEL_FLAGS,  # --seq-length, --hf-config
    cli_flag("cluster", str | None, help="Catalog cluster name or cluster file (node_groups: heterogeneous)."),
    cli_flag("gpu", str | None, help="Catalog GPU name (its reference node's links)."),
    cli_flag("num_gpus", int | None, help="GPUs in all (a multiple of the node size)."),
    cli_flag("num_nodes", int | None, help="Nodes."),
    cli_flag("global_batch_size", str | None,
             help="Global batch size in sequences; a list (512,1024,2048) ranks the plans of every size together "
                  "by tokens/s."),
    cli_flag("precision", str | None, help=choices(Precision)),
    cli_flag("price_per_gpu_hour", str | None, help="e.g. '2.5 USD'."),
    cli_flag("objective", str, default="time", help="time (highest tokens/s) | cost (lowest $ per token)"),
    cli_flag("train_tokens", str | None, help="Tokens to train, e.g. 2T."),
    cli_flag("memory_headroom", float | None, help="Share of each GPU's memory a plan must leave free, e.g. 0.05.",
             show_default="0.05, or the job file's"),
    cli_flag("budget", str | None, help="Dollar budget for train_tokens, e.g. 500000USD."),
    cli_flag("deadline", str | None, help="Deadline for train_tokens, e.g. 14d."),
    cli_flag("framework", str | None,
             help="megatron | deepspeed | fsdp: the search tries only what that framework runs "
                  "(fsdp: ZeRO-0 as DDP, ZeRO-3 whole-group and within a node; deepspeed: ZeRO 0-3, "
                  "0-1 with pp, 1F1B only). Or a framework preset (e.g. nemo-24.07, or nemo for its newest; "
                  "torchtitan; an unknown name lists them): its engine's space, with the preset's defaults "
                  "for what no flag varies (--zero, --recompute, --sp, --shard-nodes search those).",
             show_default="the job file's, else megatron"),
    cli_flag("space", str, default="default",
             help="default: tp, pp, micro-batch 1-8, the framework's ZeRO stages (megatron 0-1) and recompute "
                  "policies, sequence parallelism with tp. full: also cp 1-8, vpp 1-8, micro-batch 1-16, ZeRO 0-3 "
                  "(fsdp 0,3), sequence parallelism on and off, fsdp's zero-bubble schedules. "
                  "--tp ... --sp replace one axis of either."),
    cli_flag("tp", str | None, "--tp", help="Tensor-parallel sizes to try, e.g. 1,2,4,8.",
             show_default="powers of two within a node"),
    cli_flag("pp", str | None, "--pp", help="Pipeline-parallel sizes to try, e.g. 1,2,4,8.",
             show_default="divisors of the GPU count up to the layers"),
    cli_flag("cp", str | None, "--cp", help="Context-parallel sizes to try, e.g. 1,2,4.",
             show_default="1; full: 1,2,4,8"),
    cli_flag("vpp", str | None, "--vpp", help="Virtual stages per GPU (interleaved 1F1B) to try, e.g. 1,2,4.",
             show_default="1; full: 1,2,3,4,6,8"),
    cli_flag("micro_batch_size", str | None, "--micro-batch-size", "--mbs", help="Micro-batch sizes to try.",
             show_default="1,2,4,8; full: 1,2,4,8,16"),
    cli_flag("zero", str | None, "--zero", help="ZeRO stages to try (0-3; 1 = Megatron's distributed optimizer); "
             "a stage the framework does not run is counted out with its reason.",
             show_default="megatron 0,1 (full: 0-3); deepspeed 0-3; fsdp 0,3"),
    cli_flag("recompute", str | None, "--recompute",
             help="Recompute policies to try: none, selective, full (Megatron-LM, DeepSpeed); full, op, "
                  "layer (torchtitan / FSDP).",
             show_default="megatron, deepspeed: none,selective,full; fsdp: none,full,op"),
    cli_flag("sp", str | None, "--sp", help="Sequence parallelism: on (whenever tp > 1), off, or on,off (both).",
             show_default="on; full: on,off"),
    cli_flag("ep", str | None, "--ep", help="Expert-parallel sizes to try (mixtures of experts), e.g. 1,2,4,8.",
             show_default="every divisor of the experts; 1 for a dense model"),
    cli_flag("etp", str | None, "--etp", help="Expert tensor-parallel sizes to try, e.g. tp,1 (tp: as --tp).",
             show_default="tp; full: tp,1"),
    cli_flag("schedule", str | None, "--schedule",
             help="Pipeline schedules to try: 1f1b, interleaved (vpp from --vpp, else 2), gpipe, zb-h1, "
                  "zb-v (zero-bubble: --framework fsdp), e.g. 1f1b,interleaved,zb-h1,zb-v.",
             show_default="1f1b (interleaved with --vpp above 1)"),
    cli_flag("shard_nodes", str | None, "--shard-nodes",
             help="Hybrid sharding (FSDP HYBRID_SHARD) to try: all (ZeRO shards over the whole data-parallel "
                  "group) and/or nodes per shard group, replicated across, e.g. all,1,2.",
             show_default="fsdp: all,1; megatron, deepspeed: all"),
    cli_flag("offload", str | None, "--offload", help="Optimizer offload (ZeRO-Offload) to try: none, cpu, nvme, "
             "e.g. none,cpu for on and off.", show_default="none"),
    cli_flag("allow_tp_across_nodes", bool, "--allow-tp-across-nodes", default=False,
             help="Also try tensor parallelism across nodes."),
    cli_flag("uneven_layers", bool, "--uneven-layers", default=False,
             help="Let stages hold unequal layer counts (exact partition; always on for node groups)."),
    QUEUED_KERNEL_GAP,
    cli_flag("sizes", str | None, help="Cluster sizing: node counts to try, e.g. 4,8,16,32."),
    cli_flag("clusters", str | None, help="GPU/cluster types to compare, e.g. dgx-a100,dgx-h100."),
    cli_flag("pareto", Path | None, help="Write the Pareto chart (time against --pareto-axis) to this PNG."),
    cli_flag("pareto_axis", str | None,
             help="What the Pareto front trades time against: cost, or memory per GPU (on one cluster every plan "
                  "costs the same per second, so the time-cost front is the fastest plan alone).",
             show_default="cost with several sizes or clusters, else memory"),
    cli_flag("executor", str, default="serial",
             help="serial | processes (local cores) | ray (RAY_ADDRESS or a local Ray)."),
)


@takes_flags(SEARCH_FLAGS)
def search_command(
    job_file: Annotated[Path | None, typer.Argument(help="Job file whose model, cluster and batch to search for.")] = None,
    flags: dict[str, Any] | None = None,
    top: Annotated[int, Opt(help="How many plans to show.")] = 10,
    save_best: Annotated[Path | None, Opt(help="Write the best plan as a job file (for predict and export).")] = None,
    force: Annotated[bool, Opt("--force", help="Overwrite --save-best / --pareto files that exist.")] = False,
    output: Annotated[OutputFormat, Opt("--format", "-f", help="table | json | csv")] = OutputFormat.table,
    risk: Annotated[bool, Opt("--risk", help="Rank the exactly predicted plans by the pessimistic end of their "
                              "uncertainty interval (slowest tokens/s, or dearest $ per token with --objective cost), "
                              "and check --budget / --deadline at the interval's far end.")] = False,
    interval: Annotated[float, Opt("--interval", metavar="LEVEL", help=(
        "The level of each shortlisted plan's uncertainty interval (0 < LEVEL < 1), and of --risk's ranking. "
        "The search's intervals are the regime's alone, not widened for unstated settings (predict the plan "
        "for its full interval)."))] = 0.8,
) -> None:
    """Enumerate tp x pp x dp x cp x ep x schedule x vpp x micro-batch x ZeRO x recompute plans; prune by
    divisibility and memory (saying why), time the rest and rank them. Exit code 0 with
    plans, 1 when no plan is left (the bound that excluded them and the nearest plan are
    shown), 2 on bad input."""
    from paraplan.search.request import SearchFlags, SearchRequest
    from paraplan.specs import ConfigError

    flags = cwd_paths(flags or {})
    pareto = flags["pareto"]
    with user_errors():
        _check_outputs(save_best, pareto, force)  # before the work, not after
        if top < 1:
            raise ConfigError(f"--top: expected a positive whole number, got {top}")
        from paraplan.uncertainty import check_level

        check_level(interval)
        request = SearchRequest.from_flags(job_file, SearchFlags(**flags))
        for note in request.notes:
            err.print(note, highlight=False, soft_wrap=True)
        with err.status(f"searching plans for {request.model_name} on {request.num_configurations} "
                        "cluster configuration(s)"):
            result = request.run()
        result, intervals = with_intervals(result, interval, risk)
        front, axis = None, request.pareto_axis
        if pareto is not None and result.ranked:
            from paraplan.report.pareto import pareto_plans, plot_pareto
            from paraplan.uncertainty import interval_for

            front, to_train = pareto_plans(result, axis)
            plot_pareto(result, front, pareto, axis=axis, to_train=to_train,
                        intervals=[interval_for(p, interval) for p in front])
        if save_best is not None and result.ranked:
            _save_best(result, save_best)
    if request.demo is not None:
        taken = from_demo(request.demo, request.overrides, request.seq_length)
        if taken:
            err.print(f"from the demo job: {' '.join(taken)}", highlight=False, soft_wrap=True)
    with user_errors():  # a non-finite number is an internal error (exit 3), never output
        risk_notes = risk_notes_of(result, intervals, request, risk) if result.ranked else None
        _print(result, top, output, front, axis, save_best, pareto, intervals, risk_notes)
    if not result.ranked:
        from paraplan.report.search import no_plan_message

        unwritten = [str(p) for p in (save_best, pareto) if p is not None]
        tail = f" (nothing written to {', '.join(unwritten)})" if unwritten else ""
        message = no_plan_message(result)  # "no plan ...": which bound excluded everything, the nearest plan
        err.print(f"[bold red]{message[:7]}[/]{escape(message[7:] + tail)}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=1)


def with_intervals(result, level: float, risk: bool):
    """Each exactly predicted plan's interval at ``level`` (its regime's, not widened for
    unstated settings: that is a dozen predictions a plan); with ``risk``, the plans ranked by
    their interval's pessimistic end."""
    from dataclasses import replace

    from paraplan.uncertainty import interval_for
    from paraplan.uncertainty.risk import pessimistic_score

    pairs = [(p, interval_for(p, level)) for p in result.ranked]
    if risk:
        pairs.sort(key=lambda pair: pessimistic_score(*pair, result.objective))
        result = replace(result, ranked=[p for p, _ in pairs])
    return result, [iv for _, iv in pairs]


def risk_notes_of(result, intervals, request, risk: bool) -> dict:
    """What the intervals are and, with ``risk``, how the plans were ranked and whether the
    budget / deadline hold at the best plan's interval's far end: as lines for the table, and
    as data for JSON (each plan's own far-end checks go in its row)."""
    from paraplan.uncertainty.risk import far_end_checks
    from paraplan.units import format_seconds

    best, iv = result.ranked[0], intervals[0]
    regimes = sorted({i.regime.name for i in intervals})
    lines = [f"{iv.label} intervals ({'; '.join(regimes)}): {iv.rule}; not widened for the settings the job "
             "left unstated (predict a plan for its full interval)"]
    data: dict = {"level": iv.level, "widened_for_unstated_settings": False}
    if risk:
        end = "dearest $ per token" if result.objective == "cost" else "slowest tokens/s"
        low, high = iv.rate(best.tokens_per_s)
        lines.append(f"ranked by risk: the {end} of each plan's {iv.label} interval; the best plan: "
                     f"{low:,.0f}-{high:,.0f} tokens/s")
        data["ranked_by"] = f"the {end} of each plan's {iv.label} interval"
        search = request.searches[0]
        checks = []
        for bound, far, limit, holds in far_end_checks(best, iv, search.get("budget_usd"), search.get("deadline_s")):
            shown = (lambda x: format_seconds(x)) if bound == "deadline" else (lambda x: f"${x:,.0f}")
            verdict = "holds" if holds else "does NOT hold"
            lines.append(f"{bound} {shown(limit)}: {verdict} for the best plan at the {iv.label} interval's far end "
                         f"({shown(far)})")
            checks.append({"bound": bound, "limit": limit, "far_end": far, "holds": holds})
        data["best_plan_far_end"] = checks
        data["limits"] = {"budget_usd": search.get("budget_usd"), "deadline_s": search.get("deadline_s")}
    data["lines"] = lines
    return data


def _print(result, top, output, front, axis, save_best, pareto, intervals=None, risk_notes=None) -> None:
    from rich.console import Group
    from rich.text import Text

    from paraplan.report.search import plan_row, render_plans, render_search, search_rows

    rows = plan_rows(result, top, intervals, risk_notes, columns=output is OutputFormat.csv)
    closest = result.closest
    if output is OutputFormat.json:
        from paraplan.report.formats import render_json

        write_text(render_json(search_data(result, rows, front, axis, risk_notes)))
    elif output is OutputFormat.csv:
        from paraplan.report.formats import render_csv

        write_text(render_csv(rows) if rows else "")
    else:
        out.print(render_search(result, rows))
        for line in (risk_notes or {}).get("lines", ()):
            out.print(Text(line), soft_wrap=False)
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


def plan_rows(result, top: int, intervals=None, risk_notes: dict | None = None, columns: bool = False) -> list[dict]:
    """The best ``top`` plans' rows, each with its interval (nested; ``columns``: CSV's
    interval.*_low/_high) and, with ``--risk``'s limits, whether its budget / deadline hold at
    its interval's far end (``paraplan search``'s rows; the web page shows the same)."""
    from paraplan.report.search import search_rows

    rows = search_rows(result, top)
    if intervals is not None:
        from paraplan.uncertainty.risk import far_end_checks

        limits = (risk_notes or {}).get("limits")
        for row, pred, iv in zip(rows, result.ranked, intervals, strict=False):
            row["interval"] = iv.to_columns(pred) if columns else iv.to_dict(pred)
            if limits:  # --risk: whether this plan's budget / deadline hold at its interval's far end
                for bound, far, _, holds in far_end_checks(pred, iv, limits["budget_usd"], limits["deadline_s"]):
                    row[f"{bound}_far_end"], row[f"{bound}_holds_at_far_end"] = far, holds
    return rows


def search_data(result, rows: list[dict], front, axis: str | None, risk_notes: dict | None = None) -> dict:
    """What ``paraplan search --format json`` prints (the web page exchanges the same): the
    ranked ``rows``, what was excluded and why, the intervals' rule and ``--risk`` checks, the
    Pareto ``front`` against ``axis`` when asked for, and with no plan the message and the
    nearest plan."""
    from paraplan.report.search import no_plan_message, plan_row, preset_summary, search_rows

    data: dict = {"plans": rows, "excluded": dict(result.excluded), "considered": result.considered}
    if risk_notes:
        data["interval"] = {k: v for k, v in risk_notes.items() if k != "limits"}
    summary = preset_summary(rows)
    if summary is not None:  # the framework preset's defaults the plans took (each plan's own in its row)
        data["framework_preset"] = summary
    if front is not None:
        data["pareto"] = search_rows(result, plans=front)
        data["pareto_axis"] = axis
    if not result.ranked:
        closest = result.closest
        data["no_plan"] = no_plan_message(result)
        data["closest"] = None if closest is None else {
            **plan_row(closest.pred, 0),
            "misses": {b: {"needed": need, "limit": limit} for b, (need, limit) in closest.over.items()},
        }
    return data


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
