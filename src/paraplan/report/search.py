"""Tables of a plan search: the ranked plans and the families of plans that were excluded."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table

from paraplan.search import SearchResult
from paraplan.units import format_seconds


def search_rows(result: SearchResult, top: int) -> list[dict[str, Any]]:
    rows = []
    for rank, pred in enumerate(result.ranked[:top], start=1):
        rows.append(
            {
                "rank": rank,
                "gpus": f"{pred.job.cluster.num_gpus} x {pred.job.cluster.gpu.name}",
                "cluster": pred.job.cluster.name,
                **pred.plan_dict(),
                "iteration_s": pred.iteration_s,
                "tokens_per_s": pred.tokens_per_s,
                "mfu": pred.mfu,
                "memory_per_gpu_bytes": pred.worst_memory.total,
                "usd_per_million_tokens": pred.usd_per_million_tokens,
                "time_to_train_s": pred.time_to_train_s,
                "cost_to_train_usd": pred.cost_to_train_usd,
            }
        )
    return rows


def render_search(result: SearchResult, rows: list[dict[str, Any]], title: str | None = None) -> Group:
    title = title or (
        f"Best plans by {result.objective} ({len(result.ranked)} timed exactly after the screen; "
        f"{result.considered} considered)"
    )
    table = Table(title=title, title_justify="left")
    for col in ("#", "GPUs", "tp", "pp", "dp", "cp", "sp", "mbs", "ZeRO", "recompute", "iter s", "tokens/s", "MFU", "GiB/GPU", "$/M tok", "to train", "cost"):
        table.add_column(col, justify="left" if col in ("recompute", "sp") else "right")
    for r in rows:
        usd = r["usd_per_million_tokens"]
        table.add_row(
            str(r["rank"]), r["gpus"], str(r["tp"]), str(r["pp"]), str(r["dp"]), str(r["cp"]),
            "on" if r["sequence_parallel"] else "off", str(r["micro_batch_size"]), str(r["zero_stage"]),
            r["recompute"], f"{r['iteration_s']:.2f}", f"{r['tokens_per_s']:,.0f}", f"{100 * r['mfu']:.1f} %",
            f"{r['memory_per_gpu_bytes'] / 2**30:.1f}", "-" if usd is None else f"${usd:.2f}",
            "-" if r["time_to_train_s"] is None else format_seconds(r["time_to_train_s"]),
            "-" if r["cost_to_train_usd"] is None else f"${r['cost_to_train_usd']:,.0f}",
        )
    if title is not None:
        return Group(table)
    why = Table(title="Excluded plans", title_justify="left")
    why.add_column("reason")
    why.add_column("plans", justify="right")
    for reason, count in result.excluded.most_common():
        why.add_row(reason, str(count))
    return Group(table, why)
