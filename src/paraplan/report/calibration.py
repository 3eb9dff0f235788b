"""Tables of a calibration (``paraplan calibrate operators`` / ``links``), readable at 80 columns.

Numbers are never cut: the number columns do not wrap and their headers are broken into short
lines by hand, so at 80 columns only the first column (a name) folds when it must.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from paraplan.calibrate import EfficiencyFit, ErrorRow, ErrorStats, LinkCalibration, OperatorCalibration
from paraplan.calibrate.operators import DEFAULT_MEMORY_TAGS

__all__ = ["render_collective_table", "render_curve", "render_links", "render_operators", "render_trace_calibration"]

_ERR_HEADERS = ("median\n|err| %", "mean\n|err| %", "median\nerr %")


def _table(title: str, *columns: str) -> Table:
    """A compact table: the first column folds, the others are right-aligned and never wrap."""
    table = Table(
        title=escape(title), title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1), pad_edge=False
    )
    table.add_column(escape(columns[0]), overflow="fold")
    for col in columns[1:]:
        table.add_column(escape(col), justify="right", no_wrap=True)
    return table


def _stats(e: ErrorStats) -> list[str]:
    return [f"{e.median_abs:.1f}", f"{e.mean_abs:.1f}", f"{e.median:+.1f}"]


def _errors(title: str, rows: Sequence[ErrorRow], labels: Sequence[str] = ()) -> Table:
    """Per operator and phase: median |err|, mean |err|, median err (%); with ``labels`` one row
    per op-curves mode (the order of each row's ``errors``)."""
    if not labels:
        table = _table(title, "operator", "samples", *_ERR_HEADERS)
        for r in rows:
            table.add_row(f"{r.operator} {r.phase}", str(r.samples), *_stats(r.errors[0]))
        return table
    table = _table(title, "operator", "samples", "op curves", *_ERR_HEADERS)
    for r in rows:
        for i, (label, e) in enumerate(zip(labels, r.errors, strict=True)):
            first = i == 0
            table.add_row(f"{r.operator} {r.phase}" if first else "", str(r.samples) if first else "", label, *_stats(e),
                          end_section=i == len(labels) - 1)
    return table


def _fit(title: str, fit: EfficiencyFit) -> Table:
    overhead_us = fit.spec.kernel_overhead_s * 1e6
    table = _table(
        f"{title}: op curves {fit.op_curves}, {fit.layout.size} parameters, {fit.evaluations} evaluations, "
        f"status {fit.status}, {fit.seconds:.0f} s; kernel_overhead_s {overhead_us:.2f} us",
        "curve", "work", "max\nfraction", "half_work", "fixed\nus",
    )
    for c in fit.curves:
        table.add_row(c.name, c.work, f"{c.max_fraction:.4f}", f"{c.half_work:.4g}", f"{c.fixed_us:.2f}")
    return table


def render_operators(result: OperatorCalibration) -> Group:
    """What ``calibrate_operators`` found: the achieved rates, each fit's curves, the hold-out
    errors next to the comparison mode's, and the final fit's in-sample errors."""
    opts, gpu = result.options, result.gpu
    head = Text.assemble(
        ("Operators ", "bold"),
        f"{result.folder} on {gpu.name}: peak {opts.precision} {result.peak_flops / 1e12:.1f} TFLOP/s, "
        f"HBM {gpu.hbm_bandwidth_bytes_per_s / 1e9:.0f} GB/s (catalog); seed {opts.seed}, "
        f"hold-out {opts.holdout:.0%}, loss {opts.loss}. Per-operator curves: {opts.op_curves} (>= "
        f"{opts.min_samples} samples); kind-level memory curve fitted on {', '.join(DEFAULT_MEMORY_TAGS)}; "
        f"softmax curve fitted on {opts.softmax_curve}. Usable samples: {result.samples} "
        f"({result.fwd_samples} fwd, {result.bwd_samples} bwd); excluded: {'; '.join(result.excluded) or 'nothing'}. "
        "In the fits, 'fixed us' = half_work / (peak rate x max_fraction): a curve's time at zero work, to which "
        "kernel_overhead_s adds.",
    )
    achieved = _table(
        "Achieved fraction of peak (median over each group's slower half; inventory FLOPs and bytes)",
        "operator", "samples", "FLOP/s\n/ peak", "bytes/s\n/ HBM", "fastest\nus",
    )
    for a in result.achieved:
        achieved.add_row(f"{a.operator} {a.phase}", str(a.samples), f"{a.flops_fraction:.2f}",
                         f"{a.bytes_fraction:.2f}", f"{a.fastest_us:.1f}")
    items: list[Any] = [head, achieved, _fit(f"Fit on {result.holdout_fit.samples} samples (80 %)", result.holdout_fit)]
    if result.compare_fit is not None:
        items.append(_fit("Comparison fit on the same 80 %", result.compare_fit))
    items.append(
        _errors(
            f"Hold-out errors ({result.holdout_samples} samples never fitted; err = predicted/measured - 1)",
            result.holdout_rows,
            result.holdout_labels if len(result.holdout_labels) > 1 else (),
        )
    )
    if result.memory_curve_rows:
        items.append(
            _errors(
                "Hold-out errors of the memory-bound operators on the kind-level memory curve alone (what a "
                "memory-bound operator without a curve of its own gets)",
                result.memory_curve_rows,
            )
        )
    items.append(_fit(f"Final fit on all {result.final_fit.samples} samples", result.final_fit))
    items.append(_errors("In-sample errors of the final fit", result.in_sample_rows))
    items.append(Text(f"done in {result.seconds:.1f} s"))
    return Group(*items)


def render_links(result: LinkCalibration) -> Group:
    """What ``calibrate_links`` found: each topology's fit, the fitted links and the errors per
    (collective, config)."""
    base, opts = result.cluster, result.options
    head = Text.assemble(
        ("Links ", "bold"),
        f"{result.folder} on cluster {base.name} ({base.gpu.name}, {base.gpus_per_node} per node); "
        f"seed {opts.seed}, hold-out {opts.holdout:.0%}, loss {opts.loss}",
    )
    fits = _table("Fits (cost: weighted sum of squared log errors; the lowest is kept)",
                  "intra-node topology: fitted parameters", "evaluations", "cost", "kept")
    for t in result.topologies:
        name = f"{t.topology or 'n/a (1 GPU per node)'}: {', '.join(t.params)}"
        fits.add_row(name, str(t.evaluations), f"{t.cost:.4f}", "yes" if t is result.chosen else "")
    links = _table("Fitted links", "", *(link.side for link in result.links))
    for label, cells in (
        ("bandwidth GB/s (catalog, per GPU)", [f"{x.bandwidth_bytes_per_s / 1e9:g}" for x in result.links]),
        ("topology", [x.topology for x in result.links]),
        ("efficiency", [f"{x.efficiency:.4f}" for x in result.links]),
        ("bus bandwidth GB/s", [f"{x.bus_bytes_per_s / 1e9:.2f}" for x in result.links]),
        ("p2p_efficiency", ["-" if x.p2p_efficiency is None else f"{x.p2p_efficiency:.4f}" for x in result.links]),
        ("p2p bandwidth GB/s", [f"{x.p2p_bytes_per_s / 1e9:.2f}" for x in result.links]),
        ("latency us", [f"{x.latency_s * 1e6:.2f}" for x in result.links]),
    ):
        links.add_row(label, *cells)
    errors = _table(
        "Errors per collective and config (nodes_GPUs per node; err = predicted/measured - 1; hold-out: fit on "
        "80 % of the all-reduce/p2p rows, scored on the other 20 %; other columns: final fit on all rows; "
        "all-gathers are reported, not fitted)",
        "collective", "rows", "excluded", "fit", "hold-out\nmedian\n|err| %", *_ERR_HEADERS,
    )
    for r in result.rows:
        name = f"{r.kind} {r.config}"
        if r.errors is None:
            errors.add_row(name, str(r.rows), str(r.excluded), "-", "-", "-", "-", "-")
            continue
        hold = "-" if r.holdout_median_abs is None else f"{r.holdout_median_abs:.1f}"
        errors.add_row(name, str(r.rows), str(r.excluded), "yes" if r.fitted else "no", hold, *_stats(r.errors))
    h, a = result.holdout, result.in_sample
    summary = "".join(
        f"{side}.latency_s fitted to 0 (not identified by these message sizes): kept the catalog value "
        f"{getattr(base, side).latency_s * 1e6:g} us and refitted the rest\n"
        for side in result.chosen.kept_latency
    )
    summary += (
        f"all-reduce + p2p: hold-out median |err| {h.median_abs:.1f} %, mean {h.mean_abs:.1f} %; "
        f"all rows median {a.median_abs:.1f} %, mean {a.mean_abs:.1f} %"
    )
    if result.all_gather is not None:
        g = result.all_gather
        summary += f"\nall-gather (not fitted): median |err| {g.median_abs:.1f} %, mean {g.mean_abs:.1f} %, median err {g.median:+.1f} %"
    return Group(head, fits, links, errors, Text(summary), Text(f"done in {result.seconds:.1f} s"))


def render_curve(fit: Any, gpu: str) -> Group:
    """One fitted curve (``paraplan calibrate gemm-table`` / ``attention``) and its hold-out."""
    table = _table(f"{gpu}: {fit.precision.value} {fit.kind} curve ({fit.source})",
                   "curve", "max\nfraction", "half_work", "points", "fitted", *_ERR_HEADERS)
    table.add_row(fit.kind, f"{fit.curve.max_fraction:.4f}", f"{fit.curve.half_work:.3g}", str(fit.points),
                  str(fit.fitted), *_stats(fit.holdout))
    return Group(table, Text("errors on the held-out points; the catalog line follows", style="dim"))


def render_collective_table(fit: Any, cluster: str) -> Group:
    """Fitted collective curves of one node (``paraplan calibrate collective-table``)."""
    groups = sorted({n for f in fit.fits for n in f.curve.bus_bytes_per_s})
    table = _table(f"{cluster}: collective curves, bus GB/s per group of n GPUs ({fit.source})", "collective",
                   *(f"n={n}" for n in groups), "S 1/2\nMB", "rows", *_ERR_HEADERS)
    for f in fit.fits:
        bus = [f"{f.curve.bus_bytes_per_s[n] / 1e9:.0f}" if n in f.curve.bus_bytes_per_s else "-" for n in groups]
        table.add_row(f.kind.display, *bus, f"{f.curve.half_bytes / 1e6:.1f}", str(f.rows), *_stats(f.holdout))
    ranges = [f"{f.kind.display} n={n} {_mib(min(p))}-{_mib(max(p))}"
              for f in fit.fits for n, p in f.curve.points.items()]
    lines = ["errors on the held-out rows; the catalog block follows"]
    if ranges:
        lines.insert(0, "measured points, log-log between sizes (beyond the last: extrapolated along the curve): "
                     + ", ".join(ranges))
    return Group(table, *(Text(line, style="dim") for line in lines))


def _mib(size: int) -> str:
    return f"{size / 2**30:g} GiB" if size >= 2**30 else f"{size / 2**20:g} MiB"


def render_trace_calibration(result: Any) -> Group:
    """``paraplan calibrate trace``: every curve and link, its fitted numbers, and its errors on
    the trace's own calls before (the cluster as it was) and after the fit."""
    curves = _table(
        f"{result.cluster.gpu.name}: efficiency curves ({result.precision.value})",
        "curve", "calls", "shapes", "max\nfraction", "half\nwork", "median err %\nbefore", "median err %\nafter",
    )
    notes: list[str] = []
    for row in result.curves:
        if row.kind == "overhead":
            notes.append(row.reason)
            continue
        # a curve fitted in another precision than the job's (fp32 GEMMs on TF32 tensor cores)
        name = row.kind if row.precision in (None, result.precision) else f"{row.kind} {row.precision.value}"
        if row.fit is None:
            curves.add_row(name, str(row.calls), str(row.points), "-", "-", "-", "-")
        else:
            c = row.fit.curve
            curves.add_row(name, str(row.calls), str(row.points), f"{c.max_fraction:.4f}", f"{c.half_work:.3g}",
                           f"{row.before.median:+,.1f}", f"{row.after.median:+,.1f}")
        if row.reason:
            notes.append(f"{name}: {row.reason}")
    parts: list[Any] = [curves]
    if result.links:
        links = _table(f"{result.cluster.name}: links", "link", "calls", "sizes\nkB", "fitted",
                       "median err %\nbefore", "median err %\nafter")
        for row in result.links:
            sizes = f"{row.sizes[0] / 1e3:,.0f}-{row.sizes[1] / 1e3:,.0f}"
            fitted = ", ".join(f.removesuffix("_s") for f in row.fitted)
            links.add_row(row.side, str(row.calls), sizes, fitted, f"{row.before.median:+,.1f}",
                          f"{row.after.median:+,.1f}")
            if row.note:
                notes.append(f"{row.side}: {row.note}")
        parts.append(links)
    else:
        notes.append("links: no collective with recorded bytes (record_shapes=True) and a group of 2+: left as they were")
    if result.kernels:
        notes.append(f"kernels linked to the operator that launched them: {result.linked_kernels:,} of "
                     f"{result.kernels:,} ({100 * result.linked_fraction:.1f} %)")
    notes.append("errors: predicted/measured - 1 on the trace's own calls (median call of each shape), in-sample")
    parts.append(Text("\n".join(notes), style="dim"))
    return Group(*parts)
