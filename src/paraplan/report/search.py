"""Tables of a plan search: the ranked plans, the families of plans that were excluded, and
when nothing is left, which bound excluded everything and the plan nearest to it.

The tables are :class:`~paraplan.report.layout.ReadableTable`: they fit the terminal without
cutting a number or a name (full; compact with abbreviated headers, a legend and the plan
settings every plan shares said once; blocks of columns each repeating the rank; one plan per
block of lines).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from paraplan.report.layout import Col, ReadableTable
from paraplan.report.pareto import tokens_text
from paraplan.report.tables import render_ignored_settings, render_placement_notes, render_uncalibrated
from paraplan.search import SearchResult
from paraplan.search.run import Closest
from paraplan.units import format_bytes, format_seconds


def search_rows(result: SearchResult, top: int | None = None, plans=None) -> list[dict[str, Any]]:
    """JSON-ready rows of ``plans`` (default: the best ``top`` ranked plans), numbered."""
    plans = result.ranked[:top] if plans is None else plans
    return [plan_row(pred, rank) for rank, pred in enumerate(plans, start=1)]


def plan_row(pred, rank: int) -> dict[str, Any]:
    placed = pred.placement is not None
    cluster = pred.job.cluster
    return {
        "rank": rank,
        "gpus": pred.gpu_name if placed else f"{cluster.num_gpus} x {pred.gpu_name}",
        "cluster": pred.placement.cluster if placed else cluster.name,
        "num_gpus": sum(n for _, n in pred.placement.gpus) if placed else cluster.num_gpus,
        "gpu": pred.gpu_name,
        **pred.plan_dict(),
        **_experts(pred),
        **_hybrid(pred),
        "iteration_s": pred.iteration_s,
        "tokens_per_s": pred.tokens_per_s,
        "mfu": pred.mfu,
        "memory_per_gpu_bytes": pred.worst_memory.total,
        "memory_margin_bytes": pred.memory.margin,
        "usd_per_million_tokens": pred.usd_per_million_tokens,
        "time_to_train_s": pred.time_to_train_s,
        "cost_to_train_usd": pred.cost_to_train_usd,
        "uncalibrated": list(pred.uncalibrated),
        "ignored_settings": list(pred.ignored_settings),
        "placement_notes": list(pred.placement_notes),
        # the framework preset's defaults this plan took (a search run with a preset)
        **({"framework_preset": pred.job.preset.to_dict()} if getattr(pred.job, "preset", None) else {}),
    }


def _experts(pred) -> dict[str, Any]:
    """A mixture of experts' expert-parallel sizes (nothing for a dense model)."""
    if not pred.job.model.is_moe:
        return {}
    q = pred.job.parallel
    return {"ep": q.ep, "etp": q.etp}


def _hybrid(pred) -> dict[str, Any]:
    """Hybrid sharding's shard group (FSDP HYBRID_SHARD; nothing when ZeRO shards over the whole
    data-parallel group)."""
    q = pred.job.parallel
    if q.data_parallel_shard_degree is None or q.zero_stage < 1 or q.zero_shards >= q.grad_group:
        return {}
    return {"data_parallel_shard_degree": q.zero_shards}


def _runs(values: list, sep: str = ", ") -> str:
    """Runs of equal values: [2, 2, 2, 11, 9] -> "2 (x3), 11, 9"."""
    out: list[list] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return sep.join(f"{v} (x{n})" if n > 1 else str(v) for v, n in out)


# --- the search tables -------------------------------------------------------------------


def _usd(x: float) -> str:
    return f"${x:,.0f}" if x >= 100 else f"${x:,.2f}"


_RECOMPUTE_SHORT = {"none": "none", "selective": "sel", "full": "full"}
_PLAIN_SCHEDULES = ("1f1b", "interleaved")  # said by the vpp column: no schedule column for them alone
_SCHEDULE_SHORT = {"interleaved": "intl"}

Cell = Callable[[dict], str]


def _setting(header: str, cell: Cell, **kwargs) -> tuple[Col, Cell]:
    return Col(header, setting=True, **kwargs), cell


def _number(header: str, cell: Cell, **kwargs) -> tuple[Col, Cell]:
    return Col(header, number=True, **kwargs), cell


def plan_columns(rows: list[dict[str, Any]], several_configurations: bool) -> list[tuple[Col, Cell]]:
    """The columns that say something for these rows, each with its cell."""
    columns = [_number("#", lambda r: str(r["rank"]))]
    if several_configurations or len({(r["cluster"], r["num_gpus"]) for r in rows}) > 1:
        columns += [(Col("cluster"), lambda r: r["cluster"]), _number("GPUs", lambda r: str(r["num_gpus"]))]
    columns += [
        _setting("tp", lambda r: str(r["tp"]), number=True),
        _setting("pp", lambda r: str(r["pp"]), number=True),
        _setting("dp", lambda r: str(r["dp"]), number=True),
        _setting("cp", lambda r: str(r["cp"]), number=True),
        _setting("vpp", lambda r: str(r["vpp"]), number=True),
        _setting("sp", lambda r: "on" if r["sequence_parallel"] else "off"),
        _setting("mbs", lambda r: str(r["micro_batch_size"]), number=True),
    ]
    if any("ep" in r for r in rows):
        columns.append(_setting("ep", lambda r: str(r.get("ep", 1)), number=True))
    if any(r.get("etp", r["tp"]) != r["tp"] for r in rows):
        columns.append(_setting("etp", lambda r: str(r.get("etp", r["tp"])), number=True))
    if any(r["schedule"] not in _PLAIN_SCHEDULES for r in rows):
        columns.append(_setting("schedule", lambda r: r["schedule"], short="sched", legend="pipeline schedule (intl = interleaved)",
                                compact=lambda text: _SCHEDULE_SHORT.get(text, text)))
    if len({r["global_batch_size"] for r in rows}) > 1:
        columns.append(_setting("gbs", lambda r: str(r["global_batch_size"]), number=True))
    columns += [
        _setting("ZeRO", lambda r: str(r["zero_stage"]), number=True, short="Z", legend="ZeRO stage"),
    ]
    if any("data_parallel_shard_degree" in r for r in rows):  # hybrid sharding (HSDP) tried
        columns.append(_setting("shard", lambda r: str(r.get("data_parallel_shard_degree", "all")), short="sh",
                                legend="dp ranks per ZeRO shard group (all: FULL_SHARD; fewer: HYBRID_SHARD)"))
    columns += [
        _setting("recompute", lambda r: r["recompute"], short="rc", legend="recompute (sel = selective)",
                 compact=lambda text: _RECOMPUTE_SHORT.get(text, text)),
    ]
    if any("offload_optimizer" in r for r in rows):  # ZeRO-Offload tried
        columns.append(_setting("offload", lambda r: r.get("offload_optimizer", "none"), short="off",
                                legend="optimizer offload"))
    if any(len(set(r["layers_per_stage"])) > 1 for r in rows):
        columns.append((Col("layers/stage", wrap=True), lambda r: _runs(r["layers_per_stage"])))
    if any("node_order" in r for r in rows):
        columns.append((Col("node order", wrap=True), lambda r: _runs(r.get("node_order", []))))
    columns += [
        _number("iter s", lambda r: f"{r['iteration_s']:.2f}"),
        *([_number(level, _iteration_range, legend=f"the iteration time's {level} interval (s)")]
          if (level := _interval_level(rows)) else []),
        _number("tokens/s", lambda r: f"{r['tokens_per_s']:,.0f}"),
        _number("MFU", lambda r: f"{100 * r['mfu']:.1f} %"),
        _number("GiB/GPU", lambda r: f"{r['memory_per_gpu_bytes'] / 2**30:.1f}", short="GiB", legend="memory per GPU"),
    ]
    if any(r["usd_per_million_tokens"] is not None for r in rows):
        columns.append(_number("$/M tok", lambda r: _usd(r["usd_per_million_tokens"]), short="$/Mt",
                               legend="dollars per million tokens"))
    if any(r["time_to_train_s"] is not None for r in rows):
        columns.append(_number("to train", lambda r: format_seconds(r["time_to_train_s"]), short="time",
                               legend="time to train"))
    if any(r["cost_to_train_usd"] is not None for r in rows):
        columns.append(_number("cost", lambda r: _usd(r["cost_to_train_usd"])))
    return columns


def _interval_level(rows: list[dict[str, Any]]) -> str | None:
    """``80 %``: the level of the rows' intervals, or None when they have none."""
    levels = {r["interval"]["level"] for r in rows if isinstance(r.get("interval"), dict)}
    return f"{100 * min(levels):g} %" if levels else None


def _iteration_range(row: dict[str, Any]) -> str:
    """The iteration time's interval of a plan's row (JSON form), three figures; '-' without one."""
    iv = row.get("interval")
    return "-" if not isinstance(iv, dict) else "-".join(f"{x:.3g}" for x in iv["iteration_s"])


def plans_table(title: str, rows: list[dict[str, Any]], several_configurations: bool) -> ReadableTable:
    """The plans of ``rows``, one per row, laid out at the width it is printed at."""
    columns = plan_columns(rows, several_configurations)
    table = ReadableTable(title, [col for col, _ in columns], shared="every plan")
    for r in rows:
        table.add_row(*(cell(r) for _, cell in columns))
    return table


def _clusters_note(result: SearchResult) -> list[Text]:
    configs = result.configurations
    if len(configs) <= 1:
        return []
    gpus = dict.fromkeys((c, g) for c, _, g in configs)
    return [Text("clusters: " + "; ".join(f"{c} = {g}" for c, g in gpus), overflow="fold")]


def render_plans(result: SearchResult, rows: list[dict[str, Any]], title: str) -> list[RenderableType]:
    """The plans of ``rows`` as a table, with their notes."""
    several = len(result.configurations) > 1
    out: list[RenderableType] = [plans_table(title, rows, several)]
    if several:
        out += _clusters_note(result)
    notes = render_uncalibrated(tuple(dict.fromkeys(n for r in rows for n in r["uncalibrated"])))
    notes += render_ignored_settings(tuple(dict.fromkeys(n for r in rows for n in r.get("ignored_settings", ()))))
    notes += render_placement_notes(tuple(dict.fromkeys(n for r in rows for n in r.get("placement_notes", ()))))
    return [*out, *notes]


def render_excluded(result: SearchResult) -> ReadableTable:
    why = ReadableTable("Excluded plans")
    why.add_column("reason", wrap=True)
    why.add_column("plans", number=True)
    for reason, count in result.excluded.most_common():
        why.add_row(reason, f"{count:,}")
    return why


def preset_summary(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the framework preset of a search did to its plans (None: no preset): the defaults
    they took (with the rule of a conditional one, e.g. "with tp > 1"), the fields
    the search varied where a plan's value is not the preset's, and what it records unmodelled."""
    from paraplan.catalog.presets import default_rule, find_preset

    uses = [r["framework_preset"] for r in rows if "framework_preset" in r]
    if not uses:
        return None
    preset = find_preset(uses[0]["preset"])
    every: dict[str, Any] = {}
    for use in uses:
        every.update(use["defaults_taken"])
    # the preset's order: its plan fields, then its model fields (an eager RMSNorm)
    taken = {d.field: every[d.field] for d in (*preset.defaults, *preset.model_defaults) if d.field in every}
    searched: dict[str, Any] = {}
    for use in uses:
        searched.update({k: v["preset"] for k, v in use["user_values_used"].items()})
    rules = {k: default_rule(preset, k) for k in taken if default_rule(preset, k)}
    return {"preset": preset.id, "label": preset.label, "engine": uses[0]["engine"], "defaults_taken": taken,
            "taken_where": rules,
            "searched": searched, "recorded_not_modelled": uses[0]["recorded_not_modelled"]}


def preset_lines(summary: dict[str, Any]) -> list[str]:
    """The preset summary in words, one line each (as ``PresetUse.lines`` for one prediction)."""
    from paraplan.specs.preset import shown

    s = summary
    out = [f"framework {s['preset']} ({s['label']}; modelled as {s['engine']})"]
    if s["defaults_taken"]:
        out.append("defaults taken from it: " + ", ".join(
            f"{k} {shown(v)}" + (f" ({s['taken_where'][k]})" if k in s["taken_where"] else "")
            for k, v in s["defaults_taken"].items()))
    if s["searched"]:
        out.append("searched or stated, not the preset's: " + ", ".join(
            f"{k} ({s['preset']} would set {shown(v)})" for k, v in s["searched"].items()))
    if s["recorded_not_modelled"]:
        out.append("recorded, not yet modelled: " + ", ".join(f"{k} {v}" for k, v in s["recorded_not_modelled"].items()))
    return out


def render_search(result: SearchResult, rows: list[dict[str, Any]], title: str | None = None) -> Group:
    """The ranked plans (columns that say nothing for these rows are left out), then the
    excluded families; with ``title`` (e.g. the Pareto front) only the plans."""
    plans_only = title is not None
    # the framework the plans were made for (a preset's name and its engine)
    frameworks = ", ".join(dict.fromkeys(
        f"{r['framework_preset']['preset']} on {r['framework']}" if "framework_preset" in r else r["framework"]
        for r in rows))
    title = title or (
        f"Best plans by {result.objective}{f' for {frameworks}' if frameworks else ''} ({len(result.ranked):,} "
        f"ranked, timed exactly after the screen; {result.considered:,} considered)"
    )
    parts = render_plans(result, rows, title) if rows or plans_only else []
    if plans_only:
        return Group(*parts)
    summary = preset_summary(rows)
    if summary is not None and parts:
        parts.insert(1, Text("\n".join(preset_lines(summary))))
    return Group(*parts, render_excluded(result))


# --- nothing left ------------------------------------------------------------------------


def _bound_text(bound: str, need: float, limit: float, train_tokens: float | None) -> str:
    tokens = f" {tokens_text(train_tokens)} tokens" if train_tokens else ""
    if bound == "deadline":
        return f"needs {format_seconds(need)} to train{tokens}, the deadline is {format_seconds(limit)}"
    if bound == "budget":
        return f"costs {_usd(need)} to train{tokens}, the budget is {_usd(limit)}"
    return f"needs {format_bytes(need)} per GPU, the GPU has {format_bytes(limit)} after the headroom"


_BOUND_NAMES = {"deadline": "the deadline", "budget": "the budget", "memory": "the GPU's memory"}


def no_plan_message(result: SearchResult) -> str:
    """One line: which bound excluded every plan, and by how much the nearest plan misses it."""
    closest: Closest | None = result.closest
    too_big = sum(n for r, n in result.excluded.items() if r.startswith("does not fit"))
    if closest is None:
        if too_big:  # node groups: no layer partition fits, so there is no plan to show
            return (f"no plan fits in the GPUs' memory ({too_big:,} plans need more with any layer partition); "
                    "try more GPUs, full recompute (--recompute full) or micro-batch 1 (--mbs 1)")
        reasons = "; ".join(f"{r} ({n:,})" for r, n in result.excluded.most_common(3))
        return (f"no plan passes the rules: all {result.considered:,} plans of the space are excluded ({reasons}); "
                "widen the space (--space full, other --tp/--pp/--mbs, more GPUs)")
    pred = closest.pred
    bounds = " and ".join(_BOUND_NAMES[b] for b in closest.over)
    if "memory" in closest.over:
        head = f"no plan fits in the GPU's memory ({too_big:,} plans need more)"
        hint = "; try " + ", ".join(_memory_hints(pred))
    else:
        missed = sum(n for r, n in result.excluded.items() if r in ("misses the deadline", "exceeds the budget"))
        head = f"no plan meets {bounds} ({missed:,} plans fit in memory and miss {'them' if len(closest.over) > 1 else 'it'})"
        hints = []
        if "deadline" in closest.over:
            hints.append("more or faster GPUs (--sizes, --clusters) or a later --deadline")
        if "budget" in closest.over:
            hints.append("cheaper GPUs (--clusters) or a larger --budget")
        hint = "; try " + ", or ".join(hints)
    detail = "; ".join(_bound_text(b, need, limit, pred.job.train_tokens) for b, (need, limit) in closest.over.items())
    return f"{head}; the nearest, {_plan_name(pred)}, {detail}{hint}"


def _memory_hints(pred) -> list[str]:
    """What would shrink the nearest plan, among what it does not use yet."""
    q = pred.job.parallel
    hints = ["more GPUs (--num-nodes, --sizes)"]
    if q.recompute.value != "full":
        hints.append("full recompute (--recompute full)")
    if q.zero_stage < 3 and q.grad_group > 1:
        hints.append("ZeRO-3 (--zero 3)")
    if q.micro_batch_size > 1:
        hints.append("micro-batch 1 (--mbs 1)")
    hints.append("a GPU with more memory (--clusters)")
    return hints


def _plan_name(pred) -> str:
    q = pred.job.parallel
    text = f"tp{q.tp} pp{q.pp} dp{q.dp}" + (f" cp{q.cp}" if q.cp > 1 else "") + (f" vpp{q.vpp}" if q.vpp > 1 else "")
    text += f" ep{q.ep}" if q.ep > 1 else ""
    text += f" mbs{q.micro_batch_size} ZeRO-{q.zero_stage} recompute {q.recompute.value}"
    if pred.placement is not None:
        return f"{text} on {pred.placement.cluster}"
    return f"{text} on {pred.job.cluster.num_gpus} x {pred.gpu_name}"
