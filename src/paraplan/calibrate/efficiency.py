"""Fit a GPU's ``EfficiencySpec`` to operator samples (``scipy.optimize.least_squares``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence

import numpy as np

from paraplan.calibrate._common import import_extra
from paraplan.calibrate.operators import BWD, DEFAULT_MEMORY_TAGS, FWD, OpSamples, phase_work, predict_ops
from paraplan.calibrate.params import OVERHEAD, ParamLayout
from paraplan.specs import EfficiencyCurve, EfficiencySpec, GpuSpec

__all__ = ["fit_efficiency"]


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
        works = [sum(w[0 if compute else 1] for w in phase_work(samples.ops[i], ph)) for i in idx]
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


def _groups(
    samples: OpSamples,
    layout: ParamLayout,
    default_memory_tags: Sequence[str],
    curve_excluded_tags: Collection[str],
) -> list[_Group]:
    """The residual blocks of :func:`fit_efficiency`, one per (tag, phase) and block."""
    tags, phases = np.asarray(samples.tag), np.asarray(samples.phase)
    groups: list[_Group] = []
    for tag in dict.fromkeys(samples.tag):
        for ph in (FWD, BWD):
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
    return groups


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

    Returns the fitted spec (with ``start.source``) and scipy's ``OptimizeResult``.
    """
    least_squares = import_extra("scipy.optimize").least_squares
    lil_matrix = import_extra("scipy.sparse").lil_matrix
    layout = layout or ParamLayout()
    theta0 = layout.theta(start, _per_op_start(samples, layout, gpu, peak, start, curve_excluded_tags))
    groups = _groups(samples, layout, default_memory_tags, curve_excluded_tags)
    used = sorted(set().union(*(set(g.params.tolist()) for g in groups)))
    free = np.zeros(layout.size, dtype=bool)
    free[used] = True
    if fix_overhead:
        free[OVERHEAD] = False
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
