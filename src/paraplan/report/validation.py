"""Tables of measured vs predicted runs."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from paraplan.validate import RunValidation


def _err(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def validation_rows(results: list[RunValidation], *, components: bool) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        row: dict[str, Any] = {
            "run": r.run_id,
            "measured_iteration_s": r.measured_iteration_s,
            "predicted_iteration_s": r.prediction.iteration_s,
            "error": r.error,
            "gpumodeling25_error": r.their_error,
        }
        if components:
            row["components"] = [
                {
                    "component": c.component,
                    "stage": c.stage,
                    "measured_s": c.measured_s,
                    "predicted_s": c.predicted_s,
                    "error": c.error,
                }
                for c in r.components
            ]
        rows.append(row)
    return rows


def mean_absolute_error(results: list[RunValidation]) -> float:
    return sum(abs(r.error) for r in results) / len(results)


def render_validation(results: list[RunValidation], *, components: bool = True) -> Group:
    summary = Table(title="Measured vs predicted iteration time", title_justify="left")
    for col in ("run", "measured s", "predicted s", "error", "GPUModeling25 error"):
        summary.add_column(col, justify="left" if col == "run" else "right")
    for r in results:
        summary.add_row(
            r.run_id,
            f"{r.measured_iteration_s:.2f}",
            f"{r.prediction.iteration_s:.2f}",
            _err(r.error),
            _err(r.their_error),
        )
    theirs = [abs(r.their_error) for r in results if r.their_error is not None]
    summary.add_row(
        Text("mean |error|", style="bold"),
        "",
        "",
        f"{100 * mean_absolute_error(results):.1f} %",
        f"{100 * sum(theirs) / len(theirs):.1f} %" if theirs else "-",
    )
    items: list[Any] = [summary]
    if components:
        for r in results:
            if not r.components:
                continue
            table = Table(title=f"{r.run_id}: components of the fastest iteration", title_justify="left")
            for col in ("component", "stage", "measured ms", "predicted ms", "error"):
                table.add_column(col, justify="left" if col in ("component", "stage") else "right")
            for c in r.components:
                table.add_row(c.component, c.stage, f"{c.measured_s * 1e3:.2f}", f"{c.predicted_s * 1e3:.2f}", _err(c.error))
            items.append(table)
    return Group(*items)
