"""Two predictions side by side (``paraplan compare``): a table for a person, CSV rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.text import Text

from paraplan.prediction.compare import Comparison, Delta
from paraplan.prediction.components import BY_FIELD
from paraplan.prediction.memory_parts import MEMORY_PARTS
from paraplan.prediction.result import Prediction
from paraplan.report.layout import ReadableTable
from paraplan.report.tables import spread_lines
from paraplan.units import format_bytes, format_seconds

if TYPE_CHECKING:
    from paraplan.uncertainty import Interval
    from paraplan.uncertainty.pair import RatioInterval

MEMORY_BY_KEY = {part.key: part for part in MEMORY_PARTS}


def _usd(x: float) -> str:
    return f"${x:,.0f}" if abs(x) >= 100 else f"${x:,.2f}"


def _seconds(x: float) -> str:
    return "0 s" if x == 0 else format_seconds(x)


def _signed(fmt: Callable[[float], str]) -> Callable[[float], str]:
    """A change: its sign, then its size as ``fmt`` writes it (0 without a sign)."""
    return lambda x: fmt(0.0) if x == 0 else ("+" if x > 0 else "-") + fmt(abs(x))


# per summary key: its label, how a value is written, how a change is written
_SUMMARY: dict[str, tuple[str, Callable[[float], str], Callable[[float], str]]] = {
    "iteration_s": ("iteration time", _seconds, _signed(_seconds)),
    "tokens_per_s": ("tokens / s", lambda x: f"{x:,.0f}", lambda x: f"{x:+,.0f}"),
    "mfu": ("MFU", lambda x: f"{100 * x:.1f} %", lambda x: f"{100 * x:+.1f} pt"),
    "memory.total_bytes": ("memory per GPU (worst stage)", format_bytes, _signed(format_bytes)),
    "memory.hbm_bytes": ("HBM per GPU", format_bytes, _signed(format_bytes)),
    "memory.margin_bytes": ("memory margin (after headroom)", _signed(format_bytes), _signed(format_bytes)),
    "cost.cost_per_hour_usd": ("cluster $ / hour", _usd, _signed(_usd)),
    "cost.usd_per_million_tokens": ("$ per million tokens", _usd, _signed(_usd)),
    "cost.time_to_train_s": ("time to train", _seconds, _signed(_seconds)),
    "cost.cost_to_train_usd": ("cost to train", _usd, _signed(_usd)),
}


# per summary key with an interval: whether it scales with the time or inversely, and its form
_BOUNDED = {"iteration_s": ("time", "seconds"), "tokens_per_s": ("rate", "count"), "mfu": ("rate", "pct"),
            "cost.usd_per_million_tokens": ("time", "usd"), "cost.time_to_train_s": ("time", "seconds"),
            "cost.cost_to_train_usd": ("time", "usd")}


def _bounds_cell(interval: Interval, key: str, value: float | None) -> str:
    from paraplan.report.tables import range_text

    if value is None:
        return "-"
    scale, shown = _BOUNDED[key]
    return range_text(interval.time(value) if scale == "time" else interval.rate(value), shown)


def component_label(key: str) -> str:
    """A Breakdown field's label, as every table, picture and report prints it."""
    if key == "total_s":
        return "iteration (sum)"
    return BY_FIELD[key].label


def _percent(d: Delta) -> str:
    r = d.relative
    return "-" if r is None else f"{100 * r:+.1f} %"


def _row(table: ReadableTable, label: str, d: Delta, fmt: Callable[[float], str], change: Callable[[float], str],
         **kwargs: Any) -> None:
    def cell(x: float | None, f: Callable[[float], str]) -> str:
        return "-" if x is None else f(x)

    table.add_row(label, cell(d.a, fmt), cell(d.b, fmt), cell(d.change, change), _percent(d), **kwargs)


def describe(pred: Prediction) -> str:
    """One line naming a prediction's job: model, GPUs and plan."""
    job, p = pred.job, pred.job.parallel
    gpus = pred.gpu_name if pred.placement is not None else f"{job.cluster.num_gpus} x {pred.gpu_name}"
    return (f"{job.model.name}, seq {job.model.seq_length:,}, on {gpus}; tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp}"
            + (f" vpp={p.vpp}" if p.vpp > 1 else "")
            + f", micro-batch {p.micro_batch_size}, global batch {p.global_batch_size}, {job.precision.value}, "
            f"recompute {p.recompute.value}, ZeRO-{p.zero_stage}, {p.schedule.value}, {_framework(pred)}")


def _framework(pred: Prediction) -> str:
    """The engine, with the framework preset it runs for (``nemo-24.07 on megatron``)."""
    preset = getattr(pred.job, "preset", None)
    return pred.job.parallel.framework.value if preset is None else f"{preset.preset} on {preset.engine.value}"


def render_comparison(cmp: Comparison, names: tuple[str, str] = ("A", "B"),
                      intervals: tuple[Interval, Interval, RatioInterval] | None = None) -> Group:
    """Who A and B are, the settings that differ, then one table: the summary figures, whether
    each fits, the worst stage's memory parts either has, and the breakdown components either has, with B - A and its percentage of A.
    With ``intervals`` (A's, B's and the ratio's), each time, rate and cost figure's bounds
    in a row below it, and whether B - A exceeds the uncertainty of the ratio."""
    head = [Text.assemble((f"A ({names[0]}): ", "bold"), describe(cmp.a)),
            Text.assemble((f"B ({names[1]}): ", "bold"), describe(cmp.b))]
    presets = [getattr(getattr(p.job, "preset", None), "preset", None) for p in (cmp.a, cmp.b)]
    settings = [("framework preset", *(p or "none" for p in presets))] if presets[0] != presets[1] else []
    settings += list(cmp.settings)
    if settings:
        differ = ", ".join(f"{key.removeprefix('parallel.')} {a} -> {b}" for key, a, b in settings)
        head.append(Text.assemble(("differs: ", "bold"), differ))
    else:
        head.append(Text("differs: nothing (the same job twice)"))
    table = ReadableTable("B against A")
    table.add_column("figure")
    for header in ("A", "B", "B - A", "%"):
        table.add_column(header, number=True)
    for d in cmp.summary:
        label, fmt, change = _SUMMARY[d.key]
        _row(table, label, d, fmt, change)
        if intervals is not None and d.key in _BOUNDED and (d.a is not None or d.b is not None):
            ia, ib, ratio = intervals
            low, high = ratio.bounds
            table.add_row(f"  {ia.label} interval", _bounds_cell(ia, d.key, d.a), _bounds_cell(ib, d.key, d.b), "",
                          f"{100 * (low - 1):+.1f}/{100 * (high - 1):+.1f} %" if d.key == "iteration_s" else "")
    fits_a, fits_b = cmp.fits
    table.add_row("fits", "yes" if fits_a else "NO", "yes" if fits_b else "NO", "", "", end_section=True)
    # the worst stage's memory parts either plan has, by the labels every renderer prints
    parts = [d for d in cmp.memory if (d.a or 0.0) > 0 or (d.b or 0.0) > 0 or MEMORY_BY_KEY[d.key].always]
    for i, d in enumerate(parts):
        _row(table, f"memory: {MEMORY_BY_KEY[d.key].label}", d, format_bytes, _signed(format_bytes),
             end_section=i == len(parts) - 1)
    # a component neither plan has is left out (zero in both, to rounding: 1e-9 of the iteration)
    noise = 1e-9 * max(cmp.a.iteration_s, cmp.b.iteration_s)
    for d in cmp.components:
        if d.key != "total_s" and abs(d.a or 0.0) <= noise and abs(d.b or 0.0) <= noise:
            continue
        _row(table, component_label(d.key), d, _seconds, _signed(_seconds),
             style="bold" if d.key == "total_s" else None)
    tail = []
    if intervals is not None:
        ia, ib, ratio = intervals
        tail = [Text.assemble(("difference: ", "bold"), ratio.sentence,
                              style="" if ratio.verdict == "within" else "green"),
                Text(f"  the ratio's interval: {ratio.rule}")]
        tail += [Text(f"  {line}") for line in spread_lines(ratio.guessed)]
        tail += [Text(f"A's {ia.label} interval: {ia.rule}"), Text(f"B's {ib.label} interval: {ib.rule}")]
    return Group(*head, table, *tail)


def comparison_rows(cmp: Comparison, intervals: tuple[Interval, Interval, RatioInterval] | None = None
                    ) -> list[dict[str, Any]]:
    """CSV rows: one per figure, with A, B, B - A and (B - A) / A; with ``intervals``, each
    time, rate and cost figure's bounds (``interval.<figure>.low`` / ``.high``: A's and B's),
    and the measured B / A's bounds (``interval.b_over_a.iteration_s``: its ``relative``)."""
    rows = [{"figure": d.key, **d.to_dict()} for d in cmp.summary]
    if intervals is not None:
        ia, ib, ratio = intervals
        for d in cmp.summary:
            if d.key not in _BOUNDED:
                continue
            scale = _BOUNDED[d.key][0]
            ends = [None if v is None else (iv.time(v) if scale == "time" else iv.rate(v))
                    for iv, v in ((ia, d.a), (ib, d.b))]
            for i, end in enumerate(("low", "high")):
                rows.append({"figure": f"interval.{d.key}.{end}", "a": ends[0] and ends[0][i],
                             "b": ends[1] and ends[1][i], "change": None, "relative": None})
        for end, bound in zip(("low", "high"), ratio.bounds, strict=True):
            rows.append({"figure": f"interval.b_over_a.iteration_s.{end}", "a": None, "b": None, "change": None,
                         "relative": bound - 1.0})
    rows.append({"figure": "memory.fits", "a": cmp.a.fits, "b": cmp.b.fits, "change": None, "relative": None})
    rows += [{"figure": d.key, **d.to_dict()} for d in cmp.memory]
    rows += [{"figure": f"breakdown.{d.key}", **d.to_dict()} for d in cmp.components]
    return rows
