"""GPUs, links and clusters as validated, frozen values."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from paraplan.specs._types import (
    Bandwidth,
    Bytes,
    Float,
    FlopRate,
    Fraction,
    HalfWork,
    Int,
    Seconds,
    Usd,
    Watts,
)
from paraplan.specs.enums import AttentionKernel, MemoryKernel, Precision
from paraplan.specs.errors import short_repr

_FROZEN = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class EfficiencyCurve(BaseModel):
    """Achieved rate = peak * max_fraction * work / (work + half_work).

    Equivalently time = (work + half_work) / (peak * max_fraction): a fixed start-up cost
    (``half_work`` worth of work) plus a rate. ``work`` is FLOPs for compute curves and bytes
    for memory curves. The two numbers are calibrated per GPU from single-operator timings.
    """

    model_config = _FROZEN
    max_fraction: Fraction
    half_work: HalfWork
    source: str | None = None  # where this curve's numbers come from, when not the spec's source
    # the GPU whose measurements the curve was taken from when this GPU has none of its own
    transferred_from: str | None = None
    # a curve fitted to operator timings (``paraplan calibrate trace``, ``calibrate attention``):
    # the points fitted and held out, and the held-out points' median |predicted / measured - 1|
    fitted: int | None = Field(default=None, ge=1)
    held_out: int | None = Field(default=None, ge=0)
    held_out_median_err: float | None = Field(default=None, ge=0.0)  # 0.05: 5 %; may pass 1


class TileRate(BaseModel):
    """One direction of a tiled attention kernel: the share of the peak its inner loop reaches
    and the fixed work of one tile (loading its queries, writing its output), in FLOPs."""

    model_config = _FROZEN
    max_fraction: Fraction
    tile_work: Float = Field(ge=0.0)


class AttentionTiles(BaseModel):
    """Attention priced by its tiles (``roofline.attention_tile_s``): a launch of ``b h ceil(s /
    rows)`` query tiles (key tiles backward) on ``sms`` SMs takes the list-scheduling bound
    (every tile's work spread over the SMs, plus one longest tile: the tail no other SM can
    share), time = (FLOPs + tiles * tile_work + sms * (tile_work + longest tile's FLOPs)) /
    (peak * max_fraction), per direction. A FLOP curve cannot tell 1,024 short tiles from 256
    long ones of the same FLOPs; measured, the long ones run 25 % slower (few tiles for the SMs)."""

    model_config = _FROZEN
    rows: int = Field(ge=1)
    sms: int = Field(ge=1)
    head_dim: int | None = Field(default=None, ge=1)  # the head dim it was measured at (others: the FLOP curve)
    fwd: TileRate
    bwd: TileRate
    fitted: int | None = Field(default=None, ge=1)
    median_err: float | None = Field(default=None, ge=0.0)  # fit's median |predicted / measured - 1|
    source: str


class KernelCurve(EfficiencyCurve):
    """One attention kernel's curve on one GPU, fitted with ``paraplan calibrate attention`` to
    operator-level points (``source`` names them): how many points were fitted and held out, and
    the held-out median |error| of the kernels' time. ``tiles``, where measured, prices the
    kernel by its tiles instead of the curve (the curve stays for ops without shapes)."""

    source: str
    tiles: AttentionTiles | None = None


class PrecisionCurves(BaseModel):
    """Tensor-core curves measured in a precision other than the 16-bit one of the base
    curves (FP8 GEMMs run their own kernels: their efficiency is not BF16's doubled)."""

    model_config = _FROZEN
    gemm: EfficiencyCurve | None = None
    attention: EfficiencyCurve | None = None
    source: str


_SIXTEEN_BIT = (Precision.BF16, Precision.FP16)


class SustainedClock(BaseModel):
    """GEMM throughput held under sustained load at the GPU's TDP, as a fraction of what the
    short bursts its curves were calibrated on reach (same random-like data, same shapes).

    Calibration benchmarks time a few kernels between idle gaps, at the boost clock; a
    training step keeps the tensor cores busy until the board sits at its power limit and
    the clock settles lower (Bekman's MAMF vs MSMF; He, "Strangely, Matrix Multiplications on
    GPUs Run Faster When Given 'Predictable' Data", 2024). ``gemm_fraction`` is that ratio,
    measured at operator level, never fitted to end-to-end runs. Below the TDP the power cap
    scales the clock by ``(cap / tdp) ** cap_exponent``."""

    model_config = _FROZEN
    gemm_fraction: Fraction
    source: str
    # FP8 (and FP4) GEMMs' own ratio where measured: they draw more power per second than
    # 16-bit ones and settle lower; None: the same as ``gemm_fraction``
    fp8_gemm_fraction: Fraction | None = None
    # the GPU the ratio was measured on when this GPU has no measurement of its own
    transferred_from: str | None = None
    # sustained clock ~ power ** exponent below the TDP: 1/3 is the dynamic-power rule
    # P ~ f V^2 with V ~ f, an upper bound on throughput (static power and the voltage floor
    # make it fall faster); ``cap_source`` None means no measured cap sweep backs it
    cap_exponent: float = Field(default=1.0 / 3.0, gt=0.0, le=2.0)
    cap_source: str | None = None
    # fused attention held at the power limit over its burst rate, where measured (its own
    # source); None: attention at the burst rate of its curve
    attention_fraction: Fraction | None = None
    attention_source: str | None = None


class GroupedGemm(BaseModel):
    """How many of Transformer Engine's multi-stream grouped GEMM's per-expert cuBLAS GEMMs
    (``GroupedLinear``: the i-th on stream i % 4) run side by side in effect, measured at
    operator level on this GPU: ``concurrency`` = local experts / the number of lone GEMMs of
    the summed work the measured time prices (``calibrate.grouped_gemm``). 4 would be four
    GEMMs filling the GPU as one; 1 each expert's GEMM one after another. Never fitted to
    end-to-end runs."""

    model_config = _FROZEN
    concurrency: Float = Field(gt=0.0, le=64.0)
    source: str


class QueuedGap(BaseModel):
    """The GPU's idle time between two kernels of one stream when the second was already queued
    (the host ahead): the front end's work between grids (the finished grid's completion, the
    next one's launch), in no kernel's measured duration. Read from profiler traces, where CUPTI's
    own timestamps may hold part of it (``parallel.queued_kernel_gap`` switches it on)."""

    model_config = _FROZEN
    seconds: Seconds
    source: str
    # the GPU the gap was measured on when this GPU has no trace of its own
    transferred_from: str | None = None


class TpOverlap(BaseModel):
    """What a GEMM with its sequence-parallel collective pipelined beside it (Megatron-LM's
    --tp-comm-overlap, Transformer Engine userbuffers; fused all-gather + GEMM and GEMM +
    reduce-scatter kernels) leaves exposed, measured at operator level on this GPU's node.

    ``exposed_fraction`` is Flux's effective communication time over the collective's own time:
    (overlapped GEMM+collective time - the GEMM alone) / the collective alone (Chang et al.
    2024, "FLUX: Fast Software-based Communication Overlap On GPUs Through Kernel Fusion",
    arXiv 2406.06858, Eq. 1-2: overlap efficiency = 1 - exposed_fraction), the GEMM's slowdown
    from the SMs the communication takes included. Measured on the best fused kernel, it is a
    floor: ``prediction.stages.tp_overlapped`` never leaves less exposed. Never fitted to
    end-to-end runs."""

    model_config = _FROZEN
    exposed_fraction: Fraction
    source: str
    # the GPU the ratio was measured on when this GPU has no measurement of its own
    transferred_from: str | None = None


class EfficiencySpec(BaseModel):
    """How close to its datasheet peaks a GPU gets, per kind of kernel.

    ``gemm`` and ``attention`` are the 16-bit (BF16/FP16) tensor-core curves; ``precisions``
    holds curves measured in other precisions. A curve left at its default is a generic
    guess, not a measurement (``measured`` tells them apart)."""

    model_config = _FROZEN
    gemm: EfficiencyCurve = EfficiencyCurve(max_fraction=0.80, half_work=4.0e9)
    attention: EfficiencyCurve = EfficiencyCurve(max_fraction=0.60, half_work=4.0e9)
    memory: EfficiencyCurve = EfficiencyCurve(max_fraction=0.80, half_work=2.0e6)
    # one curve per kind of streaming kernel measured on this GPU (``MemoryKernel``: PyTorch's
    # unrolled and strided element-wise kernels stream slower than its vectorized one); an
    # operator's kinds (``inventory.Op.memory_kernels``) without a curve here take ``memory``
    memory_kernels: dict[MemoryKernel, EfficiencyCurve] = Field(default_factory=dict)
    # one BF16 curve per attention kernel measured on this GPU (``parallel.attention_kernel``
    # picks one; without it, or for a kernel not here, ``attention`` is used)
    attention_kernels: dict[AttentionKernel, KernelCurve] = Field(default_factory=dict)
    # Per-operator curves that replace the kind's curve for one operator ("RMSlayernorm") or
    # one operator in one direction ("RMSlayernorm:bwd"): operators whose implementation runs
    # several kernels (an unfused norm) reach a different share of the peaks than one kernel.
    ops: dict[str, EfficiencyCurve] = Field(default_factory=dict)
    kernel_overhead_s: Seconds = 4e-6
    # the idle gap between back-to-back queued kernels (None: not measured for this GPU); added
    # per kernel only under ``parallel.queued_kernel_gap`` (``costmodel.roofline``)
    queued_gap: QueuedGap | None = None
    # Compute slowdown while NCCL kernels run beside it (their SMs and HBM traffic): Lee et al.
    # 2025, arXiv 2507.03114, average over A100, H100, MI250 and MI210 (40 % at most).
    overlap_slowdown: Float = Field(default=0.189, ge=0.0, le=2.0)
    # the least share of a tensor-parallel collective an overlapped GEMM leaves exposed,
    # measured at operator level (None: not measured for this GPU; --tp-comm-overlap then
    # exposes one of tp chunks, the GEMMs slowed by ``overlap_slowdown``, with no floor)
    tp_overlap: TpOverlap | None = None
    # Transformer Engine's multi-stream grouped GEMM as measured on this GPU (None: not
    # measured; its streams' GEMMs priced as filling the GPU together, one GEMM per wave)
    grouped_gemm: GroupedGemm | None = None
    precisions: dict[Precision, PrecisionCurves] = Field(default_factory=dict)
    # sustained-clock GEMM throughput (None: not measured for this GPU, GEMMs at the
    # calibration data's burst rate)
    sustained: SustainedClock | None = None
    source: str = (
        "generic defaults (no calibration for this GPU); see docs/calibration.md for the "
        "calibrated GPUs"
    )

    def compute_curve(self, kind: str, precision: Precision) -> EfficiencyCurve:
        """The ``gemm`` or ``attention`` curve for kernels running in ``precision``: its own
        measured curve when there is one, else the 16-bit curve."""
        own = self.precisions.get(precision)
        curve = getattr(own, kind) if own is not None else None
        return curve if curve is not None else getattr(self, kind)

    def memory_kernel_curve(self, kind: MemoryKernel) -> EfficiencyCurve:
        """The curve ``kind``'s streaming kernels run at on this GPU: its own where measured,
        else the generic ``memory`` curve."""
        return self.memory_kernels.get(kind) or self.memory

    def attention_kernel_curve(self, kernel: AttentionKernel) -> KernelCurve | None:
        """``kernel``'s own measured curve on this GPU (SDPA's flash backend: FlashAttention-2's),
        or None where the catalog has no data for it."""
        return self.attention_kernels.get(kernel.curve_key)

    def measured(self, kind: str, precision: Precision) -> bool:
        """Whether the curve ``compute_curve`` (or, for ``memory``, the memory curve) gives
        comes from measurements of this GPU rather than generic defaults."""
        own = self.precisions.get(precision)
        if kind != "memory" and own is not None and getattr(own, kind) is not None:
            return getattr(own, kind).transferred_from is None
        if kind != "memory" and precision not in _SIXTEEN_BIT:
            return False
        return kind in self.model_fields_set and getattr(self, kind).transferred_from is None


def _largest_not_above(sizes: dict[int, float], group: int) -> int | None:
    """The largest measured group size of ``sizes`` not above ``group``; None below them all."""
    return max((n for n in sizes if n <= group), default=None)


class CollectiveCurve(BaseModel):
    """One collective's bus bandwidth on a link, measured against message size S (nccl-tests'
    size and bus-bandwidth conventions): bus(S) = bus_bytes_per_s[n] * S / (S + half_bytes),
    n the group size (the largest measured one not above it). half_bytes holds the per-call
    latency: a call of S bytes takes moved(S) / bus(S), fitted on messages of at least
    ``fit_bytes``. ``small_s`` is the measured time of a small call (the median over messages of
    at most ``small_bytes``) per group size: below ``small_bytes`` a call takes it, between
    ``small_bytes`` and ``fit_bytes`` the straight line to the curve, never less than it.
    ``points`` are measured times per group size and message size (the median call of each size
    in the table the curve was fitted to): from ``fit_bytes`` up, a call of a group size with
    points takes the log-log interpolation between the two measured sizes around it (the curve
    cannot follow a regime change, such as XLA's collective-permutes reaching 292 GB/s from
    256 MiB on H100 after 110-120 GB/s up to 64 MiB); beyond the last measured size it is
    extrapolated along the fitted curve from that last point (``extrapolated``), below the first
    one carried back along it from the first point; the points are non-decreasing in size
    (``calibrate.collective_table.non_decreasing``), so a call never costs less for more bytes."""

    model_config = _FROZEN
    bus_bytes_per_s: dict[int, Bandwidth]
    half_bytes: HalfWork
    fit_bytes: HalfWork = 2.0**20
    small_bytes: HalfWork = 2.0**16
    small_s: dict[int, Seconds] = Field(default_factory=dict)
    points: dict[int, dict[int, Seconds]] = Field(default_factory=dict)

    @field_validator("points")
    @classmethod
    def _sorted_points(cls, points: dict[int, dict[int, float]]) -> dict[int, dict[int, float]]:
        """Each group's points in increasing message size (``measured_s`` walks them in order)."""
        for n, by_size in points.items():
            if len(by_size) < 2:
                raise ValueError(f"group {n} needs at least two measured message sizes")
        return {n: dict(sorted(by_size.items())) for n, by_size in points.items()}

    def extrapolated(self, group: int, size_bytes: float) -> bool:
        """Whether a call of ``size_bytes`` on ``group`` lies beyond the group's last measured point."""
        sizes = self.points.get(group)
        return bool(sizes) and size_bytes > max(sizes)

    def measured_s(self, group: int, size_bytes: float) -> float | None:
        """Seconds of a ``size_bytes`` call on ``group`` from its measured ``points``: log-log
        between the two measured sizes around it, beyond the last one the last point carried
        along the fitted curve (time x (S + S_1/2) / (S_last + S_1/2)), below the first one the first
        carried back along it alike (a series whose grid starts above ``fit_bytes``, 9 x 2^k bytes);
        None for a group without points."""
        by_size = self.points.get(group)
        if by_size is None:
            return None
        below = None
        for size, t in by_size.items():
            if size >= size_bytes:
                if below is None:  # below the first: that point carried back along the curve
                    return t if size == size_bytes else t * (size_bytes + self.half_bytes) / (size + self.half_bytes)
                s0, t0 = below
                share = math.log(size_bytes / s0) / math.log(size / s0)
                return t0 * (t / t0) ** share
            below = size, t
        assert below is not None
        s0, t0 = below
        return t0 * (size_bytes + self.half_bytes) / (s0 + self.half_bytes)

    def peak_for(self, group: int) -> float:
        """The asymptotic bus bandwidth of the largest measured group size not above ``group``
        (the smallest measured one below them all)."""
        n = _largest_not_above(self.bus_bytes_per_s, group)
        return self.bus_bytes_per_s[min(self.bus_bytes_per_s) if n is None else n]

    def bus_for(self, group: int, size_bytes: float) -> float:
        return self.peak_for(group) * size_bytes / (size_bytes + self.half_bytes)

    def small_for(self, group: int) -> float | None:
        """The measured small-call time of the largest measured group size not above ``group``;
        None below every measured group size (or with no small calls measured)."""
        n = _largest_not_above(self.small_s, group)
        return None if n is None else self.small_s[n]

    def _large_s(self, group: int, size_bytes: float, moved_bytes: float) -> float:
        """A call of at least ``fit_bytes``: its measured points where the group has them, else the curve."""
        measured = self.measured_s(group, size_bytes) if self.points else None
        return moved_bytes / self.bus_for(group, size_bytes) if measured is None else measured

    def seconds(self, group: int, size_bytes: float, moved_bytes: float) -> float | None:
        """Seconds of one call moving ``moved_bytes`` of a ``size_bytes`` message; None where
        the message is below the fitted sizes and no small call of the group was measured."""
        floor = self.small_for(group)
        if size_bytes >= self.fit_bytes:
            large = self._large_s(group, size_bytes, moved_bytes)
            return large if floor is None else max(large, floor)
        if floor is None:
            return None
        if size_bytes <= self.small_bytes:
            return floor
        at_fit = max(floor, self._large_s(group, self.fit_bytes, moved_bytes / size_bytes * self.fit_bytes))
        return floor + (at_fit - floor) * (size_bytes - self.small_bytes) / (self.fit_bytes - self.small_bytes)


class LinkSpec(BaseModel):
    """One kind of link, seen from one GPU.

    ``bandwidth`` is the unidirectional bandwidth per GPU (for inter-node links: the node's
    NIC bandwidth divided by its GPUs); ``efficiency`` is the fraction of it a large NCCL
    collective reaches as bus bandwidth (NCCL's busBw convention), ``p2p_efficiency`` the
    fraction one send/recv reaches (defaults to ``efficiency``), ``dispatch_efficiency`` the
    fraction an expert-parallel dispatch or combine of DeepEP's normal kernels reaches on it
    (Megatron-Core's flex dispatcher; defaults to ``efficiency``). ``topology`` says how an
    intra-node link is shared: ``switch`` (NVSwitch: every GPU reaches any peer at full
    bandwidth) or ``mesh`` (direct links: a GPU's bandwidth is split evenly over its peers,
    so a group of k GPUs in a node of n uses (k-1)/(n-1) of it).
    """

    model_config = _FROZEN
    bandwidth_bytes_per_s: Bandwidth = Field(
        validation_alias=AliasChoices("bandwidth_bytes_per_s", "bandwidth")
    )
    latency_s: Seconds = Field(default=5e-6, validation_alias=AliasChoices("latency_s", "latency"))
    efficiency: Fraction = 0.8
    p2p_efficiency: Fraction | None = None
    dispatch_efficiency: Fraction | None = None
    topology: Literal["switch", "mesh"] = "switch"
    source: str | None = None  # where the efficiency was measured (None: a generic guess)
    # measured curves that replace ``efficiency`` (``p2p_efficiency`` and ``latency_s`` for
    # send_recv, keyed by the pair: group size 2) for these collectives inside a node
    collectives: dict[Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"],
                      CollectiveCurve] = Field(
        default_factory=dict
    )

    @property
    def bus_bytes_per_s(self) -> float:
        """What a large collective reaches per GPU, in NCCL's bus-bandwidth convention."""
        return self.bandwidth_bytes_per_s * self.efficiency

    @property
    def p2p_bytes_per_s(self) -> float:
        """What one large send/recv between two GPUs reaches."""
        return self.bandwidth_bytes_per_s * (self.p2p_efficiency or self.efficiency)

    @property
    def dispatch_bytes_per_s(self) -> float:
        """What DeepEP's (or HybridEP's) dispatch and combine kernels reach through it per GPU."""
        return self.bandwidth_bytes_per_s * (self.dispatch_efficiency or self.efficiency)


class HostSpec(BaseModel):
    """A node's host side, for offload (ZeRO-Offload / ZeRO-Infinity, activation offload).

    ``memory_bytes`` is the node's CPU memory; ``cpu_adam_params_per_s`` how many parameters
    the node's CPUs update per second with DeepSpeed's CPU-Adam (all its cores together);
    ``nvme_bandwidth_bytes_per_s`` the node's aggregate NVMe read/write bandwidth. A field
    left out is unknown: a prediction that needs it says so (or refuses, for NVMe)."""

    model_config = _FROZEN
    memory_bytes: Bytes | None = Field(default=None, validation_alias=AliasChoices("memory_bytes", "memory"))
    cpu_adam_params_per_s: Float | None = Field(default=None, gt=0)
    nvme_bandwidth_bytes_per_s: Bandwidth | None = Field(
        default=None, validation_alias=AliasChoices("nvme_bandwidth_bytes_per_s", "nvme_bandwidth")
    )


# block-scaled operand formats a GPU's tensor cores may read in hardware (GpuSpec.block_scaled_formats)
BlockScaledFormat = Literal["mxfp8", "mxfp6", "mxfp4", "nvfp4"]


class GpuSpec(BaseModel):
    """One accelerator: peak dense FLOP/s per precision, HBM size and bandwidth."""

    model_config = _FROZEN
    name: str
    aliases: tuple[str, ...] = ()
    vendor: str = "unknown"
    peak_flops: dict[Precision, FlopRate]
    hbm_bytes: Bytes
    hbm_bandwidth_bytes_per_s: Bandwidth = Field(
        validation_alias=AliasChoices("hbm_bandwidth_bytes_per_s", "hbm_bandwidth")
    )
    intra_node: LinkSpec | None = None
    # the GPU's own link to its host CPU (PCIe, or NVLink-C2C on Grace Hopper), per direction
    host_link: LinkSpec | None = None
    efficiency: EfficiencySpec = EfficiencySpec()
    reference_node: str | None = None  # catalog cluster whose links a job naming only the GPU gets
    # the board's default power limit (datasheet TDP): a cluster's ``power_cap_w`` below it slows GEMMs
    tdp_w: Watts | None = None
    # the block-scaled formats the GPU's tensor (matrix) cores read with their per-block scales
    # in hardware (OCP MX: MXFP8 / MXFP6 / MXFP4, one E8M0 scale per 32 elements; NVIDIA's
    # NVFP4, one E4M3 scale per 16): ``parallel.fp8_recipe: mxfp8`` needs mxfp8 here, nvfp4
    # needs nvfp4 (and an fp4 peak). Empty: none (per-tensor and rowwise FP8 only)
    block_scaled_formats: tuple[BlockScaledFormat, ...] = ()
    # the GPU's architecture as its maker names it (Ampere, Hopper, Blackwell, CDNA 3, ...):
    # dev runs on one architecture say nothing certain about another's errors (an interval's
    # regime, ``uncertainty.regimes``); None: unknown, the GPU's name stands for it
    architecture: str | None = None
    # streaming multiprocessors: what a kernel launched on fewer of them (Transformer Engine
    # userbuffers' GEMMs beside their communication kernels, ``prediction.userbuffers``) loses;
    # None: not in the catalog
    sms: int | None = Field(default=None, ge=1)
    sources: dict[str, str] = Field(default_factory=dict)

    @field_validator("peak_flops", mode="before")
    @classmethod
    def _drop_missing(cls, value: object) -> object:
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if v is not None and k in Precision._value2member_map_}
        return value

    def flops_for(self, precision: Precision) -> float:
        """Peak dense FLOP/s in ``precision``; an error naming the GPU when it has none."""
        try:
            return self.peak_flops[precision]
        except KeyError:
            have = ", ".join(p.value for p in self.peak_flops)
            raise ValueError(
                f"GPU {self.name} has no {precision.value} peak (it has: {have})"
            ) from None


class ClusterSpec(BaseModel):
    """Nodes of identical GPUs joined by one network."""

    model_config = _FROZEN
    name: str = "custom"
    aliases: tuple[str, ...] = ()
    gpu: GpuSpec
    num_nodes: Int = Field(default=1, ge=1)
    gpus_per_node: Int = Field(ge=1)
    # GPUs joined by the intra-node link (the scale-up domain): the node's by default; an NVLink
    # switch system joins several host nodes into one (GB200 NVL72: 18 trays of 4 GPUs = 72)
    scale_up_domain: Int | None = Field(default=None, ge=1)
    intra_node: LinkSpec | None = None
    inter_node: LinkSpec | None = None
    price_per_gpu_hour: Usd | None = None
    sources: dict[str, str] = Field(default_factory=dict)
    # offload: each GPU's link to the host (default: the GPU's own) and the node's host side
    host_link: LinkSpec | None = None
    host: HostSpec = HostSpec()
    # the power limit the nodes run their GPUs at (None: the GPU's TDP); some fleets cap H100s at 500 W
    power_cap_w: Watts | None = None

    @model_validator(mode="after")
    def _intra_link(self) -> ClusterSpec:
        if self.host_link is None and self.gpu.host_link is not None:
            object.__setattr__(self, "host_link", self.gpu.host_link)
        if self.intra_node is None and self.domain_size > 1:
            if self.gpu.intra_node is None:
                raise ValueError(
                    f"intra_node: cluster {short_repr(self.name)} has {self.gpus_per_node} GPUs per node "
                    f"but neither it nor GPU {self.gpu.name} names an intra-node link"
                )
            object.__setattr__(self, "intra_node", self.gpu.intra_node)
        domain = self.scale_up_domain
        if domain is not None and (domain < self.gpus_per_node or domain % self.gpus_per_node):
            raise ValueError(
                f"scale_up_domain: {domain} GPUs is not a whole number of cluster {short_repr(self.name)}'s "
                f"nodes of {self.gpus_per_node} GPUs (a scale-up domain joins whole nodes)"
            )
        if self.inter_node is None and self.num_gpus > self.domain_size:
            raise ValueError(
                f"cluster.inter_node: cluster {short_repr(self.name)} has {self.num_nodes} nodes but no "
                "inter-node link (give bandwidth and latency)"
            )
        return self

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def domain_size(self) -> int:
        """How many of the cluster's GPUs share the intra-node link: one node's, or the
        ``scale_up_domain``'s (all of the cluster's GPUs where it has fewer). Collectives inside a
        domain run on the intra-node link, across domains on the inter-node network; the group
        layouts and the search's tp rule use this, not the node."""
        if self.scale_up_domain is None:
            return self.gpus_per_node
        return min(self.scale_up_domain, self.num_gpus)
