"""The summary of a collective sweep: per collective and group, the time of the smallest
call (the latency) and the bus bandwidth of the largest (nccl-tests' convention)."""

from __future__ import annotations

from typing import Any

from paraplan.costmodel.collectives import bus_factor
from paraplan.inventory import CollectiveKind
from paraplan.report.layout import ReadableTable
from paraplan.units import format_bytes

__all__ = ["comm_summary_rows", "render_comm_summary"]


def comm_summary_rows(frame: Any) -> list[dict[str, Any]]:
    """One row per (collective, nodes, GPUs per node) of a samples frame's collectives."""
    rows = []
    colls = frame[frame["kind"] == "collective"]
    for (name, nodes, per_node), group in colls.groupby(["name", "nodes", "gpus_per_node"], sort=False):
        group = group.sort_values("bytes")
        small, large = group.iloc[0], group.iloc[-1]
        n = int(nodes) * int(per_node)
        rows.append({
            "collective": str(name), "nodes": int(nodes), "gpus_per_node": int(per_node), "points": len(group),
            "smallest_bytes": int(small["bytes"]), "smallest_s": float(small["time_s"]),
            "largest_bytes": int(large["bytes"]), "largest_s": float(large["time_s"]),
            "largest_bus_bytes_per_s": bus_factor(CollectiveKind(name), n) * int(large["bytes"]) / float(large["time_s"]),
        })
    return rows


def render_comm_summary(rows: list[dict[str, Any]], title: str) -> ReadableTable:
    table = ReadableTable(title)
    table.add_column("collective")
    table.add_column("group", legend="nodes x ranks per node")
    table.add_column("smallest size", short="small", number=True)
    table.add_column("time at smallest", short="t small", number=True)
    table.add_column("largest size", short="large", number=True)
    table.add_column("time at largest", short="t large", number=True)
    table.add_column("bus bandwidth at largest", short="busbw", number=True)
    for r in rows:
        table.add_row(
            r["collective"], f"{r['nodes']}x{r['gpus_per_node']}",
            format_bytes(r["smallest_bytes"]), f"{r['smallest_s'] * 1e6:,.0f} us",
            format_bytes(r["largest_bytes"]), f"{r['largest_s'] * 1e3:,.2f} ms",
            f"{r['largest_bus_bytes_per_s'] / 1e9:,.2f} GB/s",
        )
    return table
