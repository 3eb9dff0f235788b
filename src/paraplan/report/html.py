"""One prediction as one self-contained HTML page (``paraplan report``): the summary, the
breakdown per stage, the pipeline timeline, memory per stage, the operators and collectives of
one layer and its GEMMs. Pictures are inlined as base64 PNG; the page loads nothing from
anywhere (no scripts, no fonts, no links).
"""

from __future__ import annotations

import base64
from html import escape
from typing import TYPE_CHECKING

from paraplan.prediction import Prediction
from paraplan.prediction.components import BY_FIELD, components_of
from paraplan.prediction.memory_parts import memory_parts_of
from paraplan.report.gemms import gemm_rows
from paraplan.report.plots import gpus_label, render_png
from paraplan.report.stagebars import COMPONENTS, stage_bars
from paraplan.report.tables import (
    NO_LAYER_COLLECTIVES,
    STAGE_COLLECTIVES_TITLE,
    collective_phase,
    spread_lines,
)
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

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #e4e4e4; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; white-space: normal; }
tr.total td { font-weight: bold; border-top: 1px solid #999; }
img { max-width: 100%; height: auto; } .note { color: #666; font-size: 0.9em; } .bad { color: #b00; font-weight: bold; }
"""


def _table(header: list[str], rows: list[list[str]], left: int = 1, total: bool = False) -> str:
    """An HTML table; the first ``left`` columns are text (left-aligned), the rest numbers.
    Cells are escaped here."""
    def cells(values: list[str], tag: str) -> str:
        return "".join(
            f'<{tag}{" class=l" if i < left else ""}>{escape(str(v))}</{tag}>' for i, v in enumerate(values)
        )

    body = [f"<tr>{cells(r, 'td')}</tr>" for r in rows]
    if total and body:
        body[-1] = body[-1].replace("<tr>", '<tr class="total">', 1)
    return f"<table><thead><tr>{cells(header, 'th')}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _picture(pred: Prediction, kind: str, alt: str, interval: Interval | None = None) -> str:
    data = base64.b64encode(render_png(pred, kind, interval)).decode("ascii")
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{data}">'


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _usd(x: float | None) -> str:
    return "-" if x is None else (f"${x:,.0f}" if x >= 100 else f"${x:,.2f}")


def _summary(pred: Prediction, iv: Interval | None = None) -> str:
    from paraplan.report.tables import with_interval

    job, plan = pred.job, pred.job.parallel
    rows = [
        ["model", f"{job.model.name} ({format_count(pred.params_total)} parameters)"],
        ["GPUs", f"{gpus_label(pred)} ({job.cluster.name})"],
        ["plan", f"tp={plan.tp} pp={plan.pp} dp={plan.dp} cp={plan.cp} vpp={plan.vpp}, ZeRO-{plan.zero_stage}, "
                 f"{plan.schedule.value}, {plan.framework.value}, recompute {plan.recompute.value}"],
        *([["framework preset", "; ".join(job.preset.lines())]] if getattr(job, "preset", None) else []),
        ["batch", f"micro-batch {plan.micro_batch_size}, global batch {plan.global_batch_size} "
                  f"({format_micro_batches(plan.num_microbatches)}), sequence {job.model.seq_length}, {job.precision.value}"],
        ["iteration time", with_interval(format_seconds(pred.iteration_s), iv, iv and iv.time(pred.iteration_s),
                                         "seconds")],
        ["tokens / s", with_interval(f"{pred.tokens_per_s:,.0f}", iv, iv and iv.rate(pred.tokens_per_s), "count")],
        ["model TFLOP/s per GPU", with_interval(format_rate(pred.tflops_per_gpu), iv,
                                                iv and iv.rate(pred.tflops_per_gpu), "rate")],
        ["MFU", with_interval(_pct(pred.mfu), iv, iv and iv.rate(pred.mfu), "pct")],
        ["HFU (with recompute)", _pct(pred.hfu)],
        ["pipeline bubble", _pct(pred.bubble_fraction)],
        ["backend", pred.backend],
        ["cluster $ / hour", _usd(pred.cost_per_hour_usd)],
        ["$ per million tokens", with_interval(_usd(per_million := pred.usd_per_million_tokens), iv,
                                               iv and per_million and iv.time(per_million), "usd")],
    ]
    if pred.time_to_train_s is not None:
        to_train = pred.cost_to_train_usd
        rows += [[f"time to train {format_tokens(job.train_tokens)} tokens ({job.train_tokens:,.0f})",
                  with_interval(format_seconds(pred.time_to_train_s), iv, iv and iv.time(pred.time_to_train_s),
                                "seconds")],
                 ["cost to train", with_interval(_usd(to_train), iv, iv and to_train and iv.time(to_train), "usd")]]
    return _table(["", ""], rows, left=1)


def _breakdown(pred: Prediction) -> str:
    bars = stage_bars(pred)
    shown = components_of(pred.job)
    header = ["component"] + [f"stage {b.stage}{' (critical)' if b.critical else ''}" for b in bars]
    rows = [[c.label] + [f"{b.seconds[k]:.4f}" for b in bars] for k, c in enumerate(COMPONENTS)
            if c in shown or any(b.seconds[k] for b in bars)]
    rows.append(["iteration"] + [f"{b.total_s:.4f}" for b in bars])
    return _table(header, rows, total=True)


def _memory(pred: Prediction) -> str:
    """One row per memory part (``prediction.memory_parts``), one column per stage, then the
    total against the GPU's HBM and the margin left after the headroom."""
    mem = pred.memory
    header = ["part"] + [f"stage {m.stage}" for m in mem]
    rows = [[part.label] + [format_bytes(getattr(m, part.field)) for m in mem] for part in memory_parts_of(mem)]
    rows.append(["total"] + [format_bytes(m.total) for m in mem])
    body = _table(header, rows, total=True)
    margins = [mem.margin_of(m.stage) for m in mem]
    verdicts = [
        ["micro-batches in flight"] + [f"{m.in_flight_microbatches:g}" for m in mem],
        ["HBM"] + [format_bytes(hbm) for hbm in mem.hbm_bytes],
        [f"left after {mem.headroom:.0%} headroom"] + [format_bytes(x) for x in margins],
        [""] + ["fits" if x >= 0 else "DOES NOT FIT" for x in margins],
    ]
    return body + _table(["", *header[1:]], verdicts)


def _operators(pred: Prediction) -> str:
    rows = [
        [o.name, o.role, o.kind, f"{o.flops / 1e9:.2f}", f"{o.bytes / 1e6:.1f}", f"{o.fwd_s * 1e3:.3f}",
         f"{o.bwd_s * 1e3:.3f}", f"{o.recompute_s * 1e3:.3f}", o.source]
        for o in pred.layer_ops
    ]
    ops = pred.layer_ops
    rows.append(["total", "", "", f"{sum(o.flops for o in ops) / 1e9:.2f}", f"{sum(o.bytes for o in ops) / 1e6:.1f}",
                 f"{sum(o.fwd_s for o in ops) * 1e3:.3f}", f"{sum(o.bwd_s for o in ops) * 1e3:.3f}",
                 f"{sum(o.recompute_s for o in ops) * 1e3:.3f}", ""])
    table = _table(["operator", "role", "kind", "GFLOP", "MB", "fwd ms", "bwd ms", "recompute ms", "model"], rows,
                   left=3, total=True)
    header = ["collective", "kind", "group", "phase", "calls", "MB", "ms (all calls)", "model"]
    if pred.layer_collectives:
        table += "<h3>Collectives of one layer</h3>" + _table(header, _collective_rows(pred.layer_collectives), left=4)
    else:
        table += f'<p class="note">No collectives within a layer ({NO_LAYER_COLLECTIVES}).</p>'
    if pred.stage_collectives:
        table += (f"<h3>{STAGE_COLLECTIVES_TITLE}</h3>"
                  '<p class="note">ZeRO-2/3 gathers and reduce-scatters run every micro-batch over the stage\'s '
                  "weights (FSDP and DeepSpeed issue them layer by layer); the gradient reduction runs once an "
                  f"iteration. Their exposed time is the breakdown's {BY_FIELD['dp_communication_s'].label}.</p>"
                  + _table(header, _collective_rows(pred.stage_collectives), left=4))
    return table


def _collective_rows(collectives) -> list[list[str]]:
    return [
        [c.name, c.kind, f"{c.dim} x{c.group_size} over {c.group_nodes} node(s)",
         collective_phase(c), str(c.count),
         f"{c.bytes / 1e6:.2f}", f"{c.seconds * 1e3:.3f}", c.source]
        for c in collectives
    ]


def _gemms(pred: Prediction) -> str:
    rows = [
        [g.operator, g.role, str(g.batch), f"{g.m:,}", f"{g.n:,}", f"{g.k:,}", f"{g.flops / 1e9:.2f}",
         f"{g.fwd_s * 1e3:.3f}", f"{g.bwd_s * 1e3:.3f}", f"{g.fwd_tflops_per_s:.1f}"]
        for g in gemm_rows(pred)
    ]
    if not rows:
        return '<p class="note">No GEMM-shaped operators in a layer.</p>'
    header = ["GEMM", "role", "batch", "M", "N", "K", "GFLOP (fwd)", "fwd ms", "bwd ms (2 GEMMs)", "fwd TFLOP/s"]
    return _table(header, rows, left=2)


def _job_title(job) -> str:
    """The job's name; a job that names itself nothing (Job's default "job") is "paraplan"."""
    return job.name if job.name and job.name != "job" else "paraplan"


def _interval_notes(iv: Interval | None) -> str:
    """How the interval was had: its rule and each unstated setting it was widened for."""
    if iv is None:
        return ""
    lines = [f"{iv.label} interval: {iv.rule}"]
    lines += spread_lines(iv.guessed)
    return "".join(f'<p class="note">{escape(line)}</p>' for line in lines)


def render_html(pred: Prediction, interval: Interval | None = None) -> str:
    """The whole report of ``pred`` (made with ``keep_timeline=True``) as one HTML page; with
    ``interval``, every time, rate and cost figure with its bounds, and the rule that gave them."""
    title = f"{_job_title(pred.job)}: {pred.job.model.name} on {gpus_label(pred)}"
    notes = "".join(f'<p class="note">uncalibrated: {escape(n)}</p>' for n in pred.uncalibrated)
    notes += "".join(f'<p class="note">ignored: {escape(n)}</p>' for n in pred.ignored_settings)
    notes += "".join(f'<p class="note">placement: {escape(n)}</p>' for n in pred.placement_notes)
    verdict = "" if pred.fits else '<p class="bad">The plan does not fit in GPU memory.</p>'
    sections = [
        f"<h1>{escape(title)}</h1>",
        f'<p class="note">Predicted by paraplan ({escape(pred.backend)} backend).</p>',
        verdict, _summary(pred, interval), _interval_notes(interval), notes,
        "<h2>Where one iteration goes</h2>",
        '<p class="note">Seconds of one iteration on each pipeline stage; the critical stage is the '
        "breakdown of the iteration time, the others fill it with idle time. Compute is the kernels' own "
        "time; what a pass waits for a collective (its exposed part, and the slowdown of the kernels it "
        "runs beside) is that collective's row.</p>",
        _picture(pred, "breakdown", "breakdown per pipeline stage", interval), _breakdown(pred),
        "<h2>Pipeline schedule</h2>", _picture(pred, "timeline", "pipeline schedule", interval),
        "<h2>Memory per GPU, by stage</h2>", _picture(pred, "memory", "memory per stage"), _memory(pred),
        "<h2>Operators of one layer</h2>",
        '<p class="note">One transformer layer of the critical stage, one micro-batch, one GPU.</p>',
        _operators(pred),
        "<h2>GEMMs of one layer</h2>",
        '<p class="note">Y[M, N] = X[M, K] W[K, N], batch products each; backward runs two GEMMs of the '
        "same FLOPs (input and weight gradients). Fused flash attention is one kernel, not listed.</p>",
        _gemms(pred),
    ]
    body = "\n".join(s for s in sections if s)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body>\n{body}\n</body></html>\n"
    )
