"""Roofline time of one operator with size-dependent efficiency curves from the GPU's catalog.

time = max(compute time, memory time) + kernel overhead, where
compute time = (FLOPs + half_work) / (peak FLOP/s * max_fraction) and
memory time  = (bytes + half_work) / (HBM bandwidth * max_fraction)
(see ``EfficiencyCurve``: achieved rate rises with the size of the work and saturates).
"""

from __future__ import annotations

from paraplan.costmodel.collectives import estimate_collective_s as _collective_s
from paraplan.inventory import Collective, GroupLayout, Op, OpKind
from paraplan.specs import ClusterSpec, EfficiencyCurve, EfficiencySpec, GpuSpec, Phase, Precision

_COMPUTE_KINDS = {OpKind.GEMM: "gemm", OpKind.BMM: "gemm", OpKind.ATTENTION: "attention"}


def _seconds(work: float, rate: float, curve: EfficiencyCurve) -> float:
    if work <= 0.0:
        return 0.0
    return (work + curve.half_work) / (rate * curve.max_fraction)


def op_curves(
    op: Op, phase: Phase, eff: EfficiencySpec
) -> tuple[EfficiencyCurve | None, EfficiencyCurve, bool]:
    """(compute curve or None for memory-bound kinds, memory curve, whether a per-operator
    curve from ``eff.ops`` applied). A per-operator curve replaces the compute curve of a
    compute kind and the memory curve of a memory-bound kind."""
    direction = "fwd" if phase in (Phase.FWD, Phase.RECOMPUTE, Phase.OPTIMIZER) else "bwd"
    special = eff.ops.get(f"{op.name}:{direction}") or eff.ops.get(op.name) if eff.ops else None
    kind = _COMPUTE_KINDS.get(op.kind)
    compute = None if kind is None else getattr(eff, kind)
    memory = eff.memory
    if special is not None:
        if compute is None:
            memory = special
        else:
            compute = special
    return compute, memory, special is not None


def estimate_op_s(op: Op, phase: Phase, gpu: GpuSpec, peak_flops: float) -> float:
    """Seconds one rank spends on ``op`` in ``phase`` on ``gpu`` at ``peak_flops``."""
    flops, traffic = op.work(phase)
    if flops <= 0.0 and traffic <= 0.0:
        return 0.0
    eff = gpu.efficiency
    compute, memory, _ = op_curves(op, phase, eff)
    memory_s = _seconds(traffic, gpu.hbm_bandwidth_bytes_per_s, memory)
    compute_s = 0.0 if compute is None else _seconds(flops, peak_flops, compute)
    return (compute_s if compute_s > memory_s else memory_s) + eff.kernel_overhead_s


# Curves per efficiency spec, shared by every cost model of the same (catalog) GPU. The spec
# is kept in the value so that its id cannot be reused while the entry exists.
_CURVE_CACHES: dict[int, tuple[EfficiencySpec, dict]] = {}


def _curve_cache(eff: EfficiencySpec) -> dict[tuple[str, OpKind, Phase], tuple]:
    hit = _CURVE_CACHES.get(id(eff))
    if hit is None or hit[0] is not eff:
        if len(_CURVE_CACHES) > 64:
            _CURVE_CACHES.clear()
        hit = _CURVE_CACHES[id(eff)] = (eff, {})
    return hit[1]


class AnalyticalCostModel:
    """Roofline operators and alpha-beta collectives for one cluster and precision."""

    name = "analytical"

    def __init__(self, cluster: ClusterSpec, precision: Precision) -> None:
        self.cluster = cluster
        self.gpu = cluster.gpu
        self.peak_flops = cluster.gpu.flops_for(precision)
        self._curves = _curve_cache(cluster.gpu.efficiency)

    def estimate_op_s(self, op: Op, phase: Phase) -> float:
        """Same as the module's ``estimate_op_s``, with each operator's curves looked up once."""
        flops, traffic = op.work(phase)
        if flops <= 0.0 and traffic <= 0.0:
            return 0.0
        key = (op.name, op.kind, phase)
        curves = self._curves.get(key)
        if curves is None:
            curves = self._curves[key] = op_curves(op, phase, self.gpu.efficiency)
        compute, memory, _ = curves
        memory_s = _seconds(traffic, self.gpu.hbm_bandwidth_bytes_per_s, memory)
        compute_s = 0.0 if compute is None else _seconds(flops, self.peak_flops, compute)
        return (compute_s if compute_s > memory_s else memory_s) + self.gpu.efficiency.kernel_overhead_s

    def estimate_collective_s(self, coll: Collective, layout: GroupLayout) -> float:
        return _collective_s(coll, layout, self.cluster)

    def source_of(self, op: Op, phase: Phase) -> str:
        special = op_curves(op, phase, self.gpu.efficiency)[2]
        return f"roofline ({op.name} curve)" if special else "roofline"
