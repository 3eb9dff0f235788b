"""Calibrate a cluster from one profiler trace of the user's own run.

From the rank traces of one job (recorded with ``record_shapes=True``):

- the leaf operators' timings (``traces.ops``) become inventory operators whose shapes the
  trace names, grouped by (operator, shapes) with the median time of each group (a preempted
  call does not move it); the ``gemm``, ``attention`` and ``memory`` efficiency curves are
  fitted to them with ``curves.fit_curve``, the GEMM and attention curves in the precision
  their kernels ran in: the one the kernels' names say (``kernel_classes.yaml``'s
  ``precisions``: fp32 GEMMs on TF32 tensor cores fit the tf32 curve, against the tf32 peak),
  else the job's;
- the decoded collectives (``traces.decode``: kind, bytes, group size, time) become
  collective samples: the same call on every rank of its group is one sample whose time is
  the shortest rank's (the others include waiting for the last rank to arrive); the links'
  efficiency, p2p efficiency and latency are fitted to them with ``links.fit_links``. When the
  message sizes of a link span less than a factor of ``MIN_SIZE_SPAN``, latency and
  bandwidth cannot be told apart: the latency keeps its prior value and only the efficiency
  is fitted (the result says so).

The result is the job's cluster with the fitted numbers, written as a cluster file that
``paraplan predict --cluster FILE`` (or a job's ``cluster: FILE``) loads. Nothing here looks
at the trace's iteration times: they are for validation (``paraplan validate trace``).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from paraplan.calibrate._common import US, ErrorStats, err_stats, import_extra, silent
from paraplan.calibrate.curves import (
    MIN_HALF_WORK_LOG10,
    CurveFit,
    KernelPoints,
    fit_curve,
    predict_points,
    with_curve,
)
from paraplan.calibrate.links import CollSamples, fit_links, predict_colls
from paraplan.costmodel import estimate_op_s
from paraplan.inventory import Collective, CollectiveKind, GroupLayout, Op, OpKind, ParallelDim
from paraplan.inventory.layer import attention_core, gemm
from paraplan.inventory.shapes import LocalShape
from paraplan.specs import (
    ClusterSpec,
    ConfigError,
    EfficiencyCurve,
    Job,
    ModelSpec,
    Phase,
    Precision,
    SustainedClock,
)
from paraplan.traces.decode import RankTrace, decode_trace
from paraplan.traces.ops import ELEMENT_BYTES, GEMM_OPS, OpTiming, TraceOps, trace_operators

#: A link's message sizes must span this factor for its latency to be fitted.
MIN_SIZE_SPAN = 8.0
#: Fewer distinct shapes than this leave a curve as it was.
MIN_POINTS = 3
_KINDS = {
    "all_reduce": CollectiveKind.ALL_REDUCE,
    "all_gather": CollectiveKind.ALL_GATHER,
    "reduce_scatter": CollectiveKind.REDUCE_SCATTER,
    "send": CollectiveKind.SEND_RECV,
    "recv": CollectiveKind.SEND_RECV,
    "send_recv": CollectiveKind.SEND_RECV,
}


@dataclasses.dataclass(frozen=True)
class CurveRow:
    """One efficiency curve: fitted (``fit``) or left as it was (``reason``)."""

    kind: str
    calls: int
    points: int
    before: ErrorStats | None  # the prior curve on every point
    after: ErrorStats | None  # the fitted curve on every point (in-sample)
    fit: CurveFit | None
    reason: str = ""
    precision: Precision | None = None  # the precision the curve is fitted in (None: the job's)


@dataclasses.dataclass(frozen=True)
class LinkRow:
    """One link's fitted parameters and its errors on the trace's collectives."""

    side: str
    calls: int
    samples: int
    sizes: tuple[int, int]  # smallest and largest message (bytes)
    fitted: tuple[str, ...]  # the parameters the fit moved
    before: ErrorStats
    after: ErrorStats
    note: str = ""


@dataclasses.dataclass(frozen=True)
class TraceCalibration:
    before: ClusterSpec
    cluster: ClusterSpec
    precision: Precision
    curves: tuple[CurveRow, ...]
    links: tuple[LinkRow, ...]
    files: tuple[Path, ...]
    source: str
    kernels: int = 0  # GPU kernels in the traces
    linked_kernels: int = 0  # of them attributed to the CPU operator that launched them

    @property
    def linked_fraction(self) -> float | None:
        """Kernels linked to their launching operator / kernels; None for CPU traces."""
        return self.linked_kernels / self.kernels if self.kernels else None


def calibrate_from_trace(
    files: Sequence[Path],
    job: Job,
    *,
    seed: int = 0,
    holdout: float = 0.2,
    date: str | None = None,
    log: Callable[[str], None] = silent,
) -> TraceCalibration:
    """Fit ``job.cluster``'s efficiency curves and links to the rank traces ``files``."""
    files = tuple(Path(f) for f in files)
    date = date or datetime.date.today().isoformat()
    where = ", ".join(f.name for f in files[:4]) + (f" (+{len(files) - 4})" if len(files) > 4 else "")
    source = f"fitted by paraplan calibrate trace to {files[0].parent}/{{{where}}} on {date}"
    timings: list[OpTiming] = []
    ranks: list[RankTrace] = []
    found: list[TraceOps] = []
    for path in files:
        log(f"reading {path}")
        found.append(trace_operators(path))
        timings.extend(found[-1].timings)
        ranks.append(decode_trace(path))
    if not timings:
        raise ConfigError(f"{files[0].parent}: {no_timings_reason(found)}")
    kernels, linked = sum(f.kernels for f in found), sum(f.linked for f in found)
    gpu = job.cluster.gpu
    curves: list[CurveRow] = []
    # memory first, with the per-call overhead every operator pays: a GEMM's time is the larger
    # of its compute and its memory time, plus that overhead
    gpu, overhead_row = _fit_overhead(timings, job, gpu, source)
    if overhead_row is not None:
        curves.append(overhead_row)
    for kind in ("memory", "gemm", "attention"):
        for precision, mine in _by_precision(kind, timings, job.precision):
            row = _fit_kind(kind, mine, job, gpu, seed, holdout, source, precision)  # errors before: job.cluster.gpu
            curves.append(row)
            if row.fit is not None:
                gpu = _with_curve(gpu, row.fit, source)
    for key in sorted({t.klass for t in timings if t.klass.startswith("op:")}):
        row, gpu = _fit_own_curve(key, timings, job, gpu, source)
        curves.append(row)
    eff = gpu.efficiency.model_copy(update={"source": source, **_sustained_in_trace(gpu, curves, source)})
    gpu = gpu.model_copy(update={"efficiency": eff, "sources": {**gpu.sources, "efficiency": source}})
    cluster = job.cluster.model_copy(update={"gpu": gpu})
    samples, calls = _collective_samples(ranks, job.cluster)
    cluster, links = _fit_links(samples, calls, cluster, source)
    return TraceCalibration(job.cluster, cluster, job.precision, tuple(curves), links, files, source, kernels, linked)


def _sustained_in_trace(gpu, curves: Sequence[CurveRow], source: str) -> dict:
    """A GEMM curve fitted to a training step's kernels holds that step's sustained clock: its
    GEMMs are not slowed again by a burst-to-sustained ratio (``sustained.gemm_fraction`` 1,
    the power-cap rule kept), and the prediction no longer says its GEMMs run at a burst rate."""
    if not any(row.kind == "gemm" and row.fit is not None for row in curves):
        return {}
    old = gpu.efficiency.sustained
    kept = {} if old is None else {"cap_exponent": old.cap_exponent, "cap_source": old.cap_source}
    return {"sustained": SustainedClock(
        gemm_fraction=1.0, source=f"{source}: GEMM curve fitted to a training step's kernels, at its sustained clock",
        **kept)}


def no_timings_reason(found: Sequence[TraceOps]) -> str:
    """Why rank traces yielded no operator timing to fit, in one line: no shapes recorded, no
    kernel linked to an operator, or no operator paraplan times among those with shapes."""
    kernels, linked = sum(f.kernels for f in found), sum(f.linked for f in found)
    shaped, leaf = sum(f.shaped_ops for f in found), sum(f.leaf_ops for f in found)
    if not shaped:
        return "no operator shapes in the traces: record them with torch.profiler.profile(record_shapes=True)"
    if not leaf:
        return (f"{shaped:,} operators recorded shapes but none is one paraplan times "
                f"({', '.join(sorted(GEMM_OPS))}, attention, element-wise, norms, activations)")
    if kernels and not linked:
        return (f"none of the {kernels:,} GPU kernels could be linked to the operator that launched it "
                "(no runtime launch with its correlation id, no cpu_op with its External id)")
    return (f"none of the {leaf:,} timed operators with shapes launched a linked kernel "
            f"({linked:,} of {kernels:,} kernels linked to an operator)")


# -- operators --------------------------------------------------------------------------------


def _by_precision(kind: str, timings, job_precision: Precision) -> list[tuple[Precision, list[OpTiming]]]:
    """``kind``'s calls by the precision their kernels ran in: the one their kernels' names say
    (fp32 operands on TF32 tensor cores: tf32), else the job's; the job's first, always there."""
    groups: dict[Precision, list[OpTiming]] = {job_precision: []}
    for t in timings:
        if t.klass == kind:
            said = Precision(t.precision) if t.precision and kind != "memory" else job_precision
            groups.setdefault(said, []).append(t)
    return [(p, mine) for p, mine in groups.items() if mine or p is job_precision]


def _fit_kind(kind, mine, job: Job, gpu, seed, holdout, source, precision: Precision) -> CurveRow:
    if mine and kind != "memory" and precision not in gpu.peak_flops:
        return CurveRow(kind, len(mine), 0, None, None, None,
                        f"{len(mine)} calls ran in {precision.value}, but {gpu.name} has no {precision.value} "
                        "peak in the catalog: left as it was", precision)
    points = _points(kind, mine, job, source, precision)
    if points is None:
        return CurveRow(kind, len(mine), 0, None, None, None, _unpriced(mine), precision)
    every = list(range(len(points.ops)))
    original = job.cluster.gpu
    prior = _curve_of(original, kind, points.precision)
    before = err_stats(predict_points(points, original, prior, every), points.seconds)
    both = _distinct_work(points) >= MIN_POINTS
    fit = fit_curve(points, gpu, seed=seed, holdout=holdout if len(every) >= 5 else 1e-9, fit_half_work=both,
                    loss="soft_l1")  # a page-faulting or preempted call is an outlier, not the rule
    after = err_stats(predict_points(points, gpu, fit.curve, every), points.seconds)
    reason = "" if both else f"fewer than {MIN_POINTS} sizes: max_fraction fitted, half_work at its floor"
    if fit.curve.max_fraction >= 0.999:
        reason = _AT_PEAK
    return CurveRow(kind, len(mine), len(points.ops), before, after, fit, reason, precision)


def _unpriced(mine: list[OpTiming]) -> str:
    """Why a curve's calls gave no point: none linked, or none of a shape or type it prices."""
    if not mine:
        return "no linked call with shapes in the traces: left as it was"
    types = sorted({t.dtype for t in mine if t.dtype not in ELEMENT_BYTES})
    why = f"element type {', '.join(types)} unknown" if types else "shapes it cannot price"
    return f"{len(mine)} calls, none usable ({why}): left as it was"


_AT_PEAK = "runs at the nominal peak or faster: the GPU's peak is too low for these calls"


def _fit_overhead(timings, job: Job, gpu, source: str):
    """``kernel_overhead_s``, fitted together with the memory curve to the streaming
    operators when they come in enough sizes (the smallest calls are all overhead, the largest
    all bandwidth); the memory curve is then fitted again on its own with it fixed. Returns the
    GPU with the overhead and a table row (None when it stays as it was)."""
    points = _points("memory", [t for t in timings if t.klass == "memory"], job, source)
    if points is None or _distinct_work(points) < MIN_POINTS:
        return gpu, None
    least_squares = import_extra("scipy.optimize").least_squares
    every = list(range(len(points.ops)))

    def trial(p: np.ndarray):
        eff = gpu.efficiency.model_copy(update={"kernel_overhead_s": float(p[2]) * US})
        return gpu.model_copy(update={"efficiency": eff}), EfficiencyCurve(max_fraction=float(p[0]),
                                                                         half_work=float(10 ** p[1]))

    def residuals(p: np.ndarray) -> np.ndarray:
        g, curve = trial(p)
        return np.log(predict_points(points, g, curve, every) / points.seconds)

    bounds = ([0.01, MIN_HALF_WORK_LOG10, 0.0], [1.0, 13.0, 1e3])
    starts = ([0.5, 4.0, overhead_us] for overhead_us in (0.5, 2.0, 8.0))  # the loss is not convex in it
    result = min((least_squares(residuals, x0, bounds=bounds, loss="soft_l1", f_scale=0.1, x_scale="jac")
                  for x0 in starts), key=lambda r: r.cost)
    fitted, _ = trial(result.x)
    before_us = gpu.efficiency.kernel_overhead_s / US
    note = f"per-call overhead (kernel_overhead_s) {before_us:.2f} -> {result.x[2]:.2f} us, fitted with the memory curve"
    row = CurveRow("overhead", len(points.ops), len(points.ops), None, None, None, note)
    return fitted, row


def _distinct_work(points: KernelPoints) -> int:
    return len({round(op.work(phase)[0] or op.work(phase)[1]) for op, phase in zip(points.ops, points.phases,
                                                                                   strict=True)})


def _fit_own_curve(key: str, timings, job: Job, gpu, source: str):
    """An operator's own memory curve (``EfficiencySpec.ops``): max_fraction in closed form
    (geometric mean over its calls' shapes), half_work at the floor, as ``fit_curve`` does
    with one size."""
    name = key.removeprefix("op:")
    base, _, direction = name.partition(":")
    # the key the cost model reads for this direction (roofline.op_curves takes "name:fwd"
    # before "name"): a curve under "name" beside the catalog's "name:fwd" would never be used
    written = f"{base}:fwd" if not direction and f"{base}:fwd" in gpu.efficiency.ops else name
    phase = Phase.BWD_INPUT if direction == "bwd" else Phase.FWD
    mine = [t for t in timings if t.klass == key]
    groups: dict[tuple, list[float]] = defaultdict(list)
    for t in mine:
        if t.dtype in ELEMENT_BYTES:
            groups[(t.dims, t.dtype)].append(t.seconds)
    ops, seconds = [], []
    for (dims, dtype), times in groups.items():
        traffic = _memory_op(base, dims, ELEMENT_BYTES[dtype], job.model).bytes
        ops.append(Op(name=base, kind=OpKind.NORM, role=name, flops=0.0, bytes=traffic, bwd_flops=0.0,
                      bwd_bytes=traffic))
        seconds.append(statistics.median(times))
    measured = np.array(seconds)
    overhead = gpu.efficiency.kernel_overhead_s
    half = 10**MIN_HALF_WORK_LOG10
    usable = [(op, t) for op, t in zip(ops, seconds, strict=True) if t > overhead]
    if not usable:
        return CurveRow(name, len(mine), len(ops), None, None, None, "no call longer than the kernel overhead"), gpu
    rate = gpu.hbm_bandwidth_bytes_per_s
    fractions = [(op.bytes + half) / (rate * (t - overhead)) for op, t in usable]
    curve = EfficiencyCurve(max_fraction=float(min(1.0, math.exp(np.mean(np.log(fractions))))), half_work=half,
                            source=source)
    before = err_stats(_own_predictions(ops, phase, job.cluster.gpu, job.precision), measured)
    eff = gpu.efficiency.model_copy(update={"ops": {**gpu.efficiency.ops, written: curve}})
    gpu = gpu.model_copy(update={"efficiency": eff})
    after = err_stats(_own_predictions(ops, phase, gpu, job.precision), measured)
    fit = CurveFit(written, job.precision, curve, len(ops), len(ops), after, source)
    reason = _AT_PEAK if curve.max_fraction >= 0.999 else "own curve (ops:), half_work at its floor"
    return CurveRow(name, len(mine), len(ops), before, after, fit, reason), gpu


def _own_predictions(ops, phase, gpu, precision) -> np.ndarray:
    peak = gpu.flops_for(precision)
    return np.array([estimate_op_s(op, phase, gpu, peak, precision) for op in ops])


def _points(kind: str, timings: list[OpTiming], job: Job, source: str,
            precision: Precision | None = None) -> KernelPoints | None:
    """The calls of one curve as inventory operators, one per (operator, shapes, element type)
    with its median time; fitted in ``precision`` (default: the job's)."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for t in timings:
        groups[(t.name, t.backward, t.dims, t.dtype)].append(t.seconds)
    ops, phases, seconds = [], [], []
    for (name, backward, dims, dtype), times in groups.items():
        e = ELEMENT_BYTES.get(dtype)
        made = None if e is None else _OP_MAKERS[kind](name, dims, e, job.model)
        if made is None:
            continue
        ops.append(made)
        phases.append(Phase.BWD_INPUT if backward and kind == "attention" else Phase.FWD)
        seconds.append(statistics.median(times))
    if not ops:
        return None
    return KernelPoints(kind, precision or job.precision, ops, phases, np.array(seconds), source)


def _gemm_op(name: str, dims, e: int, model: ModelSpec) -> Op | None:
    two = [d for d in dims if len(d) == len(dims[-1])][-2:]
    if len(two) != 2 or len(two[0]) not in (2, 3):
        return None
    a, b = two
    batch = a[0] if len(a) == 3 else 1
    m, k, n = a[-2], a[-1], b[-1]
    op = gemm("gemm", name, batch * m, k, n, e, bias=False, saved=0.0)
    return dataclasses.replace(op, bytes=float(batch * e * (m * k + k * n + m * n)))


def _attention_op(name: str, dims, e: int, model: ModelSpec) -> Op | None:
    q, k = dims[0], dims[1] if len(dims) > 1 else dims[0]
    if len(q) != 4 or len(k) != 4:
        return None
    b, heads, s, d = q
    x = LocalShape(b=b, s=s, s_kv=k[2], s_norm=s, h=heads * d, heads=heads, groups=k[1], d=d, ffn=1, vocab=1,
                   tp=1, e=e)
    flash = model.model_copy(update={"attention": "flash"})
    return attention_core(flash, x)[0]  # causal: the model's attention masks (GPT), as paraplan counts


def _memory_op(name: str, dims, e: int, model: ModelSpec) -> Op | None:
    elems = [math.prod(d) for d in dims]
    traffic = float(e * (sum(elems) + max(elems)))  # every input read, one output written
    return Op(name=name, kind=OpKind.ELEMENTWISE, role=name, flops=0.0, bytes=traffic, bwd_flops=0.0, bwd_bytes=0.0)


_OP_MAKERS = {"gemm": _gemm_op, "attention": _attention_op, "memory": _memory_op}


def _curve_of(gpu, kind: str, precision: Precision):
    eff = gpu.efficiency
    return eff.memory if kind == "memory" else eff.compute_curve(kind, precision)


def _with_curve(gpu, fit: CurveFit, source: str):
    """``gpu`` with the fitted curve, which carries its points fitted and held out and, when
    some were held out, their median |error| (what ``uncertainty`` narrows an interval by)."""
    held = fit.points - fit.fitted
    measured = {"fitted": fit.fitted, "held_out": held,
                "held_out_median_err": round(fit.holdout.median_abs / 100.0, 4) if held else None}
    return with_curve(gpu, fit.kind, fit.precision, fit.curve.model_copy(update={"source": source, **measured}),
                      source)


# -- collectives ------------------------------------------------------------------------------


def _collective_samples(ranks: list[RankTrace], cluster: ClusterSpec) -> tuple[CollSamples, int]:
    """The samples and the number of calls behind them. A call is the same (step, kind, group,
    n-th call) on every rank, timed by the rank that waited least."""
    calls: dict[tuple, list[float]] = defaultdict(list)
    shape: dict[tuple, tuple[int, int]] = {}
    for rank in ranks:
        seen: dict[tuple, int] = defaultdict(int)
        for c in rank.collectives:
            kind = _KINDS.get(c.kind)
            if kind is None or c.bytes is None or not c.group_size or c.group_size < 2:
                continue
            # a send pairs with its peer's receive: both are the n-th p2p call of the step
            base = (c.step, "send_recv" if kind is CollectiveKind.SEND_RECV else c.kind, c.group)
            key = (*base, seen[base])
            seen[base] += 1
            calls[key].append(c.duration_s)
            shape[key] = (_nccl_bytes(kind, c.bytes, c.group_size), c.group_size)
    # one sample per (kind, bytes, group size): the median call (a preempted call does not move it)
    groups: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    for key, times in calls.items():
        groups[(key[1], *shape[key])].append(min(times))
    rows: dict[str, list] = {"config": [], "tag": [], "coll": [], "layout": [], "measured": []}
    for (name, nbytes, size), times in groups.items():
        per_node = min(size, cluster.gpus_per_node)
        rows["config"].append(f"{size}")
        rows["tag"].append(name)
        rows["coll"].append(Collective(name, _KINDS[name], ParallelDim.DP, float(nbytes), Phase.FWD))
        rows["layout"].append(GroupLayout(size, math.ceil(size / per_node), per_node))
        rows["measured"].append(statistics.median(times))
    samples = CollSamples(rows["config"], rows["tag"], rows["coll"], rows["layout"], np.asarray(rows["measured"]))
    return samples, sum(len(t) for t in groups.values())


def _nccl_bytes(kind: CollectiveKind, input_bytes: int, size: int) -> int:
    """nccl-tests' size convention (``inventory.Collective``): an all-gather's whole output."""
    return input_bytes * size if kind is CollectiveKind.ALL_GATHER else input_bytes


def _fit_links(samples: CollSamples, calls: int, cluster: ClusterSpec, source: str) -> tuple[ClusterSpec, tuple[LinkRow, ...]]:
    if not len(samples):
        return cluster, ()
    fixed: set[tuple[str, str]] = set()
    notes: dict[str, str] = {}
    for side, crosses in (("intra_node", False), ("inter_node", True)):
        sizes = [c.bytes for c, lay in zip(samples.coll, samples.layout, strict=True) if lay.crosses_nodes == crosses]
        if sizes and max(sizes) < MIN_SIZE_SPAN * min(sizes):
            fixed.add((side, "latency_s"))
            link = getattr(cluster, side)
            notes[side] = (
                f"messages of {min(sizes) / 1e3:,.0f}-{max(sizes) / 1e3:,.0f} kB (less than {MIN_SIZE_SPAN:g}x apart): "
                f"latency kept at {link.latency_s / US:g} us, efficiency fitted"
            )
    before = predict_colls(samples, cluster)
    fitted, params, _ = fit_links(samples, cluster, loss="linear", fixed=frozenset(fixed))
    after = predict_colls(samples, fitted)
    updates = {}
    rows = []
    for side, crosses in (("intra_node", False), ("inter_node", True)):
        mask = np.array([lay.crosses_nodes == crosses for lay in samples.layout])
        names = tuple(f for s, f in params.names if s == side)
        if not mask.any() or not names:
            continue
        link = getattr(fitted, side)
        updates[side] = link.model_copy(update={"source": source})
        sizes = [int(c.bytes) for c, m in zip(samples.coll, mask, strict=True) if m]
        rows.append(LinkRow(
            side, calls, int(mask.sum()), (min(sizes), max(sizes)), names,
            err_stats(before[mask], samples.measured[mask]), err_stats(after[mask], samples.measured[mask]),
            notes.get(side, ""),
        ))
    sources = {**fitted.sources, **{f"{side}_efficiency": source for side in updates}}
    return fitted.model_copy(update={**updates, "sources": sources}), tuple(rows)
