"""What `paraplan profile ops` shows at the end: points measured, skipped (why), time taken."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.text import Text

from paraplan.report.layout import ReadableTable

__all__ = ["render_sweep", "sweep_record"]


def sweep_record(result: Any, store: Any, meta: dict[str, Any], out: Path) -> dict[str, Any]:
    """The sweep as plain data (JSON output, and what :func:`render_sweep` prints)."""
    rows = store.rows()
    per_op: dict[tuple[str, str], dict[str, list[float]]] = {}
    for row in rows:
        per_op.setdefault((row["name"], row["dtype"]), {}).setdefault(row["phase"], []).append(row["time_s"])
    ops = [{"operator": name, "dtype": dtype, "points": len(t.get("fwd", [])),
            "median_fwd_s": statistics.median(t["fwd"]) if t.get("fwd") else None,
            "median_bwd_s": statistics.median(t["bwd"]) if t.get("bwd") else None}
           for (name, dtype), t in sorted(per_op.items())]
    work = result.measured + result.skipped
    summary = {
        "out": str(out), "journal": str(store.path), "device": meta.get("device_name", ""),
        "points": len(store.done_keys()), "measured_now": result.measured, "skipped_now": result.skipped,
        "resumed": result.resumed, "rows": len(rows), "wall_s": result.wall_s,
        "s_per_point": result.wall_s / work if work else None,
        "median_spread": (meta.get("spread") or {}).get("median_spread"),
    }
    skipped = [{"reason": reason, "points": n} for reason, n in store.skipped().items()]
    return {"summary": summary, "operators": ops, "skipped": skipped}


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:,.1f}"


def render_sweep(record: dict[str, Any]) -> Group:
    s = record["summary"]
    per_point = "" if s["s_per_point"] is None else f", {s['s_per_point']:.3f} s per point"
    spread = "" if s["median_spread"] is None else f"; median spread (IQR/median) {100 * s['median_spread']:.1f} %"
    items: list[Any] = [
        Text(f"{s['rows']} samples of {s['device']} written to {s['out']}", style="bold"),
        Text(f"points: {s['measured_now']} measured now, {s['resumed']} from the journal, {s['skipped_now']} "
             f"skipped now; {s['wall_s']:.1f} s{per_point}{spread}"),
    ]
    if record["operators"]:
        table = ReadableTable("median time per operator (us)")
        table.add_column("operator")
        table.add_column("dtype")
        for col in ("points", "fwd us", "bwd us"):
            table.add_column(col, number=True)
        for op in record["operators"]:
            table.add_row(op["operator"], op["dtype"], str(op["points"]), _us(op["median_fwd_s"]),
                          _us(op["median_bwd_s"]))
        items.append(table)
    if record["skipped"]:
        table = ReadableTable("skipped points (recorded in the journal; not measured again)")
        table.add_column("points", number=True)
        table.add_column("reason", wrap=True)
        for skip in record["skipped"]:
            table.add_row(str(skip["points"]), skip["reason"])
        items.append(table)
    return Group(*items)
