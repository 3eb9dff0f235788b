"""What the inventory is made of: operators and collectives, with their counted work."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from paraplan.specs.enums import MemoryKernel, Phase


class OpKind(str, Enum):
    """The kind of kernel an operator runs; the cost model picks its efficiency curve by it."""

    GEMM = "gemm"
    BMM = "bmm"
    ATTENTION = "attention"  # fused (flash) attention
    SOFTMAX = "softmax"
    NORM = "norm"
    ELEMENTWISE = "elementwise"
    EMBEDDING = "embedding"
    LOSS = "loss"
    OPTIMIZER = "optimizer"
    # kinds with no measured curve (``inventory.scan_kinds``: their work from the cited
    # formulas; ``costmodel.scan_rooflines``: their roofline, marked uncalibrated)
    SSM_SCAN = "ssm_scan"  # Mamba-2's SSD chunked scan (tensor-core matmuls)
    SELECTIVE_SCAN = "selective_scan"  # Mamba-1's selective scan (a recurrence on CUDA cores)
    CAUSAL_CONV1D = "causal_conv1d"  # the depthwise causal convolution before a scan
    LINEAR_ATTENTION = "linear_attention"  # chunked linear attention (gated DeltaNet)


@dataclass(frozen=True, slots=True)
class KernelMix:
    """The kinds of streaming kernel (``MemoryKernel``) a memory-bound operator's code runs, each
    with the bytes it moves per element of the operator (any common scale: the shares count), in
    the forward pass and in the backward pass (``bwd`` empty: the forward's). The cost model
    times each share on its kind's curve (``costmodel.roofline.op_curves``). ``name`` is unique
    (``inventory.kernel_mixes`` holds them all); ``source`` says where the kinds were read."""

    name: str
    fwd: tuple[tuple[MemoryKernel, float], ...]
    bwd: tuple[tuple[MemoryKernel, float], ...] = ()
    source: str = ""

    def parts(self, forward: bool) -> tuple[tuple[MemoryKernel, float], ...]:
        """(kind, share of the bytes) of one direction, the shares summing to 1."""
        mix = self.fwd if forward or not self.bwd else self.bwd
        total = sum(w for _, w in mix)
        return tuple((kind, w / total) for kind, w in mix)


@dataclass(frozen=True, slots=True)
class Op:
    """One operator of one micro-batch on one rank.

    ``name`` matches the operator tags of the GPUModeling operator samples (linear1..4,
    linear_final, baddbmm, bmm, softmax, flash_atten, layernorm, RMSlayernorm, RoPE, gelu,
    res_add, embedding, cross_entropy, optimizer) so that sampled timings map onto it.
    FLOPs are counted by the usual convention (2 per multiply-add, full attention square);
    ``exec_fraction`` is the share of them the kernel really executes (0.5 for causal flash
    attention, which skips masked tiles). Bytes are HBM traffic of the ideal kernel.
    """

    name: str
    kind: OpKind
    role: str
    flops: float
    bytes: float
    bwd_flops: float
    bwd_bytes: float
    bwd_weight_flops: float = 0.0
    bwd_weight_bytes: float = 0.0
    params: float = 0.0
    saved_bytes: float = 0.0
    selective_recompute: bool = False
    selective_kept_bytes: float = 0.0  # of saved_bytes, what stays saved under selective recompute
    exec_fraction: float = 1.0
    dims: tuple[tuple[str, int], ...] = field(default=())
    fp8: bool = False  # runs on the FP8 tensor cores (Transformer Engine's FP8 linear layers)
    # an FP8 GEMM whose operands are NVFP4 (``fp8_recipe: nvfp4``): runs on the FP4 tensor cores
    fp4: bool = False
    # False for work a layer carries that recomputing the layer does not redo (gradient
    # accumulation, once-per-iteration FP8 weight casts, FSDP's buffer copies)
    recomputable: bool = True
    # the experts' weights of a mixture-of-experts layer: split over expert parallelism and
    # reduced (and sharded by the distributed optimizer) over the expert data-parallel group
    expert: bool = False
    # kernels of equal size the work is issued as (the local experts' GEMMs one by one,
    # without a grouped GEMM): each pays its own ramp-up and launch
    launches: int = 1
    # the GEMMs of a multi-stream grouped GEMM (Transformer Engine's, ``launches`` waves of
    # them side by side): the cost model ramps up as many lone GEMMs as the GPU's measured
    # concurrency leaves (``EfficiencySpec.grouped_gemm``); 0: not one
    multi_stream_gemms: int = 0
    # the kernels the host launches for the forward, where more than ``launches`` (a MoE
    # operator's small kernels, copies to the host and communication kernels as the framework's
    # code launches them: ``inventory.moe_kernels``); None: ``launches``
    host_launches: int | None = None
    # the kinds of streaming kernel a memory-bound operator runs (``inventory.kernel_mixes``);
    # None: the GPU's generic memory curve
    memory_kernels: KernelMix | None = None

    @property
    def forward_host_launches(self) -> int:
        """Kernels the host launches for this operator's forward (``prediction.host_sync``)."""
        return self.launches if self.host_launches is None else self.host_launches

    @property
    def kept_under_selective(self) -> float:
        """Saved bytes under selective recompute: a recomputed operator keeps only its inputs
        from outside the recomputed region (Q, K and V for the attention core)."""
        return self.selective_kept_bytes if self.selective_recompute else self.saved_bytes

    def work(self, phase: Phase) -> tuple[float, float]:
        """(FLOPs, bytes) executed in ``phase``. The backward pass is split into the
        input-gradient kernels (``BWD_INPUT``) and the weight-gradient kernels (``BWD_WEIGHT``);
        together they are ``bwd_flops`` and ``bwd_bytes``."""
        if phase is Phase.BWD_INPUT:
            return (
                (self.bwd_flops - self.bwd_weight_flops) * self.exec_fraction,
                self.bwd_bytes - self.bwd_weight_bytes,
            )
        if phase is Phase.BWD_WEIGHT:
            return self.bwd_weight_flops, self.bwd_weight_bytes
        return self.flops * self.exec_fraction, self.bytes


class CollectiveKind(str, Enum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    SEND_RECV = "send_recv"
    ALL_TO_ALL = "all_to_all"  # expert-parallel token dispatch and combine
    # not emitted by the inventory (parameter broadcasts); the collective sampler measures it
    BROADCAST = "broadcast"

    @property
    def display(self) -> str:
        """The kind as notes and tables write it ('all-reduce', 'send/recv')."""
        return _KIND_DISPLAY[self]


_KIND_DISPLAY = {
    CollectiveKind.ALL_REDUCE: "all-reduce",
    CollectiveKind.ALL_GATHER: "all-gather",
    CollectiveKind.REDUCE_SCATTER: "reduce-scatter",
    CollectiveKind.SEND_RECV: "send/recv",
    CollectiveKind.ALL_TO_ALL: "all-to-all",
    CollectiveKind.BROADCAST: "broadcast",
}


class ParallelDim(str, Enum):
    TP = "tp"
    CP = "cp"
    DP = "dp"  # the gradient group; with hybrid sharding, the group ZeRO shards over
    PP = "pp"
    DP_REPLICATE = "dp_replicate"  # hybrid sharding: the replicas of one shard (HSDP)
    EP = "ep"  # expert parallelism: the all-to-all of token dispatch and combine
    ETP = "etp"  # expert tensor parallelism: one expert's MLP split over ranks
    EDP = "edp"  # expert data parallelism: the ranks holding the same experts
    # a stage's tp x cp x dp ranks (Megatron-Core's get_amax_reduction_group(with_context_parallel=
    # True), apex's _AMAX_REDUCTION_GROUP): the FP8 amax reduction's group (``inventory.fp8``)
    TP_DP = "tp_dp"


@dataclass(frozen=True, slots=True)
class ExpertRouting:
    """How a MoE dispatch spreads each token's copies, for a dispatcher that sends a token once
    per destination node and rank (DeepEP's normal kernels, HybridEP): ``experts`` routed experts
    laid out contiguously over the EP ranks, ``topk`` per token, optionally group-limited
    (``groups`` equal groups, ``group_topk`` of them chosen per token). ``backend`` names the
    dispatcher ('deepep' | 'hybridep')."""

    experts: int
    topk: int
    groups: int | None = None
    group_topk: int | None = None
    backend: str = "deepep"

    @property
    def display(self) -> str:
        """The dispatcher's own name ('DeepEP', 'HybridEP'): what priced its calls in ``--explain``."""
        return DISPATCH_BACKENDS[self.backend]


# the flex dispatcher's backends (``ParallelPlan.moe_flex_dispatcher_backend``) by their names
DISPATCH_BACKENDS = {"deepep": "DeepEP", "hybridep": "HybridEP"}


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective call. ``bytes`` follows nccl-tests' size convention: the buffer for an
    all-reduce or a broadcast, the whole output of an all-gather (input of a reduce-scatter),
    one rank's whole send buffer of an all-to-all, the message of a send/recv. ``count`` is how many such calls one layer (or one stage) makes in ``phase``."""

    name: str
    kind: CollectiveKind
    dim: ParallelDim
    bytes: float
    phase: Phase
    count: int = 1
    # an EP all-to-all a flex dispatcher runs: ``bytes`` is still the top-k copies' buffer (the
    # alltoall dispatcher's), the cost model sends each token once per node and rank from it
    routing: ExpertRouting | None = None
