"""A profiler trace beside paraplan's prediction of its job: tables, records and a figure
(``paraplan validate trace``).

matplotlib is an optional extra (``paraplan[plot]``), imported inside the figure's function.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.text import Text

from paraplan.files.atomic import sweep_stale, temp_path
from paraplan.files.pictures import load_pyplot
from paraplan.report.layout import ReadableTable
from paraplan.report.tables import render_ignored_settings, render_placement_notes, render_uncalibrated
from paraplan.validate import RunValidation
from paraplan.validate.trace import PARTS

NOT_MEASURED = "n/a"  # a part the trace cannot measure (not the same as a measured 0)


def _err(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def _ms(seconds: float | None) -> str:
    return NOT_MEASURED if seconds is None else f"{seconds * 1e3:.2f}"


def trace_validation_record(r: RunValidation) -> dict[str, Any]:
    """The JSON form: the iteration measured and predicted, the error, every component."""
    return {
        "job": r.run_id,
        "gpu": r.gpu,
        "measured_iteration_s": r.measured_iteration_s,
        "predicted_iteration_s": r.prediction.iteration_s,
        "error": r.error,
        "components": component_rows(r),
        "warnings": list(r.warnings),
        "notes": list(r.notes),
        "uncalibrated": list(r.prediction.uncalibrated),
        "ignored_settings": list(r.prediction.ignored_settings),
        "placement_notes": list(r.prediction.placement_notes),
    }


def component_rows(r: RunValidation) -> list[dict[str, Any]]:
    """One row per stage and component (the CSV form): ``measured_s`` None where the trace
    cannot measure the part, ``error`` None where nothing was measured (None or 0)."""
    return [
        {"stage": c.stage, "component": c.component, "measured_s": c.measured_s, "predicted_s": c.predicted_s,
         "error": c.error}
        for c in r.components
    ]


def render_trace_validation(r: RunValidation) -> Group:
    summary = ReadableTable(f"{r.run_id}: measured (trace) vs predicted iteration, s")
    for col in ("measured", "predicted", "error"):
        summary.add_column(col, number=True)
    summary.add_row(f"{r.measured_iteration_s:.4f}", f"{r.prediction.iteration_s:.4f}", _err(r.error))
    table = ReadableTable("Per stage and component, ms per iteration (negative: predicted faster)")
    table.add_column("stage")
    table.add_column("component")
    for col in ("measured", "predicted", "error"):
        table.add_column(col, number=True)
    rows = r.components
    for i, c in enumerate(rows):
        last_of_stage = i + 1 < len(rows) and rows[i + 1].stage != c.stage
        style = "bold" if c.component in ("compute", "iteration") else None
        first_of_stage = i == 0 or rows[i - 1].stage != c.stage
        table.add_row(c.stage if first_of_stage else "", c.component, _ms(c.measured_s), _ms(c.predicted_s), _err(c.error),
                      end_section=last_of_stage, style=style)
    notes = [Text(f"note: {n}", style="dim") for n in r.notes]  # warnings: the command prints them
    notes += render_uncalibrated(r.prediction.uncalibrated)
    notes += render_ignored_settings(r.prediction.ignored_settings)
    notes += render_placement_notes(r.prediction.placement_notes)
    return Group(summary, table, *notes)


_PART_COLORS = {
    "gemm": "#4c72b0", "attention": "#8172b3", "norm": "#64b5cd", "elementwise": "#55a868",
    "fp8_cast": "#ccb974", "optimizer": "#937860", "other": "#b0b0b0", "embedding": "#edc948",
    "memory": "#7f7f00", "conv": "#2f4b7c",
    "tp comm": "#dd8452", "cp comm": "#f0b98d", "ep comm": "#da8bc3", "pp comm": "#c8a2c8",
    "dp comm": "#c44e52", "unknown comm": "#8c8c8c", "idle": "#eeeeee",
}


def figure_trace_validation(r: RunValidation):
    """Per stage two stacked bars, measured beside predicted: each part's share of its own
    iteration (the shares add up to 100 %), with the seconds each bar stands for above it."""
    plt = load_pyplot()
    stages = list(dict.fromkeys(c.stage for c in r.components))
    bars: list[tuple[str, str, dict[str, float]]] = []  # (stage, which, part -> seconds)
    for stage in stages:
        mine = [c for c in r.components if c.stage == stage and c.component in PARTS]
        bars.append((stage, "measured", {c.component: c.measured_s or 0.0 for c in mine}))
        bars.append((stage, "predicted", {c.component: c.predicted_s for c in mine}))
    used = [p for p in PARTS if any(values.get(p, 0.0) > 0 for _, _, values in bars)]
    fig, ax = plt.subplots(figsize=(max(7.5, 2.2 * len(bars) + 3.5), 5.6), layout="constrained")
    positions = [i + 0.5 * (i // 2) for i in range(len(bars))]  # a gap between stages
    for part in used:
        bottoms = [sum(v.get(p, 0.0) for p in used[: used.index(part)]) / max(sum(v.values()), 1e-30)
                   for _, _, v in bars]
        heights = [v.get(part, 0.0) / max(sum(v.values()), 1e-30) for _, _, v in bars]
        ax.bar(positions, [100 * h for h in heights], bottom=[100 * b for b in bottoms], width=0.8,
               label=part, color=_PART_COLORS.get(part, "#999999"), edgecolor="white", linewidth=0.5)
        for x, b, h in zip(positions, bottoms, heights, strict=True):
            if h >= 0.06:
                ax.text(x, 100 * (b + h / 2), f"{100 * h:.0f} %", ha="center", va="center", fontsize="small")
    for x, (_, _, values) in zip(positions, bars, strict=True):
        ax.text(x, 101.5, f"{sum(values.values()) * 1e3:.1f} ms", ha="center", va="bottom", fontsize="small")
    unmeasured = {stage: [c.component for c in r.components if c.stage == stage and c.measured_s is None]
                  for stage in stages}
    labels = [f"{which}\n{stage}" + (f"\n{NOT_MEASURED}: {', '.join(unmeasured[stage])}"
                                     if which == "measured" and unmeasured[stage] else "")
              for stage, which, _ in bars]
    ax.set_xticks(positions, labels, fontsize="small")
    ax.set_ylim(0, 110)
    ax.set_ylabel("share of the stage's iteration, %")
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title="part")
    ax.set_title(f"{r.run_id} on {r.gpu}\nwhere an iteration goes, measured (trace) beside predicted\n"
                 f"iteration {r.measured_iteration_s * 1e3:.1f} ms measured, {r.prediction.iteration_s * 1e3:.1f} ms "
                 f"predicted: error {_err(r.error)}", fontsize="medium")
    return fig


def render_trace_validation_plot(r: RunValidation, path: str | os.PathLike[str]) -> Path:
    """Write the figure to ``path`` (.png, .svg or .pdf): beside it first, then renamed over it,
    so that no reader sees half a picture. The caller checks the path first (``check_plot_path``)."""
    target = Path(path)
    fig = figure_trace_validation(r)
    sweep_stale(target)
    tmp = temp_path(target)
    try:
        fig.savefig(tmp, dpi=130, format=target.suffix.lstrip(".").lower())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
        load_pyplot().close(fig)
    return target
