"""Tables of measured vs predicted runs."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text

from paraplan.report.layout import ReadableTable
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


def render_stats(results: list[RunValidation]) -> ReadableTable:
    table = ReadableTable("Error per source and per GPU, % (negative: predicted faster than measured)")
    table.add_column("group")
    for col, short in (("runs", None), ("signed median", "signed"), ("median |err|", None), ("p90 |err|", None),
                       ("worst", None)):
        table.add_column(col, short=short, number=True)
    for s in stats_rows(results):
        table.add_row(s.group, str(s.n), f"{100 * s.signed_median:+.1f}", _pct(s.median_abs), _pct(s.p90_abs),
                      f"{100 * s.worst:+.1f}")
    return table


def render_validation(results: list[RunValidation], *, components: bool = True) -> Group:
    theirs = [abs(r.their_error) for r in results if r.their_error is not None]
    summary = ReadableTable(
        "Measured vs predicted iteration time, s" + (" (theirs: GPUModeling25's error)" if theirs else "")
    )
    summary.add_column("run")
    for col in ["measured", "predicted", "error"] + (["theirs"] if theirs else []):
        summary.add_column(col, number=True)
    for r in results:
        cells = [r.run_id, f"{r.measured_iteration_s:.2f}", f"{r.prediction.iteration_s:.2f}", _err(r.error)]
        summary.add_row(*cells, *([_err(r.their_error)] if theirs else []), end_section=r is results[-1])
    mean = [Text("mean |error|", style="bold"), "", "", f"{100 * mean_absolute_error(results):.1f} %"]
    summary.add_row(*mean, *([f"{100 * sum(theirs) / len(theirs):.1f} %"] if theirs else []))
    items: list[Any] = [summary, render_stats(results)]
    if components:
        for r in results:
            if not r.components:
                continue
            table = ReadableTable(f"{r.run_id}: components of the fastest iteration")
            table.add_column("component")
            table.add_column("stage")
            for col in ("measured ms", "predicted ms", "error"):
                table.add_column(col, number=True)
            for c in r.components:
                table.add_row(c.component, c.stage, f"{c.measured_s * 1e3:.2f}", f"{c.predicted_s * 1e3:.2f}", _err(c.error))
            items.append(table)
    return Group(*items)
