"""``calibrate_operators``: fit one GPU's efficiency curves from a folder of operator samples,
score them on a hold-out, refit on everything and return every table as data."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from paraplan.calibrate._common import (
    COMMAND,
    US,
    ErrorStats,
    check_fit_options,
    err_stats,
    rel_path,
    silent,
    split_mask,
)
from paraplan.calibrate.catalog_yaml import efficiency_yaml
from paraplan.calibrate.efficiency import fit_efficiency
from paraplan.calibrate.errors import AchievedRow, ErrorRow, achieved_rows, error_rows
from paraplan.calibrate.operators import (
    BWD,
    COMPUTE_KINDS,
    DEFAULT_MEMORY_TAGS,
    FWD,
    OP_CURVE_MODES,
    SOFTMAX_TAGS,
    OpSamples,
    load_operator_samples,
    op_curve_keys,
    predict_ops,
)
from paraplan.calibrate.params import CURVES, ParamLayout
from paraplan.specs import ConfigError, EfficiencyCurve, EfficiencySpec, GpuSpec, Precision

__all__ = ["CurveRow", "EfficiencyFit", "OperatorCalibration", "OperatorOptions", "calibrate_operators"]


@dataclasses.dataclass(frozen=True)
class OperatorOptions:
    """The settings of ``paraplan calibrate operators`` (docs/calibration.md)."""

    op_curves: str = "memory+bmm"
    min_samples: int = 40
    compare: str = "none"  # another op_curves mode fitted on the same 80 %, or "off"
    softmax_curve: str = "softmax"  # one of SOFTMAX_TAGS or "both"
    kernel_overhead_us: float | None = None  # keep kernel_overhead_s at this value (None: fit it)
    precision: str = "fp16"
    max_nfev: int = 400
    seed: int = 0
    holdout: float = 0.2
    loss: str = "linear"
    date: str | None = None  # written into the source string (None: today)

    def check(self) -> None:
        """A one-line ConfigError naming the first bad option."""
        check_fit_options(self.seed, self.holdout, self.loss)
        choices = {
            "op_curves": OP_CURVE_MODES,
            "compare": (*OP_CURVE_MODES, "off"),
            "softmax_curve": (*SOFTMAX_TAGS, "both"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name}: expected one of {', '.join(allowed)} (got {getattr(self, name)!r})")
        if self.min_samples < 1:
            raise ConfigError(f"min_samples: expected a positive integer (got {self.min_samples})")
        if self.max_nfev < 1:
            raise ConfigError(f"max_nfev: expected a positive integer (got {self.max_nfev})")
        if self.kernel_overhead_us is not None and not 0 <= self.kernel_overhead_us <= 100:
            raise ConfigError(f"kernel_overhead_us: expected 0 to 100 us (got {self.kernel_overhead_us:g})")
        try:
            Precision(self.precision)
        except ValueError:
            allowed = ", ".join(p.value for p in Precision)
            raise ConfigError(f"precision: expected one of {allowed} (got {self.precision!r})") from None

    @property
    def curve_excluded_tags(self) -> tuple[str, ...]:
        """The softmax implementation(s) that do not own the ``softmax`` curve."""
        if self.softmax_curve == "both":
            return ()
        return tuple(t for t in SOFTMAX_TAGS if t != self.softmax_curve)


@dataclasses.dataclass(frozen=True)
class CurveRow:
    """One fitted curve: ``work`` is what its half_work counts ("FLOPs" or "bytes"); ``fixed_us``
    = half_work / (rate * max_fraction), its time at zero work, to which the kernel overhead adds."""

    name: str
    work: str
    max_fraction: float
    half_work: float
    fixed_us: float


@dataclasses.dataclass(frozen=True)
class EfficiencyFit:
    """One least-squares fit of the efficiency spec."""

    op_curves: str
    samples: int
    spec: EfficiencySpec
    layout: ParamLayout
    evaluations: int
    status: int
    seconds: float
    curves: tuple[CurveRow, ...]  # the kind curves, then the per-operator curves


@dataclasses.dataclass(frozen=True)
class OperatorCalibration:
    """Everything ``calibrate_operators`` found; the report renders it."""

    folder: str
    gpu: GpuSpec
    options: OperatorOptions
    peak_flops: float
    samples: int
    fwd_samples: int
    bwd_samples: int
    excluded: tuple[str, ...]
    achieved: tuple[AchievedRow, ...]
    holdout_fit: EfficiencyFit  # on the other 80 %
    compare_fit: EfficiencyFit | None
    holdout_samples: int
    holdout_labels: tuple[str, ...]  # the op_curves mode of each error column
    holdout_rows: tuple[ErrorRow, ...]
    memory_curve_rows: tuple[ErrorRow, ...]  # memory-bound operators on the kind memory curve
    final_fit: EfficiencyFit
    in_sample_rows: tuple[ErrorRow, ...]
    holdout: ErrorStats  # all hold-out samples, op_curves mode
    block: str  # the YAML efficiency block
    seconds: float


def _curve_rows(spec: EfficiencySpec, layout: ParamLayout, rates: tuple[float, float]) -> tuple[CurveRow, ...]:
    def row(name: str, c: EfficiencyCurve, compute: bool) -> CurveRow:
        fixed = c.half_work / (rates[0 if compute else 1] * c.max_fraction) / US
        return CurveRow(name, "FLOPs" if compute else "bytes", c.max_fraction, c.half_work, fixed)

    flops_keys = layout.flops_keys
    kinds = [row(name, getattr(spec, name), name != "memory") for name in CURVES]
    return (*kinds, *(row(key, c, key in flops_keys) for key, c in spec.ops.items()))


def _fit(
    samples: OpSamples, gpu: GpuSpec, peak: float, mode: str, opts: OperatorOptions, start: EfficiencySpec
) -> EfficiencyFit:
    t0 = time.perf_counter()
    excluded = opts.curve_excluded_tags
    layout = ParamLayout.for_keys(op_curve_keys(samples, mode, opts.min_samples, excluded))
    fixed = opts.kernel_overhead_us is not None
    if fixed:
        start = start.model_copy(update={"kernel_overhead_s": opts.kernel_overhead_us * US})
    spec, res = fit_efficiency(
        samples, gpu, peak, start, loss=opts.loss, max_nfev=opts.max_nfev, layout=layout,
        fix_overhead=fixed, curve_excluded_tags=excluded,
    )
    rates = (peak, gpu.hbm_bandwidth_bytes_per_s)
    return EfficiencyFit(
        mode, len(samples), spec, layout, int(res.nfev), int(res.status), time.perf_counter() - t0,
        _curve_rows(spec, layout, rates),
    )


def _with(gpu: GpuSpec, spec: EfficiencySpec) -> GpuSpec:
    return gpu.model_copy(update={"efficiency": spec})


def _source(folder: str, gpu: GpuSpec, opts: OperatorOptions, samples: OpSamples, excluded: list[str],
            fit: EfficiencyFit, holdout: ErrorStats) -> str:
    mode = opts.op_curves
    curves_note = (
        f"kind curves + {len(fit.layout.keys)} per-operator curves ({mode}, >= {opts.min_samples} samples; "
        f"softmax curve from {opts.softmax_curve}; memory curve from {', '.join(DEFAULT_MEMORY_TAGS)})"
        if fit.layout.keys
        else "kind curves only"
    )
    if opts.kernel_overhead_us is not None:
        curves_note += f"; kernel overhead fixed at {opts.kernel_overhead_us:g} us"
    date = opts.date or _dt.date.today().isoformat()
    return (
        f"fitted by {COMMAND} operators {folder} --gpu {gpu.name} --op-curves {mode} on {date}: "
        f"{len(samples)} fwd/bwd samples of {len(set(samples.tag))} operator tags (GPUModeling25, fp16), "
        f"excluded {'; '.join(excluded) or 'nothing'}; {curves_note}; "
        f"least_squares on log(pred/measured) via estimate_op_s; 20% hold-out (seed {opts.seed}) "
        f"median |err| {holdout.median_abs:.1f}%, mean |err| {holdout.mean_abs:.1f}%"
    )


def calibrate_operators(
    folder: Path, gpu: GpuSpec, options: OperatorOptions | None = None, log: Callable[[str], None] = silent
) -> OperatorCalibration:
    """Fit ``gpu``'s ``EfficiencySpec`` to the operator samples in ``folder``.

    Fits on a random 80 % of the grid points (and, unless ``options.compare`` is "off", a
    comparison mode on the same 80 %), scores both on the other 20 %, then refits on every
    sample, starting from the 80 % fit. ``log`` gets one line per file and per fit.
    """
    t0 = time.perf_counter()
    opts = options or OperatorOptions()
    opts.check()
    try:
        peak = gpu.flops_for(Precision(opts.precision))
    except ValueError as exc:
        raise ConfigError(f"precision: {exc}") from None
    excluded: list[str] = []
    samples = load_operator_samples(folder, gpu, log, excluded)
    if not len(samples):
        raise ConfigError(f"{folder}: no usable operator samples of {gpu.name}")
    mode = opts.op_curves
    test = split_mask(samples.key, opts.holdout, opts.seed)
    train_set, test_set = samples.subset(~test), samples.subset(test)
    log(f"fitting op curves {mode} on {len(train_set)} samples ({1 - opts.holdout:.0%})")
    fit80 = _fit(train_set, gpu, peak, mode, opts, EfficiencySpec())
    test_pred = predict_ops(test_set, _with(gpu, fit80.spec), peak)
    holdout = err_stats(test_pred, np.asarray(test_set.measured))

    preds, labels, compare_fit = [test_pred], [mode], None
    if opts.compare not in ("off", mode):
        log(f"comparison fit: op curves {opts.compare} on the same samples")
        compare_fit = _fit(train_set, gpu, peak, opts.compare, opts, EfficiencySpec())
        preds.insert(0, predict_ops(test_set, _with(gpu, compare_fit.spec), peak))
        labels.insert(0, opts.compare)

    memory_rows: list[ErrorRow] = []
    memory_bound = np.array([op.kind not in COMPUTE_KINDS for op in test_set.ops])
    if fit80.spec.ops and memory_bound.any():
        sub = test_set.subset(memory_bound)
        kind_only = _with(gpu, fit80.spec.model_copy(update={"ops": {}}))
        memory_rows = error_rows(sub, [predict_ops(sub, kind_only, peak)])

    rel = rel_path(folder)
    source = _source(rel, gpu, opts, samples, excluded, fit80, holdout)
    log(f"final fit on all {len(samples)} samples")
    final = _fit(samples, gpu, peak, mode, opts, fit80.spec.model_copy(update={"source": source}))
    all_pred = predict_ops(samples, _with(gpu, final.spec), peak)
    return OperatorCalibration(
        folder=rel, gpu=gpu, options=opts, peak_flops=peak, samples=len(samples),
        fwd_samples=samples.phase.count(FWD), bwd_samples=samples.phase.count(BWD),
        excluded=tuple(excluded), achieved=tuple(achieved_rows(samples, gpu, peak)),
        holdout_fit=fit80, compare_fit=compare_fit, holdout_samples=len(test_set),
        holdout_labels=tuple(labels), holdout_rows=tuple(error_rows(test_set, preds)),
        memory_curve_rows=tuple(memory_rows), final_fit=final,
        in_sample_rows=tuple(error_rows(samples, [all_pred])), holdout=holdout,
        block=efficiency_yaml(final.spec, final.layout.flops_keys), seconds=time.perf_counter() - t0,
    )
