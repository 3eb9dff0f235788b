"""Roofline time of one operator with size-dependent efficiency curves from the GPU's catalog.

time = max(compute time, memory time) + kernel overhead, where
compute time = (FLOPs + half_work) / (peak FLOP/s * max_fraction) and
memory time  = (bytes + half_work) / (HBM bandwidth * max_fraction)
(see ``EfficiencyCurve``: achieved rate rises with the size of the work and saturates).
"""

from __future__ import annotations

from paraplan.costmodel.collectives import estimate_collective_s as _collective_s
from paraplan.inventory import Collective, GroupLayout, Op, OpKind
from paraplan.specs import ClusterSpec, EfficiencyCurve, GpuSpec, Phase, Precision

_COMPUTE_KINDS = {OpKind.GEMM: "gemm", OpKind.BMM: "gemm", OpKind.ATTENTION: "attention"}


def _seconds(work: float, rate: float, curve: EfficiencyCurve) -> float:
    if work <= 0.0:
        return 0.0
    return (work + curve.half_work) / (rate * curve.max_fraction)


def estimate_op_s(op: Op, phase: Phase, gpu: GpuSpec, peak_flops: float) -> float:
    """Seconds one rank spends on ``op`` in ``phase`` on ``gpu`` at ``peak_flops``."""
    flops, traffic = op.work(phase)
    if flops <= 0.0 and traffic <= 0.0:
        return 0.0
    eff = gpu.efficiency
    memory_s = _seconds(traffic, gpu.hbm_bandwidth_bytes_per_s, eff.memory)
    curve_name = _COMPUTE_KINDS.get(op.kind)
    if curve_name is None:
        compute_s = 0.0
    else:
        compute_s = _seconds(flops, peak_flops, getattr(eff, curve_name))
    return max(compute_s, memory_s) + eff.kernel_overhead_s


class AnalyticalCostModel:
    """Roofline operators and alpha-beta collectives for one cluster and precision."""

    name = "analytical"

    def __init__(self, cluster: ClusterSpec, precision: Precision) -> None:
        self.cluster = cluster
        self.gpu = cluster.gpu
        self.peak_flops = cluster.gpu.flops_for(precision)

    def estimate_op_s(self, op: Op, phase: Phase) -> float:
        return estimate_op_s(op, phase, self.gpu, self.peak_flops)

    def estimate_collective_s(self, coll: Collective, layout: GroupLayout) -> float:
        return _collective_s(coll, layout, self.cluster)

    def source_of(self, op: Op, phase: Phase) -> str:
        return "roofline"
