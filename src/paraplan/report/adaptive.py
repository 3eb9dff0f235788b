"""What `paraplan profile adaptive` shows: per regressor, shapes measured and the held-out error."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.text import Text

from paraplan.report.layout import ReadableTable

__all__ = ["adaptive_record", "render_adaptive"]


def adaptive_record(runs: list[Any], measured: int, skipped: int, rows: int, target: float, out: Path) -> dict:
    """The adaptive sweep as plain data (JSON output, and what :func:`render_adaptive` prints)."""
    regressors = [
        {"regressor": r.key, "measured": r.n_samples, "skipped": len(r.skipped), "reached": r.reached,
         "median_error": r.stop_error if math.isfinite(r.stop_error) else None, "error_on": "out-of-bag" if r.stop == "oob" else "held-out",
         "stop": r.stop_reason}
        for r in runs if r is not None
    ]
    summary = {"out": str(out), "rows": rows, "measured_now": measured, "skipped_now": skipped,
               "target_error": target, "whole_pools": sum(r is None for r in runs)}
    return {"summary": summary, "regressors": regressors}


def render_adaptive(record: dict[str, Any]) -> Group:
    s = record["summary"]
    items: list[Any] = [
        Text(f"{s['rows']} samples written to {s['out']}", style="bold"),
        Text(f"points: {s['measured_now']} measured now, {s['skipped_now']} skipped now; "
             f"{s['whole_pools']} pools too small for the loop were measured whole"),
    ]
    if record["regressors"]:
        on = " or ".join(dict.fromkeys(r["error_on"] for r in record["regressors"]))
        table = ReadableTable(f"{on} median |error| per regressor (target {100 * s['target_error']:g} %)")
        table.add_column("regressor")
        table.add_column("shapes", number=True)
        table.add_column("error %", number=True)
        table.add_column("stopped", wrap=True)
        for r in record["regressors"]:
            error = "-" if r["median_error"] is None else f"{100 * r['median_error']:.1f}"
            table.add_row(r["regressor"], str(r["measured"]), error, r["stop"])
        items.append(table)
    return Group(*items)
