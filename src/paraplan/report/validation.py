"""Tables of measured vs predicted runs."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from paraplan.validate import RunValidation
from paraplan.validate.stats import ErrorStats, grouped_stats


def _err(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def validation_rows(results: list[RunValidation], *, components: bool) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        row: dict[str, Any] = {
            "run": r.run_id,
            "source": r.source,
            "gpu": r.gpu,
            "measured_iteration_s": r.measured_iteration_s,
            "predicted_iteration_s": r.prediction.iteration_s,
            "error": r.error,
            "gpumodeling25_error": r.their_error,
            "assumed": list(r.assumed),
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


def stats_rows(results: list[RunValidation]) -> list[ErrorStats]:
    """Per source, per GPU, then all runs together."""
    by_source = grouped_stats(results, lambda r: r.source)
    by_gpu = grouped_stats(results, lambda r: r.gpu)
    return [*by_source, *by_gpu, *grouped_stats(results, lambda r: "all runs")]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def render_stats(results: list[RunValidation]) -> Table:
    table = Table(
        title="Error per source and per GPU, % (negative: predicted faster than measured)",
        title_justify="left",
    )
    for col in ("group", "runs", "signed median", "median |err|", "p90 |err|", "worst"):
        table.add_column(col, justify="left" if col == "group" else "right", overflow="fold")
    for s in stats_rows(results):
        table.add_row(s.group, str(s.n), f"{100 * s.signed_median:+.1f}", _pct(s.median_abs), _pct(s.p90_abs),
                      f"{100 * s.worst:+.1f}")
    return table


def render_validation(results: list[RunValidation], *, components: bool = True) -> Group:
    summary = Table(
        title="Measured vs predicted iteration time, s (theirs: GPUModeling25's error)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    theirs = [abs(r.their_error) for r in results if r.their_error is not None]
    columns = ["run", "measured", "predicted", "error"] + (["theirs"] if theirs else [])
    for col in columns:
        summary.add_column(col, justify="left" if col == "run" else "right", overflow="fold")
    for r in results:
        cells = [r.run_id, f"{r.measured_iteration_s:.2f}", f"{r.prediction.iteration_s:.2f}", _err(r.error)]
        summary.add_row(*cells, *([_err(r.their_error)] if theirs else []))
    mean = [Text("mean |error|", style="bold"), "", "", f"{100 * mean_absolute_error(results):.1f} %"]
    summary.add_row(*mean, *([f"{100 * sum(theirs) / len(theirs):.1f} %"] if theirs else []))
    items: list[Any] = [summary, render_stats(results)]
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
