"""Tables of a plan search: the ranked plans, the families of plans that were excluded, and
when nothing is left, which bound excluded everything and the plan nearest to it.

Tables fit the terminal without cutting a number or a name: at full width they are drawn as
they are; when that is too wide, in a compact style (abbreviated headers with a legend, plan
settings every row shares said once); then wrapped into blocks of columns, each repeating the
rank; and at last one plan per block of lines (:func:`fit_table`, usable by any table).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from paraplan.report.pareto import tokens_text
from paraplan.report.tables import render_uncalibrated
from paraplan.search import SearchResult
from paraplan.search.run import Closest
from paraplan.units import format_seconds


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
        "iteration_s": pred.iteration_s,
        "tokens_per_s": pred.tokens_per_s,
        "mfu": pred.mfu,
        "memory_per_gpu_bytes": pred.worst_memory.total,
        "usd_per_million_tokens": pred.usd_per_million_tokens,
        "time_to_train_s": pred.time_to_train_s,
        "cost_to_train_usd": pred.cost_to_train_usd,
        "uncalibrated": list(pred.uncalibrated),
    }


def _runs(values: list, sep: str = ", ") -> str:
    """Runs of equal values: [2, 2, 2, 11, 9] -> "2 (x3), 11, 9"."""
    out: list[list] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return sep.join(f"{v} (x{n})" if n > 1 else str(v) for v, n in out)


# --- fitting a table to the terminal ------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """One column: its header, its cell, and how it may shrink. ``short``: a shorter header
    (explained by ``legend``) for narrow terminals; ``compact``: a shorter cell; ``setting``:
    a plan setting, said once above the table when every row has the same value."""

    header: str
    cell: Callable[[dict], str]
    right: bool = True
    short: str | None = None
    legend: str | None = None
    compact: Callable[[dict], str] | None = None
    setting: bool = False


def _table(columns: Sequence[Column], rows: Sequence[dict], *, compact: bool, title: str | None = None) -> Table:
    if compact:
        table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, show_edge=False, title=title,
                      title_justify="left")
    else:
        table = Table(title=title, title_justify="left")
    for c in columns:
        header = (c.short or c.header) if compact else c.header
        table.add_column(header, justify="right" if c.right else "left", overflow="fold")
    for r in rows:
        table.add_row(*(((c.compact or c.cell) if compact else c.cell)(r) for c in columns))
    return table


def _width(table: Table) -> int:
    return Console(width=10_000).measure(table).maximum


def fit_table(title: str, columns: Sequence[Column], rows: Sequence[dict], width: int) -> list[RenderableType]:
    """The table of ``rows`` in at most ``width`` columns of text, no cell cut; the first
    column (the rank) is repeated in every block when the columns are wrapped."""
    full = _table(columns, rows, compact=False, title=title)
    if _width(full) <= width:
        return [full]
    out: list[RenderableType] = [Text(title)]
    shown = list(columns)
    if len(rows) > 1:  # settings every plan shares are said once
        same = [c for c in columns if c.setting and len({c.cell(r) for r in rows}) == 1]
        if same:
            out.append(Text("every plan: " + ", ".join(f"{c.header} {c.cell(rows[0])}" for c in same)))
            shown = [c for c in columns if c not in same]
    legend = [f"{c.short} = {c.legend}" for c in shown if c.short and c.legend]
    notes = [Text("columns: " + "; ".join(legend))] if legend else []
    table = _table(shown, rows, compact=True)
    if _width(table) <= width:
        return [*out, table, *notes]
    key, rest = shown[0], shown[1:]
    blocks: list[list[Column]] = []
    for c in rest:
        if blocks and _width(_table([key, *blocks[-1], c], rows, compact=True)) <= width:
            blocks[-1].append(c)
        else:
            blocks.append([c])
    if all(_width(_table([key, *b], rows, compact=True)) <= width for b in blocks):
        for i, b in enumerate(blocks):
            if i:
                out.append(Text(""))
            out.append(_table([key, *b], rows, compact=True))
        return [*out, *notes]
    return [*out, *_vertical(shown, rows)]


def _vertical(columns: Sequence[Column], rows: Sequence[dict]) -> list[RenderableType]:
    """One block of "header  value" lines per row, for terminals too narrow for any table."""
    out: list[RenderableType] = []
    for r in rows:
        table = Table(box=None, show_header=False, padding=(0, 1), pad_edge=False)
        table.add_column(overflow="fold")
        table.add_column(overflow="fold")
        for c in columns:
            table.add_row(c.header, c.cell(r))
        out += [Text(""), table]
    return out


# --- the search tables -------------------------------------------------------------------


def _usd(x: float) -> str:
    return f"${x:,.0f}" if x >= 100 else f"${x:,.2f}"


_RECOMPUTE_SHORT = {"none": "none", "selective": "sel", "full": "full"}


def plan_columns(rows: list[dict[str, Any]], several_configurations: bool) -> list[Column]:
    """The columns that say something for these rows."""
    columns = [Column("#", lambda r: str(r["rank"]))]
    if several_configurations or len({(r["cluster"], r["num_gpus"]) for r in rows}) > 1:
        columns += [Column("cluster", lambda r: r["cluster"], right=False),
                    Column("GPUs", lambda r: str(r["num_gpus"]))]
    columns += [
        Column("tp", lambda r: str(r["tp"]), setting=True),
        Column("pp", lambda r: str(r["pp"]), setting=True),
        Column("dp", lambda r: str(r["dp"]), setting=True),
        Column("cp", lambda r: str(r["cp"]), setting=True),
        Column("vpp", lambda r: str(r["vpp"]), setting=True),
        Column("sp", lambda r: "on" if r["sequence_parallel"] else "off", right=False, setting=True),
        Column("mbs", lambda r: str(r["micro_batch_size"]), setting=True),
    ]
    if len({r["global_batch_size"] for r in rows}) > 1:
        columns.append(Column("gbs", lambda r: str(r["global_batch_size"]), setting=True))
    columns += [
        Column("ZeRO", lambda r: str(r["zero_stage"]), short="Z", legend="ZeRO stage", setting=True),
        Column("recompute", lambda r: r["recompute"], right=False, short="rc",
               legend="recompute (sel = selective)", compact=lambda r: _RECOMPUTE_SHORT.get(r["recompute"], r["recompute"]),
               setting=True),
    ]
    if any(len(set(r["layers_per_stage"])) > 1 for r in rows):
        columns.append(Column("layers/stage", lambda r: _runs(r["layers_per_stage"]), right=False))
    if any("node_order" in r for r in rows):
        columns.append(Column("node order", lambda r: _runs(r.get("node_order", [])), right=False))
    columns += [
        Column("iter s", lambda r: f"{r['iteration_s']:.2f}"),
        Column("tokens/s", lambda r: f"{r['tokens_per_s']:,.0f}"),
        Column("MFU", lambda r: f"{100 * r['mfu']:.1f} %", compact=lambda r: f"{100 * r['mfu']:.1f}%"),
        Column("GiB/GPU", lambda r: f"{r['memory_per_gpu_bytes'] / 2**30:.1f}", short="GiB", legend="memory per GPU"),
    ]
    if any(r["usd_per_million_tokens"] is not None for r in rows):
        columns.append(Column("$/M tok", lambda r: _usd(r["usd_per_million_tokens"]), short="$/Mt",
                              legend="dollars per million tokens"))
    if any(r["time_to_train_s"] is not None for r in rows):
        columns.append(Column("to train", lambda r: format_seconds(r["time_to_train_s"]), short="time",
                              legend="time to train"))
    if any(r["cost_to_train_usd"] is not None for r in rows):
        columns.append(Column("cost", lambda r: _usd(r["cost_to_train_usd"])))
    return columns


def _clusters_note(result: SearchResult) -> list[Text]:
    configs = result.configurations
    if len(configs) <= 1:
        return []
    gpus = dict.fromkeys((c, g) for c, _, g in configs)
    return [Text("clusters: " + "; ".join(f"{c} = {g}" for c, g in gpus), overflow="fold")]


def render_plans(result: SearchResult, rows: list[dict[str, Any]], title: str, width: int) -> list[RenderableType]:
    """The plans of ``rows`` as a table fitted to ``width``, with their notes."""
    several = len(result.configurations) > 1
    out = fit_table(title, plan_columns(rows, several), rows, width)
    if several:
        out += _clusters_note(result)
    notes = render_uncalibrated(tuple(dict.fromkeys(n for r in rows for n in r["uncalibrated"])))
    return [*out, *notes]


def render_excluded(result: SearchResult) -> Table:
    why = Table(title="Excluded plans", title_justify="left")
    why.add_column("reason", overflow="fold")
    why.add_column("plans", justify="right", no_wrap=True)
    for reason, count in result.excluded.most_common():
        why.add_row(reason, f"{count:,}")
    return why


def render_search(result: SearchResult, rows: list[dict[str, Any]], title: str | None = None,
                  width: int = 200) -> Group:
    """The ranked plans (columns that say nothing for these rows are left out), then the
    excluded families; with ``title`` (e.g. the Pareto front) only the plans. Fitted to
    ``width`` columns of text."""
    plans_only = title is not None
    title = title or (
        f"Best plans by {result.objective} ({len(result.ranked):,} ranked, timed exactly after the screen; "
        f"{result.considered:,} considered)"
    )
    parts = render_plans(result, rows, title, width) if rows or plans_only else []
    if plans_only:
        return Group(*parts)
    return Group(*parts, render_excluded(result))


# --- nothing left ------------------------------------------------------------------------


def _bound_text(bound: str, need: float, limit: float, train_tokens: float | None) -> str:
    tokens = f" {tokens_text(train_tokens)} tokens" if train_tokens else ""
    if bound == "deadline":
        return f"needs {format_seconds(need)} to train{tokens}, the deadline is {format_seconds(limit)}"
    if bound == "budget":
        return f"costs {_usd(need)} to train{tokens}, the budget is {_usd(limit)}"
    return f"needs {need / 2**30:.1f} GiB per GPU, the GPU has {limit / 2**30:.0f} GiB"


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
    text += f" mbs{q.micro_batch_size} ZeRO-{q.zero_stage} recompute {q.recompute.value}"
    if pred.placement is not None:
        return f"{text} on {pred.placement.cluster}"
    return f"{text} on {pred.job.cluster.num_gpus} x {pred.gpu_name}"
