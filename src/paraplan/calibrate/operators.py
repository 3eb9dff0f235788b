"""Operator samples: GPUModeling operator CSVs as inventory operators and measured times.

Each CSV row becomes the inventory ``Op`` paraplan uses for that operator
(:func:`paraplan.inventory.samples.op_for_sample`); the cost model's time of a forward sample
is ``estimate_op_s(op, FWD)``, of a backward sample ``BWD_INPUT + BWD_WEIGHT``
(:func:`predict_ops`). :func:`op_curve_keys` picks the (operator, direction) groups that get a
curve of their own.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Collection
from pathlib import Path

import numpy as np

from paraplan.calibrate._common import US, import_extra, silent
from paraplan.catalog import load_gpu
from paraplan.catalog.loader import catalog_key as _catalog_key
from paraplan.costmodel import estimate_op_s
from paraplan.inventory import Op, OpKind
from paraplan.inventory.samples import SAMPLE_TAGS, op_for_sample, sample_shape
from paraplan.specs import ConfigError, GpuSpec, Phase

__all__ = [
    "DEFAULT_MEMORY_TAGS",
    "OP_CURVE_MODES",
    "SOFTMAX_TAGS",
    "OpSamples",
    "above_launch_floor",
    "load_operator_samples",
    "op_curve_keys",
    "operator_records",
    "predict_ops",
]

FWD, BWD = "fwd", "bwd"
_SHAPE_COLUMNS = ("mp", "b", "h", "l", "dim", "Vp")

# Which efficiency curve an operator kind is fitted on (the memory curve also bounds every
# compute kernel through the roofline max()).
GEMM_KINDS = {OpKind.GEMM, OpKind.BMM}
ATTENTION_KINDS = {OpKind.ATTENTION}
COMPUTE_KINDS = GEMM_KINDS | ATTENTION_KINDS

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
    folder: Path,
    gpu: GpuSpec,
    log: Callable[[str], None] = silent,
    excluded: list[str] | None = None,
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

    ``log`` gets one line per file; ``excluded`` (when given) collects one short note per
    excluded group of samples.
    """
    pd = import_extra("pandas")
    from paraplan.samples.gpumodeling import OP_FILE

    excluded = [] if excluded is None else excluded
    samples = OpSamples()
    files = sorted(Path(folder).glob("*.csv"))
    if not files:
        raise ConfigError(f"{folder}: no CSV files")
    for path in files:
        match = OP_FILE.match(path.name)
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
        times = {FWD: "F_dur(us)", BWD: "B_dur(us)"}
        notes: list[str] = []
        use = {FWD: True, BWD: True}
        fwd, bwd = frame[times[FWD]].to_numpy(float), frame[times[BWD]].to_numpy(float)
        if np.mean(fwd == bwd) >= 0.9:
            use[BWD] = False
            notes.append(f"{len(frame)} bwd excluded (B_dur is a copy of F_dur)")
            excluded.append(f"{len(frame)} {tag} bwd (copy of fwd)")
        if tag == "flash_atten":
            ratio = float(np.nanmedian(bwd / fwd))
            if ratio < 1.0:
                use[BWD] = False
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
        if bad[FWD] or bad[BWD]:
            notes.append(f"{bad[FWD]} fwd + {bad[BWD]} bwd excluded (NaN or non-positive time)")
            excluded.append(f"{bad[FWD] + bad[BWD]} {tag} (NaN/non-positive time)")
        if unbuildable:
            notes.append(f"{unbuildable} rows excluded (shape not buildable)")
            excluded.append(f"{unbuildable} {tag} rows (shape not buildable)")
        log(f"  {path.name}: {len(frame)} rows" + ("; " + "; ".join(notes) if notes else ""))
    return samples


def operator_records(frame, gpu: GpuSpec, excluded: list[str] | None = None) -> OpSamples:
    """The operator records of ``gpu`` in a samples-store frame (``paraplan profile``'s
    records, :mod:`paraplan.samples.schema`; :func:`paraplan.samples.store.load_samples`
    reads one) as samples: each record's inventory operator in the precision it was timed in
    (``op_for_sample(variant or name, shape, dtype)``, as ``costmodel.fitting`` builds them)
    and its measured seconds. Records of another device, collectives and operators the
    inventory has no shape for are left out; ``excluded`` (when given) gets one note per
    left-out group. The tag of a sample is its operator tag (``variant`` or ``name``), so
    that ``DEFAULT_MEMORY_TAGS`` and ``SOFTMAX_TAGS`` mean what they mean for the
    GPUModeling CSVs."""
    pd = import_extra("pandas")
    excluded = [] if excluded is None else excluded
    samples = OpSamples()
    ops = frame[frame["kind"] == "op"]
    other = ops[[_catalog_key(str(d)) != _catalog_key(gpu.name) for d in ops["device"]]]
    if len(other):
        excluded.append(f"{len(other)} records of other devices ({', '.join(sorted(set(other['device'])))})")
    unknown: Counter[str] = Counter()
    for rec in ops.drop(other.index).to_dict("records"):
        tag = rec["variant"] or rec["name"]
        shape = sample_shape(rec, pd.isna)
        try:
            op = op_for_sample(tag, shape, rec["dtype"])
        except ValueError:
            unknown[tag] += 1
            continue
        key = (tag, rec["dtype"], *sorted(shape.items()))
        samples.add(tag, rec["phase"], op, key, float(rec["time_s"]))
    excluded.extend(f"{n} {tag} records (no inventory shape)" for tag, n in sorted(unknown.items()))
    return samples


def above_launch_floor(samples: OpSamples, factor: float = 2.0) -> np.ndarray:
    """True for the samples whose time is at least ``factor`` times the fastest sample of
    their (tag, phase): the ones the kernel's own work sets.

    A sampler that times back-to-back calls between two CUDA events (``paraplan profile``'s
    :func:`paraplan.profile.timing.measure`) measures the slower of the GPU's work and the
    host's: below some size every call of an operator takes the same time (on an H100,
    ``torch.autograd.grad`` through a residual add, which launches no kernel, takes 48-58 us
    from 1M to 134M elements; the fused RMSNorm backward 70-120 us from 1M to 17M elements,
    then doubles with the work), and an input that stays in the L2 cache between calls is
    faster than one read from HBM. Neither is what a training step's kernel does, so a curve fitted to such
    samples is fitted above this floor."""
    tags, phases = np.asarray(samples.tag), np.asarray(samples.phase)
    meas = np.asarray(samples.measured, dtype=float)
    keep = np.zeros(len(samples), dtype=bool)
    for tag, ph in set(zip(samples.tag, samples.phase, strict=True)):
        m = (tags == tag) & (phases == ph)
        keep[m] = meas[m] >= factor * meas[m].min()
    return keep


def phase_work(op: Op, phase: str) -> list[tuple[float, float]]:
    """(FLOPs, bytes) of each kernel a sample of ``op`` in ``phase`` ("fwd"/"bwd") times: the
    forward, or the two backward kernels of one autograd node."""
    if phase == FWD:
        return [op.work(Phase.FWD)]
    return [op.work(Phase.BWD_INPUT), op.work(Phase.BWD_WEIGHT)]


def predict_ops(samples: OpSamples, gpu: GpuSpec, peak: float) -> np.ndarray:
    """Seconds the cost model gives each sample: FWD for forward rows, BWD_INPUT + BWD_WEIGHT
    (the two backward kernels of one autograd node) for backward rows."""
    out = np.empty(len(samples))
    for i, (op, ph) in enumerate(zip(samples.ops, samples.phase, strict=True)):
        if ph == FWD:
            out[i] = estimate_op_s(op, Phase.FWD, gpu, peak)
        else:
            out[i] = estimate_op_s(op, Phase.BWD_INPUT, gpu, peak) + estimate_op_s(
                op, Phase.BWD_WEIGHT, gpu, peak
            )
    return out


def _wants_curve(op: Op, mode: str) -> bool:
    if mode == "none":
        return False
    if op.kind not in COMPUTE_KINDS:
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
            keys[f"{name}:{ph}"] = op.kind in COMPUTE_KINDS
    return keys
