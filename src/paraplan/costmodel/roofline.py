"""Roofline time of one operator with size-dependent efficiency curves from the GPU's catalog.

time = max(compute time, memory time) + kernel overhead, where
compute time = (FLOPs + half_work) / (peak FLOP/s * max_fraction) and
memory time  = (bytes + half_work) / (HBM bandwidth * max_fraction)
(see ``EfficiencyCurve``: achieved rate rises with the size of the work and saturates).
The cost model divides a GEMM's compute time by its sustained-clock factor
(``sustained_gemm_factor``): the curves were calibrated on short bursts, a training step runs
at the clock the board holds at its power limit; fused attention by its own held factor
(``sustained_attention_factor``) where the GPU has one. An attention kernel whose catalog curve
has ``tiles`` is priced by its tiles (``attention_tile_s``), not by its FLOP curve.

One arithmetic, ``roofline_s``, serves both entry points: the module's ``estimate_op_s`` (burst:
what calibration fits curves through) and ``AnalyticalCostModel.estimate_op_s`` (held: what a
prediction runs); they differ only in what they price an operator with (``_at_burst``,
``_held``), each looked up once per operator. A new effect on an operator's time goes there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paraplan.costmodel.collectives import CollectivePricer
from paraplan.costmodel.scan_rooflines import SCAN_KINDS, scan_op_s, scan_source
from paraplan.costmodel.shared import one_per
from paraplan.inventory import Collective, GroupLayout, KernelMix, Op, OpKind
from paraplan.specs import (
    AttentionKernel,
    ClusterSpec,
    EfficiencyCurve,
    EfficiencySpec,
    GpuSpec,
    KernelCurve,
    Phase,
    Precision,
)

COMPUTE_KINDS = {OpKind.GEMM: "gemm", OpKind.BMM: "gemm", OpKind.ATTENTION: "attention"}


def with_attention_kernel(gpu: GpuSpec, kernel: AttentionKernel | None) -> GpuSpec:
    """``gpu`` with its attention curve replaced by ``kernel``'s measured one (the job's
    ``parallel.attention_kernel``); ``gpu`` itself for no kernel or a kernel the catalog has no
    curve of on it (``calibration.attention_kernel_gaps`` says so). The same object for the same
    (GPU, kernel), so that the curve caches keyed by its efficiency spec keep hitting."""
    return gpu if kernel is None else one_per(_with_kernel_curve, gpu, kernel)


def _with_kernel_curve(gpu: GpuSpec, kernel: AttentionKernel) -> GpuSpec:
    eff = gpu.efficiency
    curve = eff.attention_kernel_curve(kernel)
    if curve is None:
        return gpu
    return gpu.model_copy(update={"efficiency": eff.model_copy(update={"attention": curve})})


def with_queued_gap(gpu: GpuSpec, on: bool) -> GpuSpec:
    """``gpu`` with each kernel also paying its measured idle gap between back-to-back queued
    kernels (``efficiency.queued_gap``, folded into ``kernel_overhead_s``: the roofline adds it
    once per launch) when ``on`` (``parallel.queued_kernel_gap``); ``gpu`` itself when off or
    not measured for this GPU (``queued_gap_notes`` says so). The same object for the same GPU."""
    if not on or gpu.efficiency.queued_gap is None:
        return gpu
    return one_per(_with_gap_overhead, gpu)


def _with_gap_overhead(gpu: GpuSpec) -> GpuSpec:
    eff = gpu.efficiency
    return gpu.model_copy(update={"efficiency": eff.model_copy(
        update={"kernel_overhead_s": eff.kernel_overhead_s + eff.queued_gap.seconds})})


def queued_gap_notes(job) -> tuple[str, ...]:
    """What a prediction with ``parallel.queued_kernel_gap`` on takes without a measurement: the
    GPU has no measured gap between queued kernels, so none is added."""
    if not job.parallel.queued_kernel_gap or job.cluster.gpu.efficiency.queued_gap is not None:
        return ()
    return (f"parallel.queued_kernel_gap: {job.cluster.gpu.name} has no measured idle gap between queued "
            "kernels (efficiency.queued_gap): none added",)


def sustained_gemm_factor(cluster: ClusterSpec, precision: Precision = Precision.BF16) -> float:
    """The share of its calibrated (burst) GEMM throughput ``cluster``'s GPUs hold under
    sustained load in ``precision``: the GPU's measured ``sustained.gemm_fraction`` (its
    ``fp8_gemm_fraction`` for FP8 and FP4 GEMMs where measured; 1 where unmeasured), times
    ``(power_cap_w / tdp_w) ** cap_exponent`` when the cluster caps the GPUs below their TDP.
    Never above 1: a cap at or above the TDP changes nothing."""
    sustained = cluster.gpu.efficiency.sustained
    factor = 1.0 if sustained is None else sustained.gemm_fraction
    if sustained is not None and sustained.fp8_gemm_fraction is not None and precision in (Precision.FP8, Precision.FP4):
        factor = sustained.fp8_gemm_fraction
    cap, tdp = cluster.power_cap_w, cluster.gpu.tdp_w
    if cap is not None and tdp is not None and cap < tdp:
        exponent = 1.0 / 3.0 if sustained is None else sustained.cap_exponent
        factor *= (cap / tdp) ** exponent
    return factor


def sustained_attention_factor(cluster: ClusterSpec) -> float:
    """The share of its burst rate fused attention holds under sustained load on ``cluster``'s
    GPUs: the GPU's measured ``sustained.attention_fraction`` (times the power cap's scaling, as
    for GEMMs); 1 where unmeasured (attention at the burst rate of its curve, as before)."""
    sustained = cluster.gpu.efficiency.sustained
    if sustained is None or sustained.attention_fraction is None:
        return 1.0
    factor = sustained.attention_fraction
    cap, tdp = cluster.power_cap_w, cluster.gpu.tdp_w
    if cap is not None and tdp is not None and cap < tdp:
        factor *= (cap / tdp) ** sustained.cap_exponent
    return factor


def attention_tile_s(op: Op, phase: Phase, flops: float, peak: float, curve: EfficiencyCurve) -> float | None:
    """Compute seconds of a fused attention ``op`` priced by its tiles (``AttentionTiles``), or
    None when ``curve`` has no tile data or the op carries no head shape. Tiles: ``b h ceil(l /
    rows)`` query tiles forward, ``b h ceil(l_kv / rows)`` key tiles backward; the longest one
    spans all keys (queries backward; causal: the last query tile, the first key tile), or
    twice the executed share of them for a band narrower than causal (a sliding window). A ring
    step of context parallelism (dims ``ring``, ``inventory.layer.context_parallel_core``)
    takes the slower of its shape and the transpose another rank runs beside it."""
    tiles = curve.tiles if isinstance(curve, KernelCurve) else None  # a plain curve has none
    dims = dict(op.dims)
    if tiles is None or flops <= 0.0 or not {"b", "h", "l"} <= dims.keys():
        return None
    if tiles.head_dim is not None and dims.get("d", tiles.head_dim) != tiles.head_dim:
        return None  # measured at one head dim: cuDNN runs other tiles at others
    b, h, length = dims["b"], dims["h"], dims["l"]
    keys = dims.get("l_kv", length)
    forward = phase in (Phase.FWD, Phase.RECOMPUTE)
    rate = tiles.fwd if forward else tiles.bwd
    executed = op.exec_fraction

    def work(n: int) -> float:  # n rows of tiles, each row spanning the other side
        count = b * h * -(-n // tiles.rows)
        longest = flops / (b * h * n * executed) * min(tiles.rows, n) * min(1.0, 2.0 * executed)
        return flops + count * rate.tile_work + tiles.sms * (rate.tile_work + longest)

    tiled = max(work(length), work(keys)) if dims.get("ring") else work(length if forward else keys)
    return op.launches * tiled / (peak * rate.max_fraction)


def compute_precision(op: Op, job_precision: Precision) -> Precision:
    """The precision ``op``'s kernels run in: FP8 GEMMs at FP8 (NVFP4 ones at FP4), everything
    else of an FP8 job in BF16, of any other job in its own precision."""
    if op.fp8:
        return Precision.FP4 if op.fp4 else Precision.FP8
    return compute_precision_of_job(job_precision)


def compute_precision_of_job(precision: Precision) -> Precision:
    """The precision of a job's non-FP8 kernels (an FP8 job runs them in BF16)."""
    return Precision.BF16 if precision in (Precision.FP8, Precision.FP4) else precision


def mixed_memory_curve(eff: EfficiencySpec, mix: KernelMix, forward: bool) -> EfficiencyCurve:
    """The one curve that times ``mix``'s kernels in one direction, each kind's share of the
    bytes on its own curve (``EfficiencySpec.memory_kernel_curve``: the generic ``memory`` curve
    for a kind without one): time = sum over kinds of share (bytes + half_work_k) / (bandwidth
    max_fraction_k), i.e. 1 / max_fraction = sum share / max_fraction_k and half_work =
    max_fraction * sum share half_work_k / max_fraction_k. The one curve itself where every kind
    takes the same (``eff.memory`` where each falls back to it). ``transferred_from``: the first
    part's that has one."""
    return one_per(_mixed_memory_curve, eff, mix, forward)


def _mixed_memory_curve(eff: EfficiencySpec, mix: KernelMix, forward: bool) -> EfficiencyCurve:
    parts = [(eff.memory_kernel_curve(kind), share) for kind, share in mix.parts(forward)]
    if len({id(curve) for curve, _ in parts}) == 1:
        out = parts[0][0]  # one curve for all (one kind, or every kind on the generic curve)
    else:
        inverse = sum(share / c.max_fraction for c, share in parts)
        fraction = 1.0 / inverse
        half_work = fraction * sum(share * c.half_work / c.max_fraction for c, share in parts)
        moved = next((c.transferred_from for c, _ in parts if c.transferred_from is not None), None)
        kinds = ", ".join(f"{kind.value} {share:.0%}" for kind, share in mix.parts(forward))
        out = EfficiencyCurve(max_fraction=min(1.0, fraction), half_work=half_work, transferred_from=moved,
                              source=f"{mix.name} ({kinds}) on this GPU's memory kernel curves")
    return out


def op_curves(
    op: Op, phase: Phase, eff: EfficiencySpec, precision: Precision = Precision.BF16
) -> tuple[EfficiencyCurve | None, EfficiencyCurve, bool]:
    """(compute curve or None for memory-bound kinds, memory curve, whether a per-operator
    curve from ``eff.ops`` applied). A per-operator curve replaces the compute curve of a
    compute kind and the memory curve of a memory-bound kind. ``precision`` is the one the
    op's kernels run in (``compute_precision``): FP8 GEMMs take the GPU's FP8 curve."""
    direction = "fwd" if phase in (Phase.FWD, Phase.RECOMPUTE, Phase.OPTIMIZER) else "bwd"
    special = eff.ops.get(f"{op.name}:{direction}") or eff.ops.get(op.name) if eff.ops else None
    kind = COMPUTE_KINDS.get(op.kind)
    compute = None if kind is None else eff.compute_curve(kind, precision)
    memory = eff.memory if op.memory_kernels is None else mixed_memory_curve(eff, op.memory_kernels, direction == "fwd")
    if special is not None:
        if compute is None:
            memory = special
        else:
            compute = special
    return compute, memory, special is not None


# What an operator's compute side is priced with: (compute curve or None for memory-bound kinds,
# memory curve, compute peak FLOP/s, held factor dividing the compute time: 1 at burst).
Priced = tuple[EfficiencyCurve | None, EfficiencyCurve, float, float]


def roofline_s(op: Op, phase: Phase, gpu: GpuSpec, tensor_peak: float,
               price: Callable[[Op, Phase], Priced]) -> float:
    """The one roofline arithmetic of both entry points (the module's ``estimate_op_s`` at burst,
    ``AnalyticalCostModel.estimate_op_s`` held): seconds one rank spends on ``op`` in ``phase`` on
    ``gpu``, its curves, peak and held factor from ``price`` (asked only for work the roofline
    times); the scan kinds at ``tensor_peak`` (``scan_op_s``). ``n`` launches of equal size each
    ramp up on their own (``ramps``: a multi-stream grouped GEMM's at its measured concurrency): ``(work + n half_work) / (rate max_fraction)`` per side; attention with
    tile data is priced by its tiles (``attention_tile_s``); the held factor divides only the
    compute side (memory time is unchanged)."""
    flops, traffic = op.work(phase)
    if flops <= 0.0 and traffic <= 0.0:
        return 0.0
    if op.kind in SCAN_KINDS:
        return scan_op_s(op, phase, gpu, tensor_peak)
    compute, memory, peak, held = price(op, phase)
    n = ramps(op, gpu)
    memory_s = 0.0 if traffic <= 0.0 else (traffic + n * memory.half_work) / (
        gpu.hbm_bandwidth_bytes_per_s * memory.max_fraction)
    compute_s = 0.0
    if compute is not None:
        if flops > 0.0:
            compute_s = (flops + n * compute.half_work) / (peak * compute.max_fraction)
        if op.kind is OpKind.ATTENTION:
            compute_s = attention_tile_s(op, phase, flops / n, peak, compute) or compute_s
        compute_s /= held
    return (compute_s if compute_s > memory_s else memory_s) + n * gpu.efficiency.kernel_overhead_s


def ramps(op: Op, gpu: GpuSpec) -> float:
    """How many lone kernels' ramp-up and launch ``op``'s time pays: its ``launches``, and for a
    multi-stream grouped GEMM (Transformer Engine's) on a GPU where it was measured
    (``efficiency.grouped_gemm``) its GEMMs over their measured concurrency, when that is fewer
    side by side than its streams (``launches`` waves prices them as filling the GPU together)."""
    measured = gpu.efficiency.grouped_gemm
    if not op.multi_stream_gemms or measured is None:
        return op.launches
    return max(float(op.launches), op.multi_stream_gemms / measured.concurrency)


def estimate_op_s(
    op: Op, phase: Phase, gpu: GpuSpec, peak_flops: float, precision: Precision = Precision.BF16
) -> float:
    """Seconds one rank spends on ``op`` in ``phase`` on ``gpu`` at ``peak_flops``, with the
    curves of ``precision``, at the burst rate of the curves (what operator samples time)."""
    return roofline_s(op, phase, gpu, peak_flops, one_per(_BurstPricer, gpu, _at_burst, (peak_flops, precision)))


def _at_burst(op: Op, phase: Phase, gpu: GpuSpec, peak_flops: float, precision: Precision) -> Priced:
    """``op``'s curves in ``precision`` at ``peak_flops``, nothing held."""
    compute, memory, _ = op_curves(op, phase, gpu.efficiency, precision)
    return compute, memory, peak_flops, 1.0


def _held(op: Op, phase: Phase, gpu: GpuSpec, base: Precision, gemm_factors: tuple[tuple[Precision, float], ...],
          attention_factor: float) -> Priced:
    """``op``'s curves in the precision its kernels run in (its FP8 or FP4, else the job's
    ``base``), that precision's peak, and the factor its kind is held at under load: fused
    attention's, a GEMM's of its precision (``gemm_factors``), 1 for everything else."""
    precision = (Precision.FP4 if op.fp4 else Precision.FP8) if op.fp8 else base
    compute, memory, _ = op_curves(op, phase, gpu.efficiency, precision)
    if compute is None:  # memory-bound: no compute rate is read
        return compute, memory, 0.0, 1.0
    kind = COMPUTE_KINDS.get(op.kind)
    held = attention_factor if kind == "attention" else dict(gemm_factors)[precision] if kind == "gemm" else 1.0
    return compute, memory, gpu.peak_flops[precision], held


class _Pricer:
    """The ``price`` of ``roofline_s`` that asks ``make(op, phase, gpu, *args)`` once per
    operator name, kind, phase, FP8/FP4 and kernel mix (all its curves and rates depend on). A class, not a
    closure, so that a cost model (and a prediction holding one) pickles: the search's process
    executor and Ray send predictions between processes; the cache is rebuilt there."""

    __slots__ = ("args", "gpu", "make", "prices")

    def __init__(self, gpu: GpuSpec, make: Callable[..., Priced], args: tuple[object, ...]) -> None:
        self.make, self.gpu, self.args = make, gpu, args
        self.prices: dict[tuple, Priced] = {}

    def __call__(self, op: Op, phase: Phase) -> Priced:
        mix = op.memory_kernels
        name = (op.name, op.kind, phase, op.fp8, op.fp4, None if mix is None else mix.name)
        priced = self.prices.get(name)
        if priced is None:
            priced = self.prices[name] = self.make(op, phase, self.gpu, *self.args)
        return priced

    def __reduce__(self):
        return (type(self), (self.gpu, self.make, self.args))


class _BurstPricer(_Pricer):
    """``estimate_op_s``'s ``_Pricer``: its own maker in ``shared.one_per``, so that the GPU
    copies a calibration fit makes (one per trial spec) never push out the cost models' pricers."""

    __slots__ = ()


def _pricer(make: Callable[..., Priced], gpu: GpuSpec, *args: object) -> _Pricer:
    """The ``_Pricer`` of ``make`` on ``gpu`` with ``args``, shared by every cost model of the
    same (catalog) GPU and settings."""
    return one_per(_Pricer, gpu, make, args)


class AnalyticalCostModel:
    """Roofline operators and alpha-beta collectives for one cluster and precision."""

    name = "analytical"

    def __init__(self, cluster: ClusterSpec, precision: Precision, *, sustained: bool = True,
                 attention_kernel: AttentionKernel | None = None, queued_gap: bool = False) -> None:
        """``sustained=False`` times GEMMs at the burst rate of the calibration data (the
        regime operator samples are timed in; fitting against them uses it). ``attention_kernel``
        (the plan's) times fused attention on that kernel's curve where the GPU has one.
        ``queued_gap`` (the plan's ``queued_kernel_gap``) adds the GPU's measured idle gap
        between queued kernels to each kernel (``with_queued_gap``)."""
        self.cluster = cluster
        self.gpu = with_queued_gap(with_attention_kernel(cluster.gpu, attention_kernel), queued_gap)
        self.precision = precision
        base = compute_precision_of_job(precision)  # what non-FP8 kernels run in
        self.peak_flops = cluster.gpu.flops_for(base)
        gemm = tuple((p, sustained_gemm_factor(cluster, p) if sustained else 1.0) for p in Precision)
        attention = sustained_attention_factor(cluster) if sustained else 1.0
        self._price = _pricer(_held, self.gpu, base, gemm, attention)
        self._collective = one_per(CollectivePricer, cluster)

    @classmethod
    def of_plan(cls, cluster: ClusterSpec, precision: Precision, plan: Any) -> AnalyticalCostModel:
        """The roofline for the kernel settings of ``plan``: a ``ParallelPlan``, or a search space
        all of whose plans share them (``SearchSpace``: its ``attention_kernel`` and
        ``queued_kernel_gap``). Prediction and the search's screen both build it here, so a
        plan-wide kernel setting is read in one place."""
        return cls(cluster, precision, attention_kernel=plan.attention_kernel, queued_gap=plan.queued_kernel_gap)

    def estimate_op_s(self, op: Op, phase: Phase) -> float:
        """The module's ``estimate_op_s`` (``roofline_s``) at the clock held under load, each
        operator's curves, peak and held factor looked up once."""
        return roofline_s(op, phase, self.gpu, self.peak_flops, self._price)

    def estimate_collective_s(self, coll: Collective, layout: GroupLayout) -> float:
        """``costmodel.collectives.estimate_collective_s`` on the cluster, each call's shape
        priced once (``CollectivePricer``)."""
        return self._collective(coll, layout)

    def collective_source(self, coll: Collective, layout: GroupLayout) -> str:
        """What priced ``coll`` (measured times, a fitted curve, NCCL's LL model, alpha-beta,
        DeepEP's model): the label ``CollectivePricer`` memoises with its time."""
        return self._collective.source(coll, layout)

    def collective_last_measured(self, coll: Collective, layout: GroupLayout) -> float | None:
        """The largest message size the intra-node curve measured on ``coll``'s group where
        ``coll`` is larger (its time extrapolated along the fitted curve), else None: from the
        same memo as its time (``CollectivePricer``)."""
        return self._collective.priced_call(coll, layout).last_measured

    def source_of(self, op: Op, phase: Phase) -> str:
        if op.kind in SCAN_KINDS:
            return scan_source(op)
        precision = compute_precision(op, self.precision)
        compute, memory, special = op_curves(op, phase, self.gpu.efficiency, precision)
        where = f"roofline ({op.name} curve)" if special else "roofline"
        if not special and compute is None and memory is not self.gpu.efficiency.memory:
            where = f"roofline ({op.memory_kernels.name} memory kernel curves)"
        return f"{where}, {precision.value}" if op.fp8 else where
