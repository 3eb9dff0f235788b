"""Which of a job's kernels the cost model times with generic guesses instead of curves
measured on its GPU: every output carries these notes (``Prediction.uncalibrated``)."""

from __future__ import annotations

from collections.abc import Iterable

from paraplan.costmodel.roofline import COMPUTE_KINDS, compute_precision, sustained_gemm_factor
from paraplan.costmodel.scan_rooflines import SCAN_KINDS, attention_variant_gaps, scan_gaps
from paraplan.costmodel.shared import one_per
from paraplan.inventory import Op
from paraplan.specs import ClusterSpec, GpuSpec, HeteroJob, Job, Precision


def calibration_gaps(gpu: GpuSpec, precision: Precision, ops: Iterable[Op]) -> tuple[str, ...]:
    """One note per (kernel kind, precision) the ops use that has no curve measured on
    ``gpu``: the generic fraction of peak used instead, or the GPU the curve was measured on."""
    return one_per(_gaps_of, gpu, precision, _Signed(tuple(ops)))


class _Signed:
    """A job's operators, equal (and hashed) by what decides their notes: each operator's curve
    group, precision, kernel mix and whether it works (``calibration_gaps``' cache key)."""

    __slots__ = ("ops", "signature")

    def __init__(self, ops: tuple[Op, ...]) -> None:
        self.ops = ops
        self.signature = frozenset((op.name, op.kind, op.fp8, op.fp4, _works(op),
                                    None if op.memory_kernels is None else op.memory_kernels.name) for op in ops)

    def __hash__(self) -> int:
        return hash(self.signature)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Signed) and other.signature == self.signature


def _gaps_of(gpu: GpuSpec, precision: Precision, ops: _Signed) -> tuple[str, ...]:
    return _calibration_gaps(gpu, precision, ops.ops)


def _works(op: Op) -> bool:
    return bool(op.flops or op.bytes or op.bwd_flops or op.bwd_bytes)


def _calibration_gaps(gpu: GpuSpec, precision: Precision, ops: tuple[Op, ...]) -> tuple[str, ...]:
    eff = gpu.efficiency
    gaps: dict[tuple[str, Precision], str] = {}
    for op in ops:
        if op.kind in SCAN_KINDS:
            continue  # no curve of their own: ``scan_gaps`` says so
        kind = COMPUTE_KINDS.get(op.kind, "memory")
        run_in = compute_precision(op, precision)
        own = eff.ops.get(op.name) or eff.ops.get(f"{op.name}:fwd")
        group = op.name if own is not None and kind != "memory" else kind  # e.g. bmm's own curve
        key = (group, run_in if kind != "memory" else Precision.BF16)
        if kind == "memory" and own is None and op.memory_kernels is not None and _works(op):
            _kind_gaps(gpu, op, gaps)
            if all(part[0] in eff.memory_kernels for part in (*op.memory_kernels.fwd, *op.memory_kernels.bwd)):
                continue  # every kind on its own curve: the generic memory curve times none of it
        if key in gaps or not _works(op):
            continue
        if own is not None and own.transferred_from is None:
            continue  # this operator's own measured curve
        if own is None and eff.measured(kind, run_in):
            continue
        curve = own or (eff.memory if kind == "memory" else eff.compute_curve(kind, run_in))
        what = "memory-bound kernels" if kind == "memory" else f"{run_in.value} {group} kernels"
        if curve.transferred_from is not None:
            gaps[key] = f"{gpu.name}: {what} timed with curves measured on {curve.transferred_from}"
            continue
        peak = "HBM bandwidth" if kind == "memory" else f"{run_in.value} peak"
        gaps[key] = (
            f"{gpu.name}: no measured curve for {what}; a generic {curve.max_fraction:.0%} of "
            f"its {peak} is used"
        )
    return tuple(gaps.values()) + scan_gaps(gpu, ops) + attention_variant_gaps(gpu, ops)


def _kind_gaps(gpu: GpuSpec, op: Op, gaps: dict) -> None:
    """A note per kind of streaming kernel ``op`` runs whose own curve (``efficiency.memory_kernels``)
    was measured on another GPU; a kind without a curve takes the generic ``memory`` curve, whose
    note (if any) is the kind-level one, as for operators whose kinds are not known."""
    for part in (*op.memory_kernels.fwd, *op.memory_kernels.bwd):
        curve = gpu.efficiency.memory_kernels.get(part[0])
        key = (f"memory:{part[0].value}", Precision.BF16)
        if curve is not None and curve.transferred_from is not None and key not in gaps:
            gaps[key] = (f"{gpu.name}: memory-bound {part[0].value} kernels timed with curves measured on "
                         f"{curve.transferred_from}")


_KERNEL_NAMES = {"fa1": "FlashAttention-1", "fa2": "FlashAttention-2", "fa3": "FlashAttention-3", "cudnn": "cuDNN fused attention",
                 "triton": "Triton flash attention", "sdpa": "PyTorch SDPA flash (FlashAttention-2)"}


def attention_kernel_gaps(job: Job | HeteroJob) -> tuple[str, ...]:
    """What the job's ``parallel.attention_kernel`` takes without a measurement: each GPU's own
    attention curve where the catalog has no curve of that kernel on it (never silently). Where
    the model's attention is unfused, ``attention_kernel_ignored`` says the kernel is ignored."""
    kernel = job.parallel.attention_kernel
    if kernel is None or job.model.attention != "flash":
        return ()
    name = _KERNEL_NAMES[kernel.value]
    groups = getattr(job.cluster, "node_groups", None)
    gpus = [g.gpu for g in groups] if groups else [job.cluster.gpu]
    return tuple(
        f"{gpu.name}: uncalibrated {name} (parallel.attention_kernel {kernel.value}): no operator-level "
        f"measurements of it on this GPU; its attention curve ({gpu.efficiency.attention.max_fraction:.0%} "
        "of peak at most) is used"
        for gpu in {g.name: g for g in gpus}.values() if gpu.efficiency.attention_kernel_curve(kernel) is None)


def attention_kernel_ignored(job: Job | HeteroJob) -> tuple[str, ...]:
    """The job's ``parallel.attention_kernel`` ignored, said where the model's attention is
    unfused (no fused kernel runs): a setting of the plan, not a gap in the calibration."""
    kernel = job.parallel.attention_kernel
    if kernel is None or job.model.attention == "flash":
        return ()
    return (f"parallel.attention_kernel {kernel.value}: the model's attention is unfused",)


def power_gaps(cluster: ClusterSpec, precision: Precision = Precision.BF16) -> tuple[str, ...]:
    """What the sustained-clock GEMM effect (``roofline.sustained_gemm_factor``) takes without
    a measurement: no sustained/burst ratio for the GPU (its GEMMs keep the calibration data's
    burst rate), no held attention ratio (``roofline.sustained_attention_factor``: attention at
    burst), a ratio measured on another GPU, FP8 (FP4) GEMMs held at the 16-bit ratio where
    no FP8 one is measured, a power cap below the TDP scaled by the unmeasured dynamic-power
    rule, or a cap on a GPU with no TDP in the catalog (ignored)."""
    gpu, notes = cluster.gpu, []
    sustained = gpu.efficiency.sustained
    if sustained is None:
        notes.append(
            f"{gpu.name}: no sustained-clock GEMM measurement; GEMMs and attention at the burst rate of "
            "its calibration data (a training step's power-limited clock may be slower)"
        )
    elif sustained.attention_fraction is None:
        # not a gap of the GPU's curves (the interval regime reads notes naming the GPU first)
        notes.append(
            f"attention on {gpu.name} at the burst rate of its calibration data: no sustained-clock "
            "attention measurement (its GEMMs are held at the measured factor)"
        )
    elif sustained.transferred_from is not None:
        notes.append(
            f"{gpu.name}: sustained-clock GEMM factor {sustained.gemm_fraction:.3f} measured on "
            f"{sustained.transferred_from}"
        )
    if sustained is not None and sustained.fp8_gemm_fraction is None and precision in (Precision.FP8, Precision.FP4):
        notes.append(
            f"{gpu.name}: no {precision.value.upper()} sustained-clock GEMM measurement; its GEMMs held at "
            f"the 16-bit factor {sustained.gemm_fraction:.3f} (FP8 GEMMs draw more power and may settle lower)"
        )
    cap, tdp = cluster.power_cap_w, gpu.tdp_w
    if cap is not None and tdp is None:
        notes.append(f"{cluster.name}: power cap {cap:.0f} W ignored: no TDP for {gpu.name} in the catalog")
    elif cap is not None and cap < tdp and (sustained is None or sustained.cap_source is None):
        base = 1.0 if sustained is None else sustained.gemm_fraction
        exponent = 1.0 / 3.0 if sustained is None else sustained.cap_exponent
        notes.append(
            f"{cluster.name}: GPUs capped at {cap:.0f} W below {gpu.name}'s {tdp:.0f} W TDP: GEMMs "
            f"at {sustained_gemm_factor(cluster) / base:.1%} of the uncapped rate by the dynamic-power "
            f"rule clock ~ power^{exponent:.3g} (no measured cap sweep; an upper bound on throughput)"
        )
    return tuple(notes)


def link_gaps(cluster: ClusterSpec) -> tuple[str, ...]:
    """One note per link the cluster's collectives use whose NCCL efficiency is a generic
    guess: a measured one has its source under the cluster's ``sources: <intra|inter>_node_efficiency``
    or in the link's own ``source`` (a GPU's catalog link)."""
    notes = []
    for name, link, used in (("intra_node", cluster.intra_node, cluster.gpus_per_node > 1),
                             ("inter_node", cluster.inter_node, cluster.num_nodes > 1)):
        if used and link is not None and link.source is None and f"{name}_efficiency" not in cluster.sources:
            where = name.replace("_", "-")
            notes.append(
                f"{cluster.name}: {where} collectives at a generic {link.efficiency:.0%} of the link's "
                "bandwidth (no NCCL measurements for this cluster)"
            )
    return tuple(notes)


def expert_gaps(job: Job) -> tuple[str, ...]:
    """What a mixture-of-experts prediction assumes without a measurement: the router's
    balance (the busiest expert-parallel rank sets each MoE layer's time, and the default is
    the auxiliary loss's ideal, a perfectly even split) and the experts' GEMMs, costed on the
    GPU's dense GEMM curve (side by side as the GPU's ``efficiency.grouped_gemm`` measured, or
    as the streams' GEMMs filling the GPU together where it has none)."""
    model, plan = job.model, job.parallel
    if not model.is_moe:
        return ()
    measured = job.cluster.gpu.efficiency.grouped_gemm
    side_by_side = (f"at their measured concurrency on this GPU ({measured.concurrency:.2f} of Transformer "
                    "Engine's streams' GEMMs side by side; torch._grouped_mm's one kernel under fsdp)"
                    if measured is not None else
                    "each wave of side-by-side GEMMs (model.moe_grouped_gemm_streams: Transformer Engine's 4 "
                    "streams under megatron, torch._grouped_mm's one kernel under fsdp) at its summed size "
                    "(no grouped-GEMM measurements for this GPU)")
    notes = [f"experts' GEMMs costed on the dense GEMM curve, {side_by_side}"]
    if plan.ep > 1 and plan.expert_load_imbalance == 1.0 and model.moe_expert_capacity_factor is None:
        notes.insert(0, "expert load assumed perfectly balanced over the expert-parallel ranks "
                     "(parallel.expert_load_imbalance 1.0); give the busiest rank's tokens over the mean")
    return tuple(notes)
