"""Rich tables for a person at a terminal."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from paraplan.prediction import Prediction
from paraplan.prediction.components import components_of
from paraplan.prediction.memory_parts import memory_parts_of
from paraplan.report.layout import ReadableTable
from paraplan.units import (
    format_bytes,
    format_count,
    format_micro_batches,
    format_rate,
    format_seconds,
    format_tokens,
)

if TYPE_CHECKING:
    from paraplan.uncertainty import Interval
    from paraplan.uncertainty.guessed import Spread


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _usd(x: float | None) -> str:
    if x is None:
        return "-"
    return f"${x:,.0f}" if x >= 100 else f"${x:,.2f}"


def _gpus(pred: Prediction) -> str:
    if pred.placement is not None:
        return f"{pred.gpu_name} ({pred.placement.cluster})"
    c = pred.job.cluster
    return f"{c.num_gpus} x {c.gpu.name} ({c.name})"


def _seconds_range(low: float, high: float) -> str:
    """``5.2-7.4 s``: three significant figures, both bounds in one unit where they share it."""
    def short(seconds: float) -> tuple[str, str]:
        number, _, unit = format_seconds(seconds).partition(" ")
        return _sig(float(number)), unit

    (lo, lo_unit), (hi, hi_unit) = short(low), short(high)
    return f"{lo}-{hi} {hi_unit}" if lo_unit == hi_unit else f"{lo} {lo_unit}-{hi} {hi_unit}"


def _sig(x: float) -> str:
    """Three significant figures, with thousands separators: 193,000."""
    return f"{float(f'{x:.3g}'):,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def with_interval(value: str, interval: Interval | None, bounds: tuple[float, float] | float | None,
                  shown: str) -> str:
    """``value (80 %: bounds)``, the bounds as ``shown`` says: seconds | count | rate | pct | usd."""
    if interval is None or not isinstance(bounds, tuple):  # no interval, or no figure to bound
        return value
    return f"{value} ({interval.label}: {range_text(bounds, shown)})"


def range_text(bounds: tuple[float, float], shown: str) -> str:
    """An interval's bounds as ``shown`` says: seconds | count | rate | pct | usd."""
    low, high = bounds
    return {
        "seconds": lambda: _seconds_range(low, high),
        "count": lambda: f"{_sig(low)}-{_sig(high)}",
        "rate": lambda: f"{low:.1f}-{high:.1f}",
        "pct": lambda: f"{100 * low:.1f}-{100 * high:.1f} %",
        "usd": lambda: "-".join(f"${x:,.2f}" if x < 100 else f"${_sig(x)}" for x in (low, high)),
    }[shown]()


def render_interval(interval: Interval) -> list[Text]:
    """How the interval was had: its rule, and the unstated settings it was widened for."""
    lines = [Text.assemble((f"{interval.label} interval: ", "bold"), interval.rule,
                           style="yellow" if interval.fallback else "")]
    return lines + [Text(f"  {line}") for line in spread_lines(interval.guessed)]


def spread_lines(guessed: Iterable[Spread]) -> list[str]:
    """One line per unstated setting a prediction (or a ratio) was widened for, with its spread
    in percent; the settings whose spread rounds to zero both ways share one line, counted."""
    lines, still = [], []
    for s in guessed:
        low, high = _tenth(s.low), _tenth(s.high)
        if low == high == 0.0:
            still.append(s.field)
            continue
        tried = ", ".join(str(getattr(v, "value", v)).lower() for v in s.tried)
        lines.append(f"widened for unstated {s.field} ({tried}): {low:+.1f} / {high:+.1f} %")
    if still:
        lines.append(f"{len(still)} unstated setting{'s' if len(still) > 1 else ''} moved it less than "
                     f"0.05 %: {', '.join(still)}")
    return lines


def _tenth(log_ratio: float) -> float:
    """A spread in percent, to a tenth, with no negative zero (``-0.0`` prints as ``+0.0``)."""
    return round(100 * log_ratio, 1) or 0.0


def render_prediction(pred: Prediction, interval: Interval | None = None) -> Group:
    """The summary, the breakdown, per-GPU memory and (when priced) cost; with ``interval``,
    every time, rate and cost figure with its bounds, and the rule that gave them."""
    iv = interval
    job, plan = pred.job, pred.job.parallel
    head = Text.assemble(
        (f"{job.model.name}", "bold"),
        f" on {_gpus(pred)}, ",
        f"tp={plan.tp} pp={plan.pp} dp={plan.dp} cp={plan.cp}"
        + (f" ({plan.cp_comm})" if plan.cp > 1 else "")
        + (f" vpp={plan.vpp}" if plan.vpp > 1 else "")
        + f", micro-batch {plan.micro_batch_size}, global batch {plan.global_batch_size}"
        + f" ({format_micro_batches(plan.num_microbatches)}), {job.precision.value}"
        + (f" ({plan.fp8_recipe.value})" if plan.fp8_recipe is not None else "")
        + f", recompute {plan.recompute.value}"
        + (f" ({' '.join(plan.recompute_modules)})" if plan.recompute_modules else "")
        + (f", layout {plan.pipeline_model_parallel_layout}" if plan.pipeline_model_parallel_layout else "")
        + f", ZeRO-{plan.zero_stage}, {plan.schedule.value}, {plan.framework.value}"
        + (f", attention {plan.attention_kernel.value}" if plan.attention_kernel is not None else ""),
    )
    summary = Table(title="Prediction", show_header=False, title_justify="left")
    summary.add_column("metric")
    summary.add_column("value", justify="right")
    summary.add_row("iteration time", with_interval(format_seconds(pred.iteration_s), iv,
                                                     iv and iv.time(pred.iteration_s), "seconds"))
    summary.add_row("tokens / s", with_interval(f"{pred.tokens_per_s:,.0f}", iv, iv and iv.rate(pred.tokens_per_s),
                                                "count"))
    summary.add_row("model TFLOP/s per GPU", with_interval(format_rate(pred.tflops_per_gpu), iv,
                                                            iv and iv.rate(pred.tflops_per_gpu), "rate"))
    summary.add_row("MFU", with_interval(_pct(pred.mfu), iv, iv and iv.rate(pred.mfu), "pct"))
    if plan.recompute.value != "none":
        summary.add_row("HFU (with recompute)", _pct(pred.hfu))
    summary.add_row("pipeline bubble", _pct(pred.bubble_fraction))
    summary.add_row("parameters", format_count(pred.params_total))
    if pred.job.model.is_moe:
        summary.add_row("active parameters", format_count(pred.params_active))
    summary.add_row("backend", pred.backend)
    if job.model.inventory == "traced":  # which costing of the traced operators (model.kernels)
        summary.add_row("inventory", f"traced, {job.model.kernels} kernels")
        if plan.pp > 1:
            from paraplan.prediction.result import traced_pipeline

            summary.add_row("pipeline placement", traced_pipeline(job))

    parts = Table(title="Where one iteration goes (critical path)", title_justify="left")
    parts.add_column("component")
    parts.add_column("seconds", justify="right")
    parts.add_column("share", justify="right")
    shown = components_of(pred.job)
    for component, seconds in pred.breakdown.parts():
        if component in shown or seconds > 0:
            parts.add_row(component.label, f"{seconds:.4f}", _pct(seconds / pred.iteration_s))
    parts.add_row(Text("iteration", style="bold"), f"{pred.breakdown.total_s:.4f}", "100.0 %")

    mem = render_memory(pred)
    host = max(m.host for m in pred.memory)
    if host > 0:  # offload: what each GPU keeps in host memory
        mem.add_row("host memory per GPU (offload)", format_bytes(host))

    items: list[Any] = [head, summary, parts, mem]
    if job.preset is not None:  # the framework preset's defaults taken, the user's values kept
        items.insert(1, Text("\n".join(job.preset.lines())))
    if pred.placement is not None:
        stages = ReadableTable("Stages on node groups")
        stages.add_column("stage", number=True)
        stages.add_column("GPUs")
        stages.add_column("layers", number=True)
        stages.add_column("fwd+bwd ms / micro-batch", short="fwd+bwd ms", number=True)
        stages.add_column("memory", number=True)
        stages.add_column("HBM", number=True)
        for t, gpus, m, hbm in zip(pred.stages, pred.placement.stage_gpus, pred.memory, pred.hbm_bytes, strict=True):
            stages.add_row(str(t.stage), gpus, str(t.num_layers), f"{t.busy_mb_s * 1e3:.2f}",
                           format_bytes(m.total), format_bytes(hbm))
        items.append(stages)
    if pred.cost_per_hour_usd is not None or job.train_tokens is not None:
        cost = Table(title="Cost", show_header=False, title_justify="left")
        cost.add_column("metric")
        cost.add_column("value", justify="right")
        cost.add_row("cluster $ / hour", _usd(pred.cost_per_hour_usd))
        per_million = pred.usd_per_million_tokens
        cost.add_row("$ per million tokens", with_interval(_usd(per_million), iv,
                                                           iv and per_million and iv.time(per_million), "usd"))
        if pred.time_to_train_s is not None:
            cost.add_row(f"time to train {format_tokens(job.train_tokens)} tokens",
                         with_interval(format_seconds(pred.time_to_train_s), iv, iv and iv.time(pred.time_to_train_s),
                                       "seconds"))
            to_train = pred.cost_to_train_usd
            cost.add_row("cost to train", with_interval(_usd(to_train), iv, iv and to_train and iv.time(to_train),
                                                        "usd"))
        items.append(cost)
    if iv is not None:
        items.extend(render_interval(iv))
    items.extend(render_uncalibrated(pred.uncalibrated))
    items.extend(render_ignored_settings(pred.ignored_settings))
    items.extend(render_placement_notes(pred.placement_notes))
    return Group(*items)


def render_memory(pred: Prediction) -> Table:
    """The worst stage's memory by part (a part that is zero is left out), its total against
    the GPU's memory, and the margin left after the headroom."""
    memory = pred.memory
    worst = memory.worst
    peak = f", peak at {worst.moment}" if worst.moment else ""  # the step's moment whose tensors these are
    mem = Table(title=f"Memory per GPU (worst stage {worst.stage}{peak})", title_justify="left")
    mem.add_column("part")
    mem.add_column("size", justify="right")
    for part in memory_parts_of([worst]):
        name = part.label
        if part.field == "activations":
            name += f" ({worst.in_flight_microbatches:g} micro-batch(es) in flight)"
        mem.add_row(name, format_bytes(getattr(worst, part.field)))
    mem.add_row(Text("total", style="bold"), format_bytes(worst.total))
    mem.add_row("of which reserved by PyTorch (as logged)", format_bytes(worst.reserved))
    mem.add_row(f"of {format_bytes(memory.hbm)} HBM, {memory.headroom:.0%} headroom", format_bytes(memory.usable(worst.stage)))
    verdict = Text("fits", style="green") if memory.fits else Text("DOES NOT FIT", style="bold red")
    mem.add_row(Text.assemble("margin: ", verdict), format_bytes(memory.margin))
    return mem


def render_uncalibrated(notes: tuple[str, ...]) -> list[Text]:
    """The visible mark on a prediction whose GPU lacks measured curves for some kernels."""
    return [Text.assemble(("uncalibrated: ", "bold yellow"), note) for note in notes]


def render_ignored_settings(notes: tuple[str, ...]) -> list[Text]:
    """Settings the plan states that nothing priced runs: facts of the plan, under their own
    heading rather than "uncalibrated"."""
    return [Text.assemble(("ignored: ", "bold magenta"), note) for note in notes]


def render_placement_notes(notes: tuple[str, ...]) -> list[Text]:
    """Where the plan's groups sit on the cluster (a group straddling a scale-up domain): facts
    of the placement, under their own heading rather than "uncalibrated"."""
    return [Text.assemble(("placement: ", "bold cyan"), note) for note in notes]


def render_explain(pred: Prediction) -> Group:
    """Per-operator table of one layer of the critical stage, then its collectives."""
    ops = ReadableTable("One transformer layer, one micro-batch, one GPU")
    ops.add_column("operator")
    ops.add_column("role", wrap=True)
    ops.add_column("kind")
    for header, short in (("GFLOP", None), ("MB", None), ("fwd ms", None), ("bwd ms", None), ("recompute ms", "rec ms")):
        ops.add_column(header, short=short, number=True)
    ops.add_column("model", wrap=True, detail=True)
    for op in pred.layer_ops:
        ops.add_row(
            op.name,
            op.role,
            op.kind,
            f"{op.flops / 1e9:.2f}",
            f"{op.bytes / 1e6:.1f}",
            f"{op.fwd_s * 1e3:.3f}",
            f"{op.bwd_s * 1e3:.3f}",
            f"{op.recompute_s * 1e3:.3f}",
            op.source,
        )
    total_f = sum(o.fwd_s for o in pred.layer_ops)
    total_b = sum(o.bwd_s for o in pred.layer_ops)
    total_r = sum(o.recompute_s for o in pred.layer_ops)
    ops.add_row(Text("total", style="bold"), "", "", "", "", f"{total_f * 1e3:.3f}", f"{total_b * 1e3:.3f}",
                f"{total_r * 1e3:.3f}", "")
    items: list[Any] = [ops]
    if pred.layer_collectives:
        items.append(_collectives_table("Collectives of one layer", pred.layer_collectives))
    else:
        items.append(Text(f"Collectives of one layer: none ({NO_LAYER_COLLECTIVES})"))
    if pred.stage_collectives:
        items.append(_collectives_table(STAGE_COLLECTIVES_TITLE, pred.stage_collectives))
    return Group(*items)


#: why a layer has no collectives of its own (``render_explain`` and the HTML report)
NO_LAYER_COLLECTIVES = "no tensor, context or expert parallelism"
#: the title of the critical stage's data-parallel collectives
STAGE_COLLECTIVES_TITLE = "Data-parallel and ZeRO collectives of the critical stage"


def collective_phase(c) -> str:
    """The phase of a collective, and how often it runs when that is not once a layer."""
    return c.phase if c.per == "layer" else f"{c.phase}, each {c.per}"


def _collectives_table(title: str, collectives) -> ReadableTable:
    colls = ReadableTable(title)
    colls.add_column("collective")
    colls.add_column("kind")
    colls.add_column("group", wrap=True)
    colls.add_column("phase", wrap=True)
    colls.add_column("calls", number=True)
    colls.add_column("MB", number=True)
    colls.add_column("ms (all calls)", short="ms", number=True)
    colls.add_column("model", wrap=True, detail=True)
    for c in collectives:
        colls.add_row(
            c.name,
            c.kind,
            f"{c.dim} x{c.group_size} over {c.group_nodes} node(s)",
            collective_phase(c),
            str(c.count),
            f"{c.bytes / 1e6:.2f}",
            f"{c.seconds * 1e3:.3f}",
            c.source,
        )
    return colls
