"""Tables of a plan search: the ranked plans and the families of plans that were excluded."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table

from paraplan.report.tables import render_uncalibrated
from paraplan.search import SearchResult
from paraplan.units import format_seconds


def search_rows(result: SearchResult, top: int) -> list[dict[str, Any]]:
    rows = []
    for rank, pred in enumerate(result.ranked[:top], start=1):
        rows.append(
            {
                "rank": rank,
                "gpus": pred.gpu_name if pred.placement else f"{pred.job.cluster.num_gpus} x {pred.gpu_name}",
                "cluster": pred.placement.cluster if pred.placement else pred.job.cluster.name,
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
        )
    return rows


def _runs(values: list, sep: str = ", ") -> str:
    """Runs of equal values: [2, 2, 2, 11, 9] -> "2 (x3), 11, 9"."""
    out: list[list] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return sep.join(f"{v} (x{n})" if n > 1 else str(v) for v, n in out)


def render_search(result: SearchResult, rows: list[dict[str, Any]], title: str | None = None) -> Group:
    """The ranked plans (columns that say nothing for these rows are left out), then the
    excluded families; with ``title`` (e.g. the Pareto front) only the plans."""
    plans_only = title is not None
    title = title or (
        f"Best plans by {result.objective} ({len(result.ranked)} timed exactly after the screen; "
        f"{result.considered} considered)"
    )
    columns: list[tuple[str, Any]] = [("#", lambda r: str(r["rank"]))]
    if len({r["gpus"] for r in rows}) > 1:
        columns.append(("GPUs", lambda r: r["gpus"]))
    columns += [
        ("tp", lambda r: str(r["tp"])),
        ("pp", lambda r: str(r["pp"])),
        ("dp", lambda r: str(r["dp"])),
        ("cp", lambda r: str(r["cp"])),
        ("vpp", lambda r: str(r["vpp"])),
        ("sp", lambda r: "on" if r["sequence_parallel"] else "off"),
        ("mbs", lambda r: str(r["micro_batch_size"])),
        ("ZeRO", lambda r: str(r["zero_stage"])),
        ("recompute", lambda r: r["recompute"]),
    ]
    if any(len(set(r["layers_per_stage"])) > 1 for r in rows):
        columns.append(("layers/stage", lambda r: _runs(r["layers_per_stage"])))
    if any("node_order" in r for r in rows):
        columns.append(("node order", lambda r: _runs(r.get("node_order", []))))
    columns += [
        ("iter s", lambda r: f"{r['iteration_s']:.2f}"),
        ("tokens/s", lambda r: f"{r['tokens_per_s']:,.0f}"),
        ("MFU", lambda r: f"{100 * r['mfu']:.1f} %"),
        ("GiB/GPU", lambda r: f"{r['memory_per_gpu_bytes'] / 2**30:.1f}"),
    ]
    if any(r["usd_per_million_tokens"] is not None for r in rows):
        columns.append(("$/M tok", lambda r: f"${r['usd_per_million_tokens']:.2f}"))
    if any(r["time_to_train_s"] is not None for r in rows):
        columns.append(("to train", lambda r: format_seconds(r["time_to_train_s"])))
    if any(r["cost_to_train_usd"] is not None for r in rows):
        columns.append(("cost", lambda r: f"${r['cost_to_train_usd']:,.0f}"))
    table = Table(title=title, title_justify="left")
    for name, _ in columns:
        table.add_column(name, justify="left" if name in ("recompute", "sp", "GPUs", "layers/stage", "node order") else "right")
    for r in rows:
        table.add_row(*(cell(r) for _, cell in columns))
    notes = render_uncalibrated(tuple(dict.fromkeys(n for r in rows for n in r["uncalibrated"])))
    if plans_only:
        return Group(table, *notes)
    why = Table(title="Excluded plans", title_justify="left")
    why.add_column("reason")
    why.add_column("plans", justify="right")
    for reason, count in result.excluded.most_common():
        why.add_row(reason, str(count))
    return Group(table, *notes, why)
