"""Pictures of one prediction: the breakdown per pipeline stage, the pipeline schedule as a
Gantt chart, and memory per stage (``paraplan predict --plot``, ``paraplan report``).

matplotlib is an optional extra (``paraplan[plot]``), imported inside the functions.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TYPE_CHECKING

from paraplan.files.pictures import check_plot_path, load_pyplot
from paraplan.prediction import Prediction
from paraplan.prediction.memory_parts import memory_parts_of
from paraplan.report.stagebars import COMPONENTS, DP_LABEL, stage_bars, timeline_bars
from paraplan.specs import ConfigError
from paraplan.units import format_micro_batches

if TYPE_CHECKING:
    from paraplan.uncertainty import Interval

#: The pictures ``render_plot`` draws; ``plot_kind_for`` finds one in a file name.
PLOT_KINDS = ("breakdown", "timeline", "memory")

# one colour per breakdown component (``prediction.components``), by field
_COMPONENT_COLORS = {
    "forward_compute_s": "#4c72b0",
    "backward_compute_s": "#dd8452",
    "recompute_s": "#c8a2c8",
    "tp_communication_s": "#55a868",
    "cp_communication_s": "#a3d3ae",
    "ep_communication_s": "#da8bc3",
    "dp_communication_s": "#c44e52",
    "pipeline_p2p_s": "#8172b3",
    "offload_s": "#ccb974",
    "host_wait_s": "#8c8c8c",
    "optimizer_step_s": "#937860",
    "pipeline_bubble_s": "#e5e5e5",
}
_TASK_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "weight": "#55a868",
                DP_LABEL: _COMPONENT_COLORS["dp_communication_s"], "optimizer": _COMPONENT_COLORS["optimizer_step_s"]}
# interleaved and V schedules: the stage's later chunks
_LATER_CHUNK = {"forward": "#8fb0dc", "backward": "#f0b98d", "weight": "#a3d3ae"}
# one colour per memory part (``prediction.memory_parts``), by field
_MEMORY_COLORS = {
    "weights": "#4c72b0",
    "gradients": "#dd8452",
    "optimizer_states": "#55a868",
    "workspaces": "#64b5cd",
    "activations": "#c44e52",
    "logits": "#da8bc3",
    "gathered_params": "#8172b3",
    "buffers": "#937860",
    "fragmentation": "#ccb974",
    "runtime": "#8c8c8c",
}


def plot_kind_for(path: str | os.PathLike[str], kind: str | None = None) -> str | None:
    """The picture a ``--plot`` file asks for: ``kind`` when given, else the one kind its file
    name contains (``breakdown.png``, ``llama-timeline.svg``); None when it names none (then
    every kind is drawn, ``plot_files``)."""
    if kind is not None:
        if kind not in PLOT_KINDS:
            raise ConfigError(f"--plot-kind: unknown kind {kind!r} (available: {', '.join(PLOT_KINDS)})")
        return kind
    named = [k for k in PLOT_KINDS if k in Path(path).stem.lower()]
    if len(named) > 1:
        raise ConfigError(
            f"--plot {path}: the file name names {' and '.join(named)}; name one plot kind "
            f"({', '.join(PLOT_KINDS)}) or pass --plot-kind"
        )
    return named[0] if named else None


def plot_files(path: Path, kind: str | None = None) -> list[tuple[Path, str]]:
    """The (file, kind) pictures one ``--plot`` asks for: the kind its name or ``kind`` names,
    or, when it names none, every kind beside it (out.png -> out-breakdown.png, out-timeline.png,
    out-memory.png)."""
    chosen = plot_kind_for(path, kind)
    if chosen is not None:
        return [(path, chosen)]
    return [(path.with_name(f"{path.stem}-{k}{path.suffix}"), k) for k in PLOT_KINDS]


def check_plots(
    paths: list[Path], kind: str | None = None, *, overwrite: bool = False
) -> list[tuple[Path, str]]:
    """(path, kind) of each picture the ``--plot`` files ask for (``plot_files``), checked before
    any work: a usable .png/.svg/.pdf path not already there unless ``overwrite``, and
    matplotlib installed (``check_plot_path``)."""
    if kind is not None and len(paths) > 1:
        raise ConfigError("--plot-kind: names the kind of one --plot file; name the kind in each file name instead")
    if len({p.resolve() for p in paths}) != len(paths):
        raise ConfigError("--plot: the same file is named twice")
    planned = [pair for path in paths for pair in plot_files(path, kind)]
    if len({p.resolve() for p, _ in planned}) != len(planned):
        raise ConfigError("--plot: two pictures would go to the same file (" + ", ".join(str(p) for p, _ in planned) + ")")
    for path, _ in planned:
        check_plot_path(path, overwrite=overwrite, flag="--force")
    return planned


def gpus_label(pred: Prediction) -> str:
    """"32 x H100-SXM5-80GB", or the node groups of a heterogeneous cluster."""
    if pred.placement is not None:
        return pred.gpu_name
    return f"{pred.job.cluster.num_gpus} x {pred.gpu_name}"


def _title(pred: Prediction) -> str:
    plan = pred.job.parallel
    degrees = f"tp={plan.tp} pp={plan.pp} dp={plan.dp}" + (f" cp={plan.cp}" if plan.cp > 1 else "")
    degrees += f" vpp={plan.vpp}" if plan.vpp > 1 else ""
    return (
        f"{pred.job.model.name} on {gpus_label(pred)}, {degrees}, "
        f"{format_micro_batches(plan.num_microbatches)}, {plan.schedule.value}"
    )


def _stage_ticks(ax, stages: list[int], critical: int | None) -> None:
    """"stage 3" under each bar; past eight stages just the number, the axis says what it is."""
    if len(stages) <= 8:
        labels = [f"stage {s}\n(critical)" if s == critical else f"stage {s}" for s in stages]
        ax.set_xticks(range(len(stages)), labels, fontsize="small")
        return
    ax.set_xticks(range(len(stages)), [str(s) for s in stages], fontsize="small")
    ax.set_xlabel("pipeline stage" + (f" (critical: {critical})" if critical is not None else ""))


def _pct(share: float) -> str:
    return f"{100 * share:.1f} %" if share >= 1e-3 or share == 0 else f"{100 * share:.2g} %"


def _seconds_unit(seconds: float) -> tuple[float, str]:
    return (1e3, "ms") if seconds < 1.0 else (1.0, "s")


def _few_bars(ax, n: int) -> None:
    """Keep one or two bars as narrow as three would be."""
    pad = max(0.0, (3 - n) / 2)
    ax.set_xlim(-0.6 - pad, n - 0.4 + pad)


def _interval_words(interval: Interval | None, seconds: float, scale: float, unit: str) -> str:
    """`` (80 %: 16.9-21.9 s)``, or nothing without an interval."""
    if interval is None:
        return ""
    low, high = interval.time(seconds)
    return f" ({interval.label}: {low * scale:.3g}-{high * scale:.3g} {unit})"


def figure_breakdown(pred: Prediction, interval: Interval | None = None):
    """A stacked bar per pipeline stage (``stage_bars``); the critical stage's adds up to the
    iteration time, drawn as a dashed line; with ``interval``, its bounds as a shaded band."""
    plt = load_pyplot()
    bars = stage_bars(pred)
    scale, unit = _seconds_unit(pred.iteration_s)
    width = min(16.0, 9.0 + 0.45 * len(bars))
    fig, ax = plt.subplots(figsize=(width, 5.2), layout="constrained")
    x = range(len(bars))
    bottom = [0.0] * len(bars)
    (crit,) = [b for b in bars if b.critical]
    for k, component in enumerate(COMPONENTS):
        heights = [b.seconds[k] * scale for b in bars]
        if not any(heights):
            continue
        # the legend carries the critical stage's figures: thin slices stay readable
        label = f"{component.label}: {crit.seconds[k] * scale:.3g} {unit} ({_pct(crit.seconds[k] / crit.total_s)})"
        ax.bar(x, heights, bottom=bottom, width=0.7, label=label, color=_COMPONENT_COLORS[component.field],
               edgecolor="white", linewidth=0.5)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.axhline(pred.iteration_s * scale, color="black", linestyle="--", linewidth=1)
    top = pred.iteration_s * scale
    if interval is not None:  # where the measured iteration falls, at the interval's level
        low, high = (x * scale for x in interval.time(pred.iteration_s))
        ax.axhspan(low, high, facecolor="none", edgecolor="0.55", hatch="///", linewidth=0, zorder=0.5)
        top = max(top, high)
    ax.annotate(f"iteration {pred.iteration_s * scale:.4g} {unit}"
                + _interval_words(interval, pred.iteration_s, scale, unit).replace(" (", "\n(hatched: ", 1),
                (1.0, pred.iteration_s * scale),
                xycoords=("axes fraction", "data"), xytext=(-4, 4), textcoords="offset points",
                ha="right", va="bottom", fontsize="small",
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.5} if interval is not None else None)
    _stage_ticks(ax, [b.stage for b in bars], crit.stage)
    ax.set_ylabel(f"seconds of one iteration ({unit})")
    ax.set_ylim(0, top * 1.08)
    _few_bars(ax, len(bars))
    fig.suptitle("Where one iteration goes, per pipeline stage\n" + _title(pred), fontsize="medium")
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
              frameon=False, title=f"critical stage {crit.stage}", title_fontsize="small", alignment="left")
    return fig


def _timeline_windows(pred: Prediction, end: float) -> list[tuple[float, float]]:
    """The time ranges the Gantt chart shows: the whole iteration, or, when it holds too many
    micro-batches to see one, its start and its end (where the bubbles are), side by side."""
    plan = pred.job.parallel
    m, pp = plan.num_microbatches, len(pred.stages)
    share = 1.5 * pp / m  # about three micro-batches per stage of warm-up and of cool-down
    if m * plan.vpp <= 40 or share >= 0.4:
        return [(0.0, end * 1.01)]
    return [(0.0, end * share), (end * (1 - share), end * (1 + 0.02 * share))]


def figure_timeline(pred: Prediction, interval: Interval | None = None):
    """The pipeline schedule as a Gantt chart: one row per stage (stage 0 on top), forward and
    backward of each micro-batch (numbered where they are wide enough), then the stage's
    exposed DP traffic and the optimizer step. A long schedule shows its start and its end."""
    plt = load_pyplot()
    from matplotlib.patches import Patch

    bars = timeline_bars(pred)
    pp = len(pred.stages)
    scale, unit = _seconds_unit(pred.iteration_s)
    end = pred.iteration_s * scale
    windows = _timeline_windows(pred, end)
    fig, axes = plt.subplots(1, len(windows), figsize=(13, 1.6 + 0.55 * pp), layout="constrained", sharey=True,
                             squeeze=False)
    axes = list(axes[0])
    ax_px = 13 * fig.dpi * 0.85 / len(windows)
    tasks = [b for b in bars if b.microbatch is not None]
    typical = sorted(b.end - b.start for b in tasks)[len(tasks) // 2] * scale
    for ax, (lo, hi) in zip(axes, windows, strict=True):
        px_per_unit = ax_px / (hi - lo)
        edge = 0.4 if typical * px_per_unit >= 4 else 0.0  # white gaps would wash out thin bars
        for kind in _TASK_COLORS:
            for later in (False, True):
                chosen = [b for b in bars if b.kind == kind and (b.chunk > 0) == later]
                if not chosen:
                    continue
                color = _LATER_CHUNK[kind] if later else _TASK_COLORS[kind]
                for stage in range(pp):
                    spans = [(b.start * scale, (b.end - b.start) * scale) for b in chosen if b.stage == stage]
                    if spans:
                        ax.broken_barh(spans, (stage - 0.38, 0.76), facecolors=color, edgecolor="white",
                                       linewidth=edge)
        # what of each task is communication, drawn hatched at its end in its component's colour
        for field in _COMPONENT_COLORS:
            for stage in range(pp):
                spans = [_wait_span(b, field, scale) for b in tasks if b.stage == stage and dict(b.waits).get(field)]
                if spans:
                    ax.broken_barh(spans, (stage - 0.38, 0.76), facecolors=_COMPONENT_COLORS[field], hatch="///",
                                   edgecolor="white", linewidth=0.0)
        for b in tasks:
            if lo <= b.start * scale and b.end * scale <= hi and (b.end - b.start) * scale * px_per_unit >= 14:
                ax.text((b.start + b.end) / 2 * scale, b.stage, str(b.microbatch), ha="center", va="center",
                        fontsize=6.5, color="white" if b.chunk == 0 else "black")
        ax.axvline(end, color="black", linestyle="--", linewidth=1)
        ax.set_xlim(lo, hi)
        ax.grid(True, axis="x", alpha=0.3)
    axes[0].set_yticks(range(pp), [f"stage {i}" for i in range(pp)], fontsize="small")
    axes[0].set_ylim(pp - 0.5, -0.5)
    dashed = f"dashed: iteration {end:.4g} {unit}" + _interval_words(interval, pred.iteration_s, scale, unit)
    plan = pred.job.parallel
    if plan.runs_deepspeed_train_schedule and plan.pp > 1:
        head = "Pipeline schedule (DeepSpeed: transfers are rendezvous between tasks)"
    elif plan.overlap_p2p_comm or plan.pp == 1:
        head = "Pipeline schedule"
    else:
        head = "Pipeline schedule (a task's bar includes its blocking send)"
    if len(axes) > 1:
        axes[0].set_xlabel(f"start of the iteration ({unit})")
        axes[1].set_xlabel(f"end of the iteration ({unit}); {dashed}")
        axes[1].tick_params(left=False)
        head += ": its start and end, the middle left out"
    else:
        axes[0].set_xlabel(f"time in the iteration ({unit}); {dashed}")
    fig.suptitle(head + "\n" + _title(pred), fontsize="medium")
    split = any(b.kind == "weight" for b in bars)  # zero-bubble: B and W passes apart
    later = any(b.chunk > 0 for b in bars)
    names = {"forward": "forward", "backward": "input gradient (B)" if split else "backward", "weight": "weight gradient (W)"}
    if plan.recompute.value != "none":
        names["backward"] += " (with recompute)"
    legend = []
    for kind in ("forward", "backward", "weight") if split else ("forward", "backward"):
        legend.append(Patch(color=_TASK_COLORS[kind], label=names[kind]))
        if later:  # beside its kind: the legend fills column by column when it takes two rows
            short = {"forward": "forward", "backward": "B" if split else "backward", "weight": "W"}[kind]
            legend.append(Patch(color=_LATER_CHUNK[kind], label=f"{short}, later chunk"))
    waiting = {field for b in tasks for field, _ in b.waits}
    legend += [Patch(facecolor=_COMPONENT_COLORS[c.field], hatch="///", edgecolor="white",
                     label=f"{c.label} (in a task)") for c in COMPONENTS if c.field in waiting]
    if any(b.kind == DP_LABEL for b in bars):
        legend.append(Patch(color=_TASK_COLORS[DP_LABEL], label=f"{DP_LABEL} (after the last micro-batch)"))
    legend.append(Patch(color=_TASK_COLORS["optimizer"], label="optimizer step"))
    columns = len(legend) if len(legend) <= 6 else -(-len(legend) // 2)  # two rows when many
    fig.legend(handles=legend, loc="outside lower center", ncol=columns, fontsize="small", frameon=False)
    return fig


def _wait_span(bar, field: str, scale: float) -> tuple[float, float]:
    """Where a task's wait for ``field`` lies in its bar: the waits fill the bar's end, in
    ``COMPONENTS`` order."""
    fields = [f for f, _ in bar.waits]
    after = sum(w for f, w in bar.waits[fields.index(field) + 1:])
    width = dict(bar.waits)[field]
    return ((bar.end - after - width) * scale, width * scale)


def figure_memory(pred: Prediction):
    """Memory per GPU of each pipeline stage, stacked by part, against the GPU's HBM."""
    plt = load_pyplot()
    gib = 2.0**30
    n = len(pred.memory)
    fig, ax = plt.subplots(figsize=(min(14.0, 6.5 + 0.45 * n), 4.8), layout="constrained")
    x = list(range(n))
    bottom = [0.0] * n
    for part in memory_parts_of(pred.memory):
        heights = [getattr(m, part.field) / gib for m in pred.memory]
        ax.bar(x, heights, bottom=bottom, width=0.7, label=part.label, color=_MEMORY_COLORS[part.field],
               edgecolor="white", linewidth=0.5)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    for i, total in zip(x, bottom, strict=True):  # above the HBM and headroom lines it may sit on
        ax.annotate(f"{total:.1f}", (i, total), xytext=(0, 2), textcoords="offset points", ha="center",
                    va="bottom", fontsize="x-small", zorder=4,
                    bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none"})
    hbm = [h / gib for h in pred.hbm_bytes]
    ax.hlines(hbm, [i - 0.45 for i in x], [i + 0.45 for i in x], colors="black", linestyles="--", linewidth=1.2,
              label="HBM of the GPU")
    usable = [pred.memory.usable(i) / gib for i in range(n)]
    if pred.memory.headroom > 0:
        ax.hlines(usable, [i - 0.45 for i in x], [i + 0.45 for i in x], colors="black", linestyles=":",
                  linewidth=1.0, label=f"less {pred.memory.headroom:.0%} headroom")
    _stage_ticks(ax, [m.stage for m in pred.memory], None)
    ax.set_ylabel("GiB per GPU")
    _few_bars(ax, n)
    ax.set_ylim(0, max(*hbm, *bottom) * 1.1)
    verdict = "fits" if pred.fits else "DOES NOT FIT"
    fig.suptitle(f"Memory per GPU by pipeline stage ({verdict})\n" + _title(pred), fontsize="medium")
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
              frameon=False)
    return fig


_FIGURES = {"breakdown": figure_breakdown, "timeline": figure_timeline, "memory": figure_memory}


def _figure(pred: Prediction, kind: str, interval: Interval | None):
    """Picture ``kind``; the time pictures (breakdown, timeline) show ``interval``'s bounds."""
    return _FIGURES[kind](pred) if kind == "memory" else _FIGURES[kind](pred, interval)


def render_plot(pred: Prediction, kind: str, path: str | os.PathLike[str], interval: Interval | None = None) -> Path:
    """Write picture ``kind`` of ``pred`` to ``path`` (.png, .svg or .pdf by suffix).
    The caller checks the path first (``check_plot_path``), before predicting."""
    check_plot_path(path, overwrite=True)
    fig = _figure(pred, kind, interval)
    try:
        fig.savefig(Path(path), dpi=130)
    finally:
        load_pyplot().close(fig)
    return Path(path)


def render_png(pred: Prediction, kind: str, interval: Interval | None = None) -> bytes:
    """Picture ``kind`` of ``pred`` as PNG bytes (for the HTML report)."""
    fig = _figure(pred, kind, interval)
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=110)
    finally:
        load_pyplot().close(fig)
    return buffer.getvalue()
