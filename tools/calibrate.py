#!/usr/bin/env python3
"""Calibrate the analytical cost model from measured single-operator and NCCL samples.

Two commands (run from the repository root with ``PYTHONPATH=src``):

``operators DIR --gpu NAME``
    Reads every GPUModeling operator CSV in DIR, maps each row onto the inventory operator
    paraplan uses (``paraplan.inventory.samples.op_for_sample``) and fits the GPU's
    ``EfficiencySpec`` with ``scipy.optimize.least_squares`` on log(predicted / measured),
    forward and backward samples alike: the gemm, attention and memory curves, the per-kernel
    overhead and, by default (``--op-curves memory+bmm``), one per-operator curve
    (``EfficiencySpec.ops["<op>:<fwd|bwd>"]``) for every memory-bound operator and direction
    with at least 40 samples and for bmm/baddbmm. The kind-level memory curve, the default of
    memory-bound operators without a curve of their own, is fitted on the single-kernel
    operators (gelu, res_add, softmax). Every prediction goes through
    ``paraplan.costmodel.estimate_op_s`` with a copy of the catalog GPU whose ``efficiency`` is
    the trial value, so the fitted numbers mean exactly what the cost model does with them.
    Reports per-operator, per-phase errors on a random 20 % hold-out (fit on the other 80 %),
    side by side with a comparison fit (``--compare``, default kind curves only), refits on
    everything and prints the YAML ``efficiency:`` block (``--update-catalog`` also writes it
    into the GPU's catalog file, replacing only that block).

``links DIR --cluster NAME``
    Reads the NCCL CSVs (``<GPU>_<collective>_fp16_<N>_<M>.csv``), converts each row to a
    paraplan ``Collective`` (nccl-tests size convention) on a ``GroupLayout`` of N nodes x M
    GPUs, and fits the cluster's intra- and inter-node link efficiency, p2p efficiency and
    latency so that ``paraplan.costmodel.estimate_collective_s`` matches the all-reduce and
    send/recv samples. All-gather samples are predicted and reported, never fitted.

Rows that cannot be trusted are excluded by explicit rules and every exclusion is counted in
the output. Nothing end to end (``runs_*.json``) is read.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares
from scipy.sparse import lil_matrix

from paraplan.catalog import load_cluster, load_gpu
from paraplan.catalog.loader import _key as _catalog_key
from paraplan.costmodel import estimate_collective_s, estimate_op_s
from paraplan.costmodel.roofline import op_curves
from paraplan.inventory import Collective, CollectiveKind, GroupLayout, Op, OpKind
from paraplan.inventory.samples import SAMPLE_TAGS, op_for_sample
from paraplan.samples.gpumodeling import (
    NCCL_FILE,
    NCCL_KINDS,
    collective_for_row,
    group_layout,
    ideal_cluster,
)
from paraplan.specs import ClusterSpec, EfficiencyCurve, EfficiencySpec, GpuSpec, LinkSpec, Phase, Precision

SCRIPT = "tools/calibrate.py"
REPO = Path(__file__).resolve().parents[1]
US = 1e-6

# Which efficiency curve an operator kind is fitted on (the memory curve also bounds every
# compute kernel through the roofline max()).
GEMM_KINDS = {OpKind.GEMM, OpKind.BMM}
ATTENTION_KINDS = {OpKind.ATTENTION}


def _rel_path(path: Path) -> str:
    """``path`` relative to the repository's parent (``shared/data/...``) when possible."""
    path = path.resolve()
    for base in (REPO, REPO.parent):
        try:
            return str(path.relative_to(base))
        except ValueError:
            continue
    return str(path)


def _table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """A plain fixed-width text table (also valid Markdown)."""
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def fmt(r: list[str]) -> str:
        return (
            "| "
            + " | ".join(
                c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
            + " |"
        )

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([fmt(cells[0]), sep, *(fmt(r) for r in cells[1:])])


def _err_stats(pred: np.ndarray, meas: np.ndarray) -> tuple[float, float, float]:
    """(median |err| %, mean |err| %, median signed err %) with err = pred/measured - 1."""
    err = pred / meas - 1.0
    return (
        float(np.median(np.abs(err)) * 100),
        float(np.mean(np.abs(err)) * 100),
        float(np.median(err) * 100),
    )


def _split_mask(keys: Sequence[object], fraction: float, seed: int) -> np.ndarray:
    """True for hold-out samples: a random ``fraction`` of the distinct ``keys`` (a repeated
    grid point, or the fwd and bwd of one row, stay on the same side)."""
    uniq = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    draw = np.random.default_rng(seed).random(len(uniq)) < fraction
    return np.array([draw[uniq[k]] for k in keys], dtype=bool)


# ----------------------------------------------------------------------------------------
# operators
# ----------------------------------------------------------------------------------------

_OP_FILE = re.compile(r"^(?P<gpu>[^_]+)_(?P<tag>.+)_fp16\.csv$")
_SHAPE_COLUMNS = ("mp", "b", "h", "l", "dim", "Vp")
_FWD, _BWD = "fwd", "bwd"


@dataclasses.dataclass
class OpSamples:
    """Flat arrays of operator samples; ``ops[i]`` timed in ``phase[i]`` took ``measured[i]`` s."""

    tag: list[str] = dataclasses.field(default_factory=list)
    phase: list[str] = dataclasses.field(default_factory=list)
    ops: list[Op] = dataclasses.field(default_factory=list)
    key: list[tuple] = dataclasses.field(default_factory=list)
    measured: list[float] = dataclasses.field(default_factory=list)

    def add(self, tag: str, phase: str, op: Op, key: tuple, seconds: float) -> None:
        self.tag.append(tag)
        self.phase.append(phase)
        self.ops.append(op)
        self.key.append(key)
        self.measured.append(seconds)

    def subset(self, mask: np.ndarray) -> OpSamples:
        idx = np.flatnonzero(mask)
        return OpSamples(
            [self.tag[i] for i in idx],
            [self.phase[i] for i in idx],
            [self.ops[i] for i in idx],
            [self.key[i] for i in idx],
            [self.measured[i] for i in idx],
        )

    def __len__(self) -> int:
        return len(self.ops)


def load_operator_samples(
    folder: Path, gpu: GpuSpec, log: Callable[[str], None], excluded: list[str] | None = None
) -> OpSamples:
    """Every usable (operator, phase, measured time) of the CSVs in ``folder``.

    Exclusion rules (each reported with a count):
    - tuning tables (``<GPU>.csv``) are regressor settings, not measurements;
    - optimizer files (``*optimizer*``) are out of scope for the per-kernel curves;
    - tags paraplan's inventory has no operator for (``fillmask``: the causal mask is fused
      into the softmax) are skipped;
    - files named for another GPU are skipped;
    - a time that is NaN or not positive is excluded;
    - a backward column that equals the forward column in >= 90 % of a file's rows is a copy
      (the sampler wrote F_dur twice for ``res_add``): the backward samples are excluded;
    - a ``flash_atten`` backward whose median B/F ratio is below 1 cannot be a full backward
      (it runs 2.5x the forward's FLOPs; A100 shows ~3): the file's backward is excluded;
    - a row whose shape cannot be built (``op_for_sample`` raises) is excluded.

    ``excluded`` (when given) collects one short note per excluded group of samples.
    """
    excluded = [] if excluded is None else excluded
    samples = OpSamples()
    files = sorted(folder.glob("*.csv"))
    if not files:
        raise SystemExit(f"no CSV files in {folder}")
    for path in files:
        match = _OP_FILE.match(path.name)
        if match is None:
            log(f"  skip {path.name}: not an operator timing file (regressor tuning table)")
            continue
        tag = match["tag"]
        if "optimizer" in tag:
            log(f"  skip {path.name}: optimizer step, out of scope for the kernel efficiency curves")
            continue
        if tag not in SAMPLE_TAGS:
            log(f"  skip {path.name}: tag {tag!r} has no inventory operator (mask fused into softmax)")
            continue
        try:
            file_gpu = load_gpu(match["gpu"]).name
        except Exception:  # an unknown GPU name is reported below, not fatal
            file_gpu = match["gpu"]
        if _catalog_key(file_gpu) != _catalog_key(gpu.name):
            log(f"  skip {path.name}: measured on {file_gpu}, not {gpu.name}")
            continue
        frame = pd.read_csv(path)
        cols = [c for c in _SHAPE_COLUMNS if c in frame.columns]
        times = {_FWD: "F_dur(us)", _BWD: "B_dur(us)"}
        notes: list[str] = []
        use = {_FWD: True, _BWD: True}
        fwd, bwd = frame[times[_FWD]].to_numpy(float), frame[times[_BWD]].to_numpy(float)
        if np.mean(fwd == bwd) >= 0.9:
            use[_BWD] = False
            notes.append(f"{len(frame)} bwd excluded (B_dur is a copy of F_dur)")
            excluded.append(f"{len(frame)} {tag} bwd (copy of fwd)")
        if tag == "flash_atten":
            ratio = float(np.nanmedian(bwd / fwd))
            if ratio < 1.0:
                use[_BWD] = False
                notes.append(
                    f"{len(frame)} bwd excluded (median B/F = {ratio:.2f} < 1: backward not fully captured)"
                )
                excluded.append(f"{len(frame)} {tag} bwd (B/F {ratio:.2f}: not fully captured)")
        bad = {ph: 0 for ph in times}
        unbuildable = 0
        for rec in frame.to_dict("records"):
            shape = {c: rec[c] for c in cols}
            try:
                op = op_for_sample(tag, shape)
            except ValueError:
                unbuildable += 1
                continue
            key = (tag, *(shape[c] for c in cols))
            for ph, col in times.items():
                if not use[ph]:
                    continue
                value = rec[col]
                if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                    bad[ph] += 1
                    continue
                samples.add(tag, ph, op, key, value * US)
        if bad[_FWD] or bad[_BWD]:
            notes.append(f"{bad[_FWD]} fwd + {bad[_BWD]} bwd excluded (NaN or non-positive time)")
            excluded.append(f"{bad[_FWD] + bad[_BWD]} {tag} (NaN/non-positive time)")
        if unbuildable:
            notes.append(f"{unbuildable} rows excluded (shape not buildable)")
            excluded.append(f"{unbuildable} {tag} rows (shape not buildable)")
        log(f"  {path.name}: {len(frame)} rows" + ("; " + "; ".join(notes) if notes else ""))
    return samples


# Parameter vector: [gemm max_fraction, log10 gemm half_work, attention ..., memory ...,
# kernel overhead in us], then (max_fraction, log10 half_work) of every per-operator curve in
# ``ParamLayout.keys`` order.
_CURVES = ("gemm", "attention", "memory")
_OVERHEAD = 6
_KIND_LOWER = np.array([0.01, 0.0, 0.01, 0.0, 0.01, 0.0, 0.0])
_KIND_UPPER = np.array([1.0, 13.0, 1.0, 13.0, 1.0, 10.0, 100.0])
# A per-operator curve: max_fraction in [0.005, 1] (GPT-NeoX's unfused RMSNorm backward reaches
# ~0.05 of HBM bandwidth on the inventory's bytes), log10 half_work in FLOPs (compute kinds) or
# bytes (memory-bound kinds).
_OP_LOWER = (0.005, 0.0)
_OP_UPPER = {True: (1.0, 13.0), False: (1.0, 10.0)}

#: Operator tags whose pooled samples fit the kind-level ``memory`` curve, the default for a
#: memory-bound operator without a curve of its own: the memory-bound operators that run as a
#: single kernel (GELU, the residual add, the softmax; the fused and the plain softmax both map
#: onto the inventory's ``softmax``). The unfused multi-kernel operators (RMSNorm, RoPE, ...)
#: would drag a shared curve down to a fraction no single kernel runs at.
DEFAULT_MEMORY_TAGS = ("gelu", "res_add", "softmax", "ScaledUpperTriangMaskedSoftmax")

#: ``--op-curves`` modes: which (operator, direction) groups get a per-operator curve
#: (``EfficiencySpec.ops``) when they have at least ``--min-samples`` samples.
#: none = kind curves only (the fit before per-operator curves existed); memory = every
#: memory-bound operator; memory+bmm = those plus bmm/baddbmm (default); all = every operator,
#: GEMMs and flash attention included.
OP_CURVE_MODES = ("none", "memory", "memory+bmm", "all")

#: The two sampled implementations of the inventory's one ``softmax`` operator: PyTorch's
#: softmax (GPT-NeoX's default path, ``scaled_upper_triang_masked_softmax_fusion = False``,
#: sampled over the whole grid; the mask is a separate ``fillmask`` kernel) and Megatron's fused
#: causal-mask softmax (``mp`` = 1, ``l`` <= 2048 only). Only one of them can own the
#: ``softmax`` curve (``--softmax-curve``); the other still fits the kind-level memory curve.
SOFTMAX_TAGS = ("softmax", "ScaledUpperTriangMaskedSoftmax")

_COMPUTE = GEMM_KINDS | ATTENTION_KINDS


def _wants_curve(op: Op, mode: str) -> bool:
    if mode == "none":
        return False
    if op.kind not in _COMPUTE:
        return True
    return mode == "all" or (mode == "memory+bmm" and op.kind is OpKind.BMM)


def op_curve_keys(
    samples: OpSamples, mode: str, min_samples: int, excluded_tags: Collection[str] = ()
) -> dict[str, bool]:
    """``"<op name>:<fwd|bwd>"`` -> whether its curve is a compute (FLOPs) curve, for every
    (operator, direction) of ``samples`` that ``mode`` selects and that has at least
    ``min_samples`` samples. Keyed by the inventory operator's name (what the cost model looks
    up), so tags that map onto the same operator (both softmax implementations) share one.
    Samples of ``excluded_tags`` do not count."""
    counts: Counter[tuple[str, str]] = Counter()
    first: dict[str, Op] = {}
    for tag, op, ph in zip(samples.tag, samples.ops, samples.phase, strict=True):
        if tag in excluded_tags:
            continue
        counts[(op.name, ph)] += 1
        first.setdefault(op.name, op)
    keys = {}
    for (name, ph), n in sorted(counts.items()):
        op = first[name]
        if n >= min_samples and _wants_curve(op, mode):
            keys[f"{name}:{ph}"] = op.kind in _COMPUTE
    return keys


@dataclasses.dataclass(frozen=True)
class ParamLayout:
    """Where each free number of an ``EfficiencySpec`` sits in the fit's parameter vector."""

    keys: tuple[str, ...] = ()
    compute: tuple[bool, ...] = ()  # per key: half_work in FLOPs (True) or bytes

    @classmethod
    def for_keys(cls, keys: dict[str, bool]) -> ParamLayout:
        return cls(tuple(keys), tuple(keys.values()))

    @property
    def size(self) -> int:
        return 7 + 2 * len(self.keys)

    def index(self, key: str) -> int:
        """Index of the max_fraction of per-operator curve ``key`` (its log10 half_work follows)."""
        return 7 + 2 * self.keys.index(key)

    @property
    def lower(self) -> np.ndarray:
        return np.concatenate([_KIND_LOWER, np.tile(_OP_LOWER, len(self.keys))])

    @property
    def upper(self) -> np.ndarray:
        return np.concatenate([_KIND_UPPER, *(np.array(_OP_UPPER[c]) for c in self.compute)])

    def spec(self, theta: np.ndarray, source: str) -> EfficiencySpec:
        curves = {
            name: EfficiencyCurve(max_fraction=float(theta[2 * i]), half_work=float(10.0 ** theta[2 * i + 1]))
            for i, name in enumerate(_CURVES)
        }
        ops = {
            key: EfficiencyCurve(
                max_fraction=float(theta[self.index(key)]),
                half_work=float(10.0 ** theta[self.index(key) + 1]),
            )
            for key in self.keys
        }
        return EfficiencySpec(
            **curves, ops=ops, kernel_overhead_s=float(theta[_OVERHEAD]) * US, source=source
        )

    def theta(self, spec: EfficiencySpec, init: dict[str, EfficiencyCurve] | None = None) -> np.ndarray:
        """``spec`` as a parameter vector; a key missing from ``spec.ops`` starts at ``init[key]``."""
        out: list[float] = []
        for name in _CURVES:
            curve: EfficiencyCurve = getattr(spec, name)
            out += [curve.max_fraction, math.log10(max(curve.half_work, 1.0))]
        out.append(spec.kernel_overhead_s / US)
        for key in self.keys:
            curve = spec.ops.get(key) or (init or {}).get(key) or spec.memory
            out += [curve.max_fraction, math.log10(max(curve.half_work, 1.0))]
        return np.clip(np.array(out), self.lower, self.upper)

    def sentinel(self) -> EfficiencySpec:
        """A spec whose every curve has a distinct half_work (its parameter index), so that
        ``op_curves`` tells which parameters an operator's time depends on."""
        theta = np.full(self.size, 0.5)
        theta[_OVERHEAD] = 1.0
        half_work_idx = [1, 3, 5] + [self.index(key) + 1 for key in self.keys]
        for i in half_work_idx:
            theta[i] = math.log10(i)  # half_work = the parameter index of that half_work
        return self.spec(theta, "sentinel")

    def depends(self, op: Op, phase: str, *, kind_curves_only: bool = False) -> list[int]:
        """Parameter indices the cost model's time of ``op`` in ``phase`` depends on, as
        ``paraplan.costmodel.roofline.op_curves`` picks the curves."""
        eff = self.sentinel()
        if kind_curves_only:
            eff = eff.model_copy(update={"ops": {}})
        phases = [Phase.FWD] if phase == _FWD else [Phase.BWD_INPUT, Phase.BWD_WEIGHT]
        idx = {_OVERHEAD}
        for ph in phases:
            flops, traffic = op.work(ph)
            compute, memory, _ = op_curves(op, ph, eff)
            if compute is not None and flops > 0:
                i = round(compute.half_work)
                idx |= {i - 1, i}
            if traffic > 0:
                i = round(memory.half_work)
                idx |= {i - 1, i}
        return sorted(idx)

    def names(self) -> list[str]:
        out = []
        for name in _CURVES:
            out += [f"{name}.max_fraction", f"{name}.log10_half_work"]
        out.append("kernel_overhead_us")
        for key in self.keys:
            out += [f"ops[{key}].max_fraction", f"ops[{key}].log10_half_work"]
        return out


def predict_ops(samples: OpSamples, gpu: GpuSpec, peak: float) -> np.ndarray:
    """Seconds the cost model gives each sample: FWD for forward rows, BWD_INPUT + BWD_WEIGHT
    (the two backward kernels of one autograd node) for backward rows."""
    out = np.empty(len(samples))
    for i, (op, ph) in enumerate(zip(samples.ops, samples.phase, strict=True)):
        if ph == _FWD:
            out[i] = estimate_op_s(op, Phase.FWD, gpu, peak)
        else:
            out[i] = estimate_op_s(op, Phase.BWD_INPUT, gpu, peak) + estimate_op_s(
                op, Phase.BWD_WEIGHT, gpu, peak
            )
    return out


def _group_weights(groups: Sequence[object]) -> np.ndarray:
    """1/sqrt(n) per sample of a group of n, so every group weighs the same in the loss."""
    groups = list(groups)
    counts = Counter(groups)
    return 1.0 / np.sqrt(np.array([counts[g] for g in groups], dtype=float))


def _per_op_start(
    samples: OpSamples,
    layout: ParamLayout,
    gpu: GpuSpec,
    peak: float,
    start: EfficiencySpec,
    excluded_tags: Collection[str] = (),
) -> dict[str, EfficiencyCurve]:
    """Starting curve of each per-operator key: the median fraction of peak (FLOP/s for compute
    curves, HBM bandwidth for memory curves) its slower half of samples reached, and the kind
    curve's half_work."""
    out = {}
    names, phases = [op.name for op in samples.ops], samples.phase
    meas = np.asarray(samples.measured)
    for key, compute in zip(layout.keys, layout.compute, strict=True):
        name, ph = key.rsplit(":", 1)
        idx = [
            i
            for i in range(len(samples))
            if names[i] == name and phases[i] == ph and samples.tag[i] not in excluded_tags
        ]
        works = []
        for i in idx:
            op = samples.ops[i]
            parts = (
                [op.work(Phase.FWD)] if ph == _FWD else [op.work(Phase.BWD_INPUT), op.work(Phase.BWD_WEIGHT)]
            )
            works.append(sum(w[0 if compute else 1] for w in parts))
        w, t = np.array(works), meas[idx]
        big = t >= np.median(t)
        rate = peak if compute else gpu.hbm_bandwidth_bytes_per_s
        frac = float(np.clip(np.median(w[big] / t[big]) / rate, 0.02, 1.0))
        kind = start.gemm if compute else start.memory
        out[key] = EfficiencyCurve(max_fraction=frac, half_work=kind.half_work)
    return out


@dataclasses.dataclass
class _Group:
    """One (tag, phase) group of samples in the loss; its predictions are cached per value of
    the parameters it depends on, so a finite-difference step in one per-operator curve
    re-evaluates only the groups that use it."""

    samples: OpSamples
    meas: np.ndarray
    weight: float
    params: np.ndarray
    kind_curves_only: bool
    cache: dict = dataclasses.field(default_factory=dict)


def fit_efficiency(
    samples: OpSamples,
    gpu: GpuSpec,
    peak: float,
    start: EfficiencySpec,
    *,
    loss: str,
    max_nfev: int,
    layout: ParamLayout | None = None,
    default_memory_tags: Sequence[str] = DEFAULT_MEMORY_TAGS,
    fix_overhead: bool = False,
    curve_excluded_tags: Collection[str] = (),
) -> tuple[EfficiencySpec, object]:
    """least_squares on weighted log(pred/measured) over the kind curves, the kernel overhead
    and the per-operator curves of ``layout``; curves no sample depends on stay at ``start``.

    The residuals are every sample predicted by ``estimate_op_s`` with the trial spec, plus,
    for the tags in ``default_memory_tags`` whose operator has a curve of its own, the same
    samples predicted with the kind curves only (``ops`` emptied): that second block is what
    fits the kind-level ``memory`` curve, the default of memory-bound operators without a
    curve (it also bounds the GEMM-like kernels through the roofline max()). Each (tag, phase)
    group of each block weighs the same (1/sqrt(n) per sample). ``fix_overhead`` keeps
    ``start.kernel_overhead_s`` instead of fitting it. Samples of ``curve_excluded_tags``
    (an implementation that does not own its operator's curve) stay out of the first block
    when their operator has a curve.
    """
    layout = layout or ParamLayout()
    theta0 = layout.theta(start, _per_op_start(samples, layout, gpu, peak, start, curve_excluded_tags))
    tags, phases = np.asarray(samples.tag), np.asarray(samples.phase)
    groups: list[_Group] = []
    for tag in dict.fromkeys(samples.tag):
        for ph in (_FWD, _BWD):
            m = (tags == tag) & (phases == ph)
            if not m.any():
                continue
            sub = samples.subset(m)
            meas = np.asarray(sub.measured)
            weight = 1.0 / math.sqrt(len(sub))
            params = layout.depends(sub.ops[0], ph)
            kind_params = layout.depends(sub.ops[0], ph, kind_curves_only=True)
            if tag not in curve_excluded_tags or kind_params == params:
                groups.append(_Group(sub, meas, weight, np.array(params), False))
            if tag in default_memory_tags and kind_params != params:
                groups.append(_Group(sub, meas, weight, np.array(kind_params), True))
    used = sorted(set().union(*(set(g.params.tolist()) for g in groups)))
    free = np.zeros(layout.size, dtype=bool)
    free[used] = True
    if fix_overhead:
        free[_OVERHEAD] = False
    col = -np.ones(layout.size, dtype=int)
    col[free] = np.arange(int(free.sum()))

    rows = sum(len(g.samples) for g in groups)
    sparsity = lil_matrix((rows, int(free.sum())), dtype=int)
    r = 0
    for g in groups:
        for p in g.params:
            sparsity[r : r + len(g.samples), col[p]] = 1
        r += len(g.samples)

    def full(x: np.ndarray) -> np.ndarray:
        theta = theta0.copy()
        theta[free] = x
        return theta

    def residuals(x: np.ndarray) -> np.ndarray:
        theta = full(x)
        spec = layout.spec(theta, start.source)
        trial = gpu.model_copy(update={"efficiency": spec})
        kind_only = gpu.model_copy(update={"efficiency": spec.model_copy(update={"ops": {}})})
        out = []
        for g in groups:
            key = tuple(theta[g.params])
            pred = g.cache.get(key)
            if pred is None:
                pred = predict_ops(g.samples, kind_only if g.kind_curves_only else trial, peak)
                if len(g.cache) >= 8:
                    g.cache.pop(next(iter(g.cache)))
                g.cache[key] = pred
            out.append(g.weight * np.log(pred / g.meas))
        return np.concatenate(out)

    result = least_squares(
        residuals,
        theta0[free],
        jac_sparsity=sparsity.tocsr(),
        bounds=(layout.lower[free], layout.upper[free]),
        loss=loss,
        f_scale=0.1,
        diff_step=1e-4,
        x_scale="jac",
        max_nfev=max_nfev,
    )
    return layout.spec(full(result.x), start.source), result


def _error_rows(samples: OpSamples, pred: np.ndarray) -> list[list[object]]:
    meas = np.asarray(samples.measured)
    tags, phases = np.asarray(samples.tag), np.asarray(samples.phase)
    rows = []
    for tag in dict.fromkeys(samples.tag):
        for ph in (_FWD, _BWD):
            m = (tags == tag) & (phases == ph)
            if not m.any():
                continue
            med, mean, bias = _err_stats(pred[m], meas[m])
            rows.append([tag, ph, int(m.sum()), f"{med:.1f}", f"{mean:.1f}", f"{bias:+.1f}"])
    for ph in (_FWD, _BWD):
        m = phases == ph
        if m.any():
            med, mean, bias = _err_stats(pred[m], meas[m])
            rows.append([f"ALL {ph}", ph, int(m.sum()), f"{med:.1f}", f"{mean:.1f}", f"{bias:+.1f}"])
    med, mean, bias = _err_stats(pred, meas)
    rows.append(["ALL", "both", len(meas), f"{med:.1f}", f"{mean:.1f}", f"{bias:+.1f}"])
    return rows


def _achieved_rows(samples: OpSamples, gpu: GpuSpec, peak: float) -> list[list[object]]:
    """Per tag and phase, over the larger half of the samples (by measured time): the median
    fraction of peak FLOP/s and of HBM bandwidth the kernel reached, counting the inventory's
    FLOPs and bytes (``Op.work``). Tells which operators one roofline curve can describe."""
    tags, phases = np.asarray(samples.tag), np.asarray(samples.phase)
    meas = np.asarray(samples.measured)
    flops, traffic = np.empty(len(samples)), np.empty(len(samples))
    for i, (op, ph) in enumerate(zip(samples.ops, samples.phase, strict=True)):
        works = [op.work(Phase.FWD)] if ph == _FWD else [op.work(Phase.BWD_INPUT), op.work(Phase.BWD_WEIGHT)]
        flops[i], traffic[i] = sum(w[0] for w in works), sum(w[1] for w in works)
    rows = []
    for tag in dict.fromkeys(samples.tag):
        for ph in (_FWD, _BWD):
            m = (tags == tag) & (phases == ph)
            if not m.any():
                continue
            big = m & (meas >= np.median(meas[m]))
            rows.append(
                [
                    tag,
                    ph,
                    int(m.sum()),
                    f"{np.median(flops[big] / meas[big]) / peak:.2f}",
                    f"{np.median(traffic[big] / meas[big]) / gpu.hbm_bandwidth_bytes_per_s:.2f}",
                    f"{meas[m].min() / US:.1f}",
                ]
            )
    return rows


_ACHIEVED_HEADER = (
    "operator",
    "phase",
    "samples",
    "FLOP/s / peak",
    "bytes/s / HBM peak",
    "fastest sample us",
)

_ERR_HEADER = ("operator", "phase", "samples", "median |err| %", "mean |err| %", "median err %")


def _fmt_spec(
    spec: EfficiencySpec, flops_keys: Sequence[str] = (), rates: tuple[float, float] | None = None
) -> str:
    """The fitted numbers; with ``rates`` = (peak FLOP/s, HBM bytes/s) also each curve's fixed
    time per kernel, half_work / (rate * max_fraction), which adds to kernel_overhead_s."""

    def fixed(c: EfficiencyCurve, compute: bool) -> str:
        if rates is None:
            return ""
        return f"{c.half_work / (rates[0 if compute else 1] * c.max_fraction) / US:.2f}"

    lines = []
    for name in _CURVES:
        c: EfficiencyCurve = getattr(spec, name)
        extra = f" (fixed {fixed(c, name != 'memory')} us)" if rates else ""
        lines.append(f"  {name}: max_fraction={c.max_fraction:.4f} half_work={c.half_work:.4g}{extra}")
    lines.append(f"  kernel_overhead_s={spec.kernel_overhead_s:.3g} ({spec.kernel_overhead_s / US:.2f} us)")
    if spec.ops:
        rows = [
            [
                key,
                "FLOPs" if key in flops_keys else "bytes",
                f"{c.max_fraction:.4f}",
                f"{c.half_work:.4g}",
                *([fixed(c, key in flops_keys)] if rates else []),
            ]
            for key, c in spec.ops.items()
        ]
        lines.append("  ops:")
        header = ("curve", "work", "max_fraction", "half_work", *(["fixed us"] if rates else []))
        lines.append(_table(rows, header))
    return "\n".join(lines)


def efficiency_yaml(spec: EfficiencySpec, flops_keys: Sequence[str] = ()) -> str:
    """The ``efficiency:`` block of a GPU catalog file (``flops_keys``: per-operator curves
    whose half_work is in FLOPs; the others are in bytes)."""
    units = {"gemm": "FLOPs", "attention": "FLOPs", "memory": "bytes"}
    lines = ["efficiency:                 # fitted by tools/calibrate.py operators (see docs/calibration.md)"]
    for name in _CURVES:
        c: EfficiencyCurve = getattr(spec, name)
        note = f"# half_work in {units[name]}"
        if name == "memory" and spec.ops:
            note += "; memory-bound operators without an ops: curve"
        lines.append(
            f"  {name}: {{max_fraction: {c.max_fraction:.4f}, half_work: {c.half_work:.4g}}}"
            f"{' ' * max(1, 20 - len(f'{c.half_work:.4g}') - len(name))}{note}"
        )
    lines.append(f"  kernel_overhead_s: {spec.kernel_overhead_s / US:.2f} us")
    if spec.ops:
        lines.append(
            "  ops:                      # per-operator curves (GPT-NeoX kernels as sampled); "
            "half_work in FLOPs for bmm/baddbmm/GEMM/attention, else bytes"
        )
        width = max(len(k) for k in spec.ops) + 3
        for key, c in spec.ops.items():
            lines.append(
                f"    {(chr(34) + key + chr(34) + ':').ljust(width)} "
                f"{{max_fraction: {c.max_fraction:.4f}, half_work: {c.half_work:.4g}}}"
                + ("  # FLOPs" if key in flops_keys else "")
            )
    escaped = spec.source.replace('"', "'")
    lines.append(f'  source: "{escaped}"')
    return "\n".join(lines)


def replace_efficiency_block(path: Path, block: str) -> None:
    """Replace the top-level ``efficiency:`` block of a catalog YAML (or append one); every
    other line of the file is left as it is."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("efficiency:")), None)
    if start is None:
        while lines and not lines[-1].strip():
            lines.pop()
        new = [*lines, *block.splitlines()]
    else:
        end = start + 1
        while end < len(lines) and (not lines[end].strip() or lines[end][0] in " \t#"):
            end += 1
        new = [*lines[:start], *block.splitlines(), *lines[end:]]
    path.write_text("\n".join(new) + "\n", encoding="utf-8")


def _catalog_file(kind: str, name: str) -> Path:
    folder = REPO / "src" / "paraplan" / "catalog" / kind
    import yaml

    for path in sorted(folder.glob("*.yaml")):
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        if _catalog_key(str(raw.get("name", ""))) == _catalog_key(name):
            return path
    raise SystemExit(f"no catalog {kind} file named {name}")


def _compare_rows(samples: OpSamples, preds: Sequence[np.ndarray]) -> list[list[object]]:
    """Per tag and phase (then per phase and overall): median |err|, mean |err| and median
    signed err of each prediction in ``preds``, side by side."""
    meas = np.asarray(samples.measured)
    tags, phases = np.asarray(samples.tag), np.asarray(samples.phase)
    masks: list[tuple[str, str, np.ndarray]] = []
    for tag in dict.fromkeys(samples.tag):
        for ph in (_FWD, _BWD):
            m = (tags == tag) & (phases == ph)
            if m.any():
                masks.append((tag, ph, m))
    for ph in (_FWD, _BWD):
        m = phases == ph
        if m.any():
            masks.append((f"ALL {ph}", ph, m))
    masks.append(("ALL", "both", np.ones(len(meas), dtype=bool)))
    rows = []
    for tag, ph, m in masks:
        row: list[object] = [tag, ph, int(m.sum())]
        for pred in preds:
            med, mean, bias = _err_stats(pred[m], meas[m])
            row += [f"{med:.1f}", f"{mean:.1f}", f"{bias:+.1f}"]
        rows.append(row)
    return rows


def _compare_header(labels: Sequence[str]) -> tuple[str, ...]:
    out = ["operator", "phase", "samples"]
    for label in labels:
        out += [f"{label}: median |err| %", "mean |err| %", "median err %"]
    return tuple(out)


def _fit_with_mode(
    samples: OpSamples, gpu: GpuSpec, peak: float, mode: str, args: argparse.Namespace, start: EfficiencySpec
) -> tuple[EfficiencySpec, object, ParamLayout]:
    excluded = _curve_excluded_tags(args)
    keys = op_curve_keys(samples, mode, args.min_samples, excluded)
    layout = ParamLayout.for_keys(keys)
    fixed = args.kernel_overhead_us is not None
    if fixed:
        start = start.model_copy(update={"kernel_overhead_s": args.kernel_overhead_us * US})
    spec, res = fit_efficiency(
        samples,
        gpu,
        peak,
        start,
        loss=args.loss,
        max_nfev=args.max_nfev,
        layout=layout,
        fix_overhead=fixed,
        curve_excluded_tags=excluded,
    )
    return spec, res, layout


def _curve_excluded_tags(args: argparse.Namespace) -> tuple[str, ...]:
    """The softmax implementation(s) that do not own the ``softmax`` curve."""
    if args.softmax_curve == "both":
        return ()
    return tuple(t for t in SOFTMAX_TAGS if t != args.softmax_curve)


def _flops_keys(layout: ParamLayout) -> list[str]:
    return [k for k, c in zip(layout.keys, layout.compute, strict=True) if c]


def cmd_operators(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    folder = Path(args.dir)
    gpu = load_gpu(args.gpu)
    precision = Precision(args.precision)
    peak = gpu.flops_for(precision)
    mode = args.op_curves
    rates = (peak, gpu.hbm_bandwidth_bytes_per_s)
    print(f"# operators: {_rel_path(folder)} on {gpu.name}")
    print(
        f"# peak {precision.value} {peak / 1e12:.1f} TFLOP/s, HBM {gpu.hbm_bandwidth_bytes_per_s / 1e9:.0f} GB/s "
        f"(catalog); seed {args.seed}, hold-out {args.holdout:.0%}, loss {args.loss}"
    )
    print(
        f"# per-operator curves: {mode} (operator and direction with >= {args.min_samples} samples); "
        f"kind-level memory curve fitted on {', '.join(DEFAULT_MEMORY_TAGS)}; softmax curve fitted on "
        f"{args.softmax_curve}"
    )
    excluded: list[str] = []
    samples = load_operator_samples(folder, gpu, print, excluded)
    if not len(samples):
        raise SystemExit("no usable samples")
    print(
        f"# usable samples: {len(samples)} ({samples.phase.count(_FWD)} fwd, {samples.phase.count(_BWD)} bwd)"
    )

    print("\n## achieved fraction of peak (median over each group's slower half; inventory FLOPs and bytes)")
    print(_table(_achieved_rows(samples, gpu, peak), _ACHIEVED_HEADER))

    test = _split_mask(samples.key, args.holdout, args.seed)
    train_set, test_set = samples.subset(~test), samples.subset(test)
    t1 = time.perf_counter()
    spec80, res80, layout80 = _fit_with_mode(train_set, gpu, peak, mode, args, EfficiencySpec())
    print(
        f"\n## fit on {len(train_set)} samples (80 %), op curves {mode}: {layout80.size} parameters, "
        f"{res80.nfev} evaluations, status {res80.status}, {time.perf_counter() - t1:.0f} s"
    )
    print(_fmt_spec(spec80, _flops_keys(layout80), rates))
    test_pred = predict_ops(test_set, gpu.model_copy(update={"efficiency": spec80}), peak)
    hold_med, hold_mean, _ = _err_stats(test_pred, np.asarray(test_set.measured))

    preds, labels = [test_pred], [mode]
    if args.compare != "off" and args.compare != mode:
        t1 = time.perf_counter()
        spec_c, res_c, layout_c = _fit_with_mode(train_set, gpu, peak, args.compare, args, EfficiencySpec())
        print(
            f"\n## comparison fit on the same 80 %, op curves {args.compare}: {layout_c.size} parameters, "
            f"{res_c.nfev} evaluations, status {res_c.status}, {time.perf_counter() - t1:.0f} s"
        )
        print(_fmt_spec(spec_c, _flops_keys(layout_c), rates))
        preds.insert(0, predict_ops(test_set, gpu.model_copy(update={"efficiency": spec_c}), peak))
        labels.insert(0, args.compare)
    print(
        f"\n## hold-out errors ({len(test_set)} samples never fitted; err = predicted/measured - 1; "
        f"columns per op-curves mode: {', '.join(labels)})"
    )
    print(_table(_compare_rows(test_set, preds), _compare_header(labels)))

    if spec80.ops:
        memory_bound = np.array([op.kind not in _COMPUTE for op in test_set.ops])
        if memory_bound.any():
            sub = test_set.subset(memory_bound)
            kind_only = gpu.model_copy(update={"efficiency": spec80.model_copy(update={"ops": {}})})
            print(
                "\n## hold-out errors of the memory-bound operators on the kind-level memory curve alone "
                "(what a memory-bound operator without a curve of its own gets)"
            )
            print(_table(_compare_rows(sub, [predict_ops(sub, kind_only, peak)]), _ERR_HEADER))

    date = args.date or _dt.date.today().isoformat()
    curves_note = (
        f"kind curves + {len(layout80.keys)} per-operator curves ({mode}, >= {args.min_samples} samples; "
        f"softmax curve from {args.softmax_curve}; memory curve from {', '.join(DEFAULT_MEMORY_TAGS)})"
        if layout80.keys
        else "kind curves only"
    )
    if args.kernel_overhead_us is not None:
        curves_note += f"; kernel overhead fixed at {args.kernel_overhead_us:g} us"
    source = (
        f"fitted by {SCRIPT} operators {_rel_path(folder)} --gpu {gpu.name} --op-curves {mode} on {date}: "
        f"{len(samples)} fwd/bwd samples of {len(set(samples.tag))} operator tags (GPUModeling25, fp16), "
        f"excluded {'; '.join(excluded) or 'nothing'}; {curves_note}; "
        f"least_squares on log(pred/measured) via estimate_op_s; 20% hold-out (seed {args.seed}) "
        f"median |err| {hold_med:.1f}%, mean |err| {hold_mean:.1f}%"
    )
    t1 = time.perf_counter()
    spec, res, layout = _fit_with_mode(
        samples, gpu, peak, mode, args, spec80.model_copy(update={"source": source})
    )
    print(
        f"\n## final fit on all {len(samples)} samples: {layout.size} parameters, {res.nfev} evaluations, "
        f"status {res.status}, {time.perf_counter() - t1:.0f} s"
    )
    print(_fmt_spec(spec, _flops_keys(layout), rates))
    fitted = gpu.model_copy(update={"efficiency": spec})
    all_pred = predict_ops(samples, fitted, peak)
    print("\n## in-sample errors of the final fit")
    print(_table(_error_rows(samples, all_pred), _ERR_HEADER))
    block = efficiency_yaml(spec, _flops_keys(layout))
    print("\n" + block)
    if args.update_catalog:
        path = _catalog_file("gpus", gpu.name)
        replace_efficiency_block(path, block)
        print(f"\n# wrote the efficiency block into {_rel_path(path)}")
    print(f"\n# done in {time.perf_counter() - t0:.1f} s")
    return 0


# ----------------------------------------------------------------------------------------
# links
# ----------------------------------------------------------------------------------------

_FIT_KINDS = {CollectiveKind.ALL_REDUCE, CollectiveKind.SEND_RECV}


@dataclasses.dataclass
class CollSamples:
    config: list[str]
    tag: list[str]
    coll: list[Collective]
    layout: list[GroupLayout]
    measured: np.ndarray

    def subset(self, mask: np.ndarray) -> CollSamples:
        idx = np.flatnonzero(mask)
        return CollSamples(
            [self.config[i] for i in idx],
            [self.tag[i] for i in idx],
            [self.coll[i] for i in idx],
            [self.layout[i] for i in idx],
            self.measured[idx],
        )

    def __len__(self) -> int:
        return len(self.coll)


def load_collective_samples(
    folder: Path, cluster: ClusterSpec, log: Callable[[str], None]
) -> tuple[CollSamples, dict[tuple[str, str], dict[str, int]]]:
    """Every usable NCCL sample of ``folder``.

    Exclusion rules (each reported with a count):
    - pooled files without ``_N_M`` repeat the rows of the per-config files: skipped;
    - tuning tables are not measurements: skipped;
    - a NaN or non-positive time is excluded;
    - a time shorter than the same collective would take at 100 % of the links' nominal
      bandwidth with zero latency (``estimate_collective_s`` on the ideal cluster) is
      physically impossible and excluded. This is what catches the GH200 all-gather rows that
      report ~117 us whatever the size.
    """
    ideal = ideal_cluster(cluster)
    rows: dict[str, list] = {"config": [], "tag": [], "coll": [], "layout": [], "measured": []}
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for path in sorted(folder.glob("*.csv")):
        match = NCCL_FILE.match(path.name)
        if match is None:
            kind = "pooled union of the _N_M files" if "_fp16" in path.name else "regressor tuning table"
            log(f"  skip {path.name}: {kind}")
            continue
        tag, n, m = match["tag"], int(match["n"]), int(match["m"])
        if tag not in NCCL_KINDS:
            log(f"  skip {path.name}: unknown collective {tag!r}")
            continue
        if m > cluster.gpus_per_node:
            raise SystemExit(f"{path.name}: {m} GPUs per node but {cluster.name} has {cluster.gpus_per_node}")
        kind = NCCL_KINDS[tag]
        frame = pd.read_csv(path)
        frame.columns = [c.strip() for c in frame.columns]
        if (frame["nodes"] != n).any() or (frame["GPUsPerNode"] != m).any():
            raise SystemExit(f"{path.name}: nodes/GPUsPerNode columns disagree with the file name")
        layout = group_layout(n, m)
        config = f"{n}_{m}"
        c = counts.setdefault((config, tag), {"rows": 0, "nan": 0, "impossible": 0, "used": 0})
        impossible_durs = []
        for shape, dur in zip(frame["shape"].to_numpy(float), frame["dur(us)"].to_numpy(float), strict=True):
            c["rows"] += 1
            if not (math.isfinite(dur) and dur > 0 and math.isfinite(shape) and shape > 0):
                c["nan"] += 1
                continue
            coll = collective_for_row(kind, shape, n, m)
            seconds = dur * US
            if seconds < estimate_collective_s(coll, layout, ideal):
                c["impossible"] += 1
                impossible_durs.append(dur)
                continue
            c["used"] += 1
            for key, value in (
                ("config", config),
                ("tag", tag),
                ("coll", coll),
                ("layout", layout),
                ("measured", seconds),
            ):
                rows[key].append(value)
        note = ""
        if c["nan"]:
            note += f"; {c['nan']} excluded (NaN or non-positive time)"
        if impossible_durs:
            d = np.asarray(impossible_durs)
            near117 = int(np.sum((d > 100) & (d < 135)))
            note += (
                f"; {len(d)} excluded (faster than the links' nominal bandwidth allows: "
                f"{near117} of them at ~117 us (100-135 us), durations {d.min():.0f}-{d.max():.0f} us, median {np.median(d):.0f} us)"
            )
        log(f"  {path.name}: {c['rows']} rows{note}")
    return CollSamples(
        rows["config"], rows["tag"], rows["coll"], rows["layout"], np.asarray(rows["measured"])
    ), counts


def predict_colls(samples: CollSamples, cluster: ClusterSpec) -> np.ndarray:
    return np.fromiter(
        (estimate_collective_s(c, lay, cluster) for c, lay in zip(samples.coll, samples.layout, strict=True)),
        float,
        len(samples),
    )


@dataclasses.dataclass
class LinkParams:
    """Which link parameters are free: (side, field) in fitting order."""

    names: list[tuple[str, str]]

    def apply(self, cluster: ClusterSpec, x: np.ndarray) -> ClusterSpec:
        upd: dict[str, dict[str, float]] = {}
        for (side, fld), value in zip(self.names, x, strict=True):
            upd.setdefault(side, {})[fld] = float(value) * (US if fld == "latency_s" else 1.0)
        links = {side: getattr(cluster, side).model_copy(update=u) for side, u in upd.items()}
        return cluster.model_copy(update=links)


def _free_params(samples: CollSamples, cluster: ClusterSpec) -> LinkParams:
    names: list[tuple[str, str]] = []
    for side, crosses in (("intra_node", False), ("inter_node", True)):
        if getattr(cluster, side) is None:
            continue
        mine = [i for i, lay in enumerate(samples.layout) if lay.crosses_nodes == crosses]
        kinds = {samples.coll[i].kind for i in mine}
        if kinds - {CollectiveKind.SEND_RECV}:
            names.append((side, "efficiency"))
        if CollectiveKind.SEND_RECV in kinds:
            names.append((side, "p2p_efficiency"))
        if kinds:
            names.append((side, "latency_s"))
    return LinkParams(names)


def fit_links(
    samples: CollSamples, cluster: ClusterSpec, *, loss: str, fixed: frozenset[tuple[str, str]] = frozenset()
) -> tuple[ClusterSpec, LinkParams, object]:
    """least_squares on weighted log(pred/measured); ``fixed`` parameters keep ``cluster``'s value."""
    params = _free_params(samples, cluster)
    params = LinkParams([p for p in params.names if p not in fixed])
    weights = _group_weights(list(zip(samples.config, [c.kind for c in samples.coll], strict=True)))
    x0 = np.array([5.0 if f == "latency_s" else 0.5 for _, f in params.names])
    lower = np.array([0.0 if f == "latency_s" else 1e-3 for _, f in params.names])
    upper = np.array([1e5 if f == "latency_s" else 1.0 for _, f in params.names])

    def residuals(x: np.ndarray) -> np.ndarray:
        return weights * np.log(predict_colls(samples, params.apply(cluster, x)) / samples.measured)

    result = least_squares(
        residuals, x0, bounds=(lower, upper), loss=loss, f_scale=0.1, diff_step=1e-4, x_scale="jac"
    )
    return params.apply(cluster, result.x), params, result


def _link_summary(cluster: ClusterSpec) -> str:
    out = []
    for side in ("intra_node", "inter_node"):
        link: LinkSpec | None = getattr(cluster, side)
        if link is None:
            continue
        out.append(
            f"  {side}: bandwidth {link.bandwidth_bytes_per_s / 1e9:.0f} GB/s ({link.topology}), "
            f"efficiency {link.efficiency:.4f} (bus {link.bus_bytes_per_s / 1e9:.2f} GB/s), "
            f"p2p_efficiency {link.p2p_efficiency if link.p2p_efficiency is None else round(link.p2p_efficiency, 4)} "
            f"(p2p {link.p2p_bytes_per_s / 1e9:.2f} GB/s), latency {link.latency_s / US:.2f} us"
        )
    return "\n".join(out)


def _coll_error_rows(
    samples: CollSamples,
    pred: np.ndarray,
    counts: dict[tuple[str, str], dict[str, int]],
    hold: tuple[CollSamples, np.ndarray] | None,
) -> list[list[object]]:
    rows = []
    configs, tags = np.asarray(samples.config), np.asarray(samples.tag)
    for (config, tag), c in sorted(counts.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        m = (configs == config) & (tags == tag)
        fitted = NCCL_KINDS[tag] in _FIT_KINDS
        excluded = c["nan"] + c["impossible"]
        if not m.any():
            rows.append([config, tag, c["rows"], excluded, "-", "-", "-", "-", "-"])
            continue
        med, mean, bias = _err_stats(pred[m], samples.measured[m])
        hmed = "-"
        if hold is not None and fitted:
            hs, hp = hold
            hm = (np.asarray(hs.config) == config) & (np.asarray(hs.tag) == tag)
            if hm.any():
                hmed = f"{_err_stats(hp[hm], hs.measured[hm])[0]:.1f}"
        rows.append(
            [
                config,
                tag,
                c["rows"],
                excluded,
                "yes" if fitted else "no (reported)",
                hmed,
                f"{med:.1f}",
                f"{mean:.1f}",
                f"{bias:+.1f}",
            ]
        )
    return rows


_COLL_HEADER = (
    "config",
    "kind",
    "rows",
    "excluded",
    "fitted",
    "hold-out median |err| %",
    "median |err| %",
    "mean |err| %",
    "median err %",
)


def cmd_links(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    folder = Path(args.dir)
    base = load_cluster(args.cluster)
    probe = [NCCL_FILE.match(p.name) for p in folder.glob("*.csv")]
    max_nodes = max((int(mt["n"]) for mt in probe if mt), default=1)
    base = load_cluster(args.cluster, num_nodes=max(max_nodes, base.num_nodes))
    print(
        f"# links: {_rel_path(folder)} on cluster {base.name} ({base.gpu.name}, {base.gpus_per_node} per node)"
    )
    print(f"# seed {args.seed}, hold-out {args.holdout:.0%}, loss {args.loss}")
    topologies = ["switch", "mesh"] if args.intra_topology == "auto" else [args.intra_topology]
    if base.intra_node is None:
        topologies = [None]

    results = []
    for topo in topologies:
        cluster = base
        if topo is not None:
            cluster = base.model_copy(
                update={"intra_node": base.intra_node.model_copy(update={"topology": topo})}
            )
        log: list[str] = []
        samples, counts = load_collective_samples(folder, cluster, log.append)
        fit_mask = np.array([c.kind in _FIT_KINDS for c in samples.coll])
        fit_set = samples.subset(fit_mask)
        # A latency the fit drives to zero is not identified by these sizes (>= 4 MB): keep the
        # catalog cluster's value for it and fit the rest.
        fitted, params, res = fit_links(fit_set, cluster, loss=args.loss)
        fixed = frozenset(
            (side, fld)
            for side, fld in params.names
            if fld == "latency_s" and getattr(fitted, side).latency_s < 0.01 * US
        )
        for side, _ in sorted(fixed):
            log.append(
                f"  note: {side}.latency_s fitted to 0 (not identified by these message sizes); "
                f"kept the catalog value {getattr(cluster, side).latency_s / US:g} us and refitted the rest"
            )
        test = _split_mask(list(range(len(fit_set))), args.holdout, args.seed)
        fitted80, _, _ = fit_links(fit_set.subset(~test), cluster, loss=args.loss, fixed=fixed)
        hold_set = fit_set.subset(test)
        hold_pred = predict_colls(hold_set, fitted80)
        if fixed:
            fitted, params, res = fit_links(fit_set, cluster, loss=args.loss, fixed=fixed)
        weights = _group_weights(list(zip(fit_set.config, [c.kind for c in fit_set.coll], strict=True)))
        cost = float(np.sum((weights * np.log(predict_colls(fit_set, fitted) / fit_set.measured)) ** 2))
        print(
            f"# intra-node topology {topo or 'n/a (1 GPU per node)'}: fitted "
            f"{', '.join(f'{s}.{f}' for s, f in params.names)} in {res.nfev} evaluations, "
            f"weighted sum of squared log errors {cost:.4f}"
        )
        results.append((cost, topo, cluster, samples, counts, hold_set, hold_pred, fitted, log))

    cost, topo, cluster, samples, counts, hold_set, hold_pred, fitted, log = min(results, key=lambda r: r[0])
    if len(results) > 1:
        print(
            f"# chosen intra-node topology: {topo} (lower weighted squared log error: "
            + ", ".join(f"{r[1]} {r[0]:.4f}" for r in results)
            + ")"
        )
    print("\n## files (exclusions as checked against the chosen topology)")
    print("\n".join(log))
    print("\n## fitted links")
    print(_link_summary(fitted))
    pred = predict_colls(samples, fitted)
    print(
        "\n## per-config errors (err = predicted/measured - 1; hold-out: fit on 80 % of the "
        "all-reduce/p2p rows, scored on the other 20 %; other columns: final fit on all rows)"
    )
    print(_table(_coll_error_rows(samples, pred, counts, (hold_set, hold_pred)), _COLL_HEADER))
    fit_mask = np.array([c.kind in _FIT_KINDS for c in samples.coll])
    h_med, h_mean, _ = _err_stats(hold_pred, hold_set.measured)
    a_med, a_mean, _ = _err_stats(pred[fit_mask], samples.measured[fit_mask])
    ag = ~fit_mask
    print(
        f"\n# all-reduce + p2p: hold-out median |err| {h_med:.1f}%, mean {h_mean:.1f}%; "
        f"all rows median {a_med:.1f}%, mean {a_mean:.1f}%"
    )
    if ag.any():
        g_med, g_mean, g_bias = _err_stats(pred[ag], samples.measured[ag])
        print(
            f"# all-gather (not fitted): median |err| {g_med:.1f}%, mean {g_mean:.1f}%, median err {g_bias:+.1f}%"
        )
    date = args.date or _dt.date.today().isoformat()
    print("\n# YAML (link parameters; bandwidths are the catalog's nominal per-GPU values)")
    for side in ("intra_node", "inter_node"):
        link: LinkSpec | None = getattr(fitted, side)
        if link is None:
            continue
        print(f"{side}:")
        print(f"  bandwidth: {link.bandwidth_bytes_per_s / 1e9:g} GB/s")
        if side == "intra_node":
            print(f"  topology: {link.topology}")
        print(f"  latency: {link.latency_s / US:.1f} us")
        print(f"  efficiency: {link.efficiency:.4f}")
        if link.p2p_efficiency is not None:
            print(f"  p2p_efficiency: {link.p2p_efficiency:.4f}")
    print(
        f"# source: fitted by {SCRIPT} links {_rel_path(folder)} --cluster {base.name} on {date}; "
        f"all-reduce + p2p hold-out median |err| {h_med:.1f}% (mean {h_mean:.1f}%)"
    )
    print(f"\n# done in {time.perf_counter() - t0:.1f} s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--seed", type=int, default=0, help="seed of the random hold-out split (default 0)")
    common.add_argument("--holdout", type=float, default=0.2, help="hold-out fraction (default 0.2)")
    common.add_argument(
        "--loss",
        default="linear",
        choices=["linear", "soft_l1", "huber", "cauchy"],
        help="least_squares loss on the log errors (default linear = plain least squares)",
    )
    common.add_argument("--date", default=None, help="date written into the source string (default today)")

    ops = sub.add_parser("operators", parents=[common], help="fit a GPU's efficiency curves")
    ops.add_argument(
        "dir", help="folder of GPUModeling operator CSVs, e.g. ../shared/data/gpumodeling/operators_A100"
    )
    ops.add_argument("--gpu", required=True, help="catalog GPU name, e.g. A100-SXM4-80GB")
    ops.add_argument("--precision", default="fp16", help="precision whose peak FLOP/s applies (default fp16)")
    ops.add_argument("--max-nfev", type=int, default=400, help="cap on residual evaluations per fit")
    ops.add_argument(
        "--op-curves",
        default="memory+bmm",
        choices=OP_CURVE_MODES,
        help="which operators get a curve of their own: none (kind curves only), memory (memory-bound "
        "operators), memory+bmm (those and bmm/baddbmm; default), all (GEMMs and flash attention too)",
    )
    ops.add_argument(
        "--min-samples",
        type=int,
        default=40,
        help="fewest samples of an operator and direction that get a curve of their own (default 40)",
    )
    ops.add_argument(
        "--softmax-curve",
        default="softmax",
        choices=[*SOFTMAX_TAGS, "both"],
        help="which sampled softmax implementation fits the inventory's one softmax curve: softmax "
        "(PyTorch's, GPT-NeoX's default; default), ScaledUpperTriangMaskedSoftmax (Megatron's fused "
        "kernel) or both pooled",
    )
    ops.add_argument(
        "--kernel-overhead-us",
        type=float,
        default=None,
        help="keep kernel_overhead_s at this many us instead of fitting it (default: fitted)",
    )
    ops.add_argument(
        "--compare",
        default="none",
        choices=[*OP_CURVE_MODES, "off"],
        help="also fit this --op-curves mode on the same 80 %% and print its hold-out errors side by "
        "side (default none = kind curves only; off to skip)",
    )
    ops.add_argument(
        "--update-catalog",
        action="store_true",
        help="write the efficiency block into the GPU's catalog YAML (only that block)",
    )
    ops.set_defaults(func=cmd_operators)

    links = sub.add_parser("links", parents=[common], help="fit a cluster's link parameters")
    links.add_argument(
        "dir", help="folder of GPUModeling NCCL CSVs, e.g. ../shared/data/gpumodeling/nccl_vista"
    )
    links.add_argument(
        "--cluster", required=True, help="catalog cluster giving GPU, GPUs per node and nominal bandwidths"
    )
    links.add_argument(
        "--intra-topology",
        default="auto",
        choices=["auto", "mesh", "switch"],
        help="intra-node topology; auto fits both and keeps the better (default)",
    )
    links.set_defaults(func=cmd_links)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
