"""Enumerations shared by every layer (phases, precisions, schedules...)."""

from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    """When an operator runs within one training iteration."""

    FWD = "fwd"
    BWD_INPUT = "bwd_input"
    BWD_WEIGHT = "bwd_weight"
    RECOMPUTE = "recompute"
    OPTIMIZER = "optimizer"


class Precision(str, Enum):
    """A job's training precision, and the precision a kernel's math runs in."""

    FP32 = "fp32"
    # fp32 training whose matmuls run on TF32 tensor cores (NVIDIA Ampere and later with
    # torch.backends.cuda.matmul.allow_tf32): parameters, gradients and activations stay fp32
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    # the precision NVFP4 GEMMs run in (``parallel.fp8_recipe: nvfp4``): a GPU's ``peak_flops.fp4``
    # and FP4 curve; a job is never trained "in fp4" on its own: ``precision: fp4`` (or
    # ``nvfp4``) is read as ``precision: fp8`` with ``fp8_recipe: nvfp4`` (``specs.job``)
    FP4 = "fp4"

    @property
    def full_width(self) -> bool:
        """Whether parameters, gradients and activations are kept in fp32 (no 16-bit copy,
        no master weights): fp32 and tf32 training."""
        return self in (Precision.FP32, Precision.TF32)


class FP8Recipe(str, Enum):
    """How an FP8 job scales its tensors to FP8 (``parallel.fp8_recipe``); the recipes differ in
    the casts, amax reductions and scale copies they run around each FP8 GEMM
    (``inventory.fp8`` counts them). Megatron-LM's ``--fp8-recipe`` and torchtitan's
    ``float8.recipe_name`` name them; ``tensorwise`` is read as ``current``."""

    # Transformer Engine's DelayedScaling: the scale comes from an amax history of past
    # iterations, so each cast computes its tensor's amax on the way (no extra pass)
    DELAYED = "delayed"
    # per-tensor current scaling (TE Float8CurrentScaling, Megatron --fp8-recipe tensorwise,
    # torchao's "tensorwise"): the tensor's own amax, reduced before it is cast
    CURRENT = "current"
    # torchao's "rowwise": one scale per row (per column for the weight-gradient operands)
    ROWWISE = "rowwise"
    # OCP MX block scaling (TE MXFP8BlockScaling): one E8M0 scale per 32 elements, on
    # tensor cores that read block scales (Blackwell)
    MXFP8 = "mxfp8"
    # NVIDIA's NVFP4 (TE NVFP4BlockScaling): FP4 E2M1 with an E4M3 scale per 16 elements
    NVFP4 = "nvfp4"

    @classmethod
    def _missing_(cls, value: object) -> FP8Recipe | None:
        if isinstance(value, str):
            key = value.strip().lower()
            if key == "tensorwise":
                return cls.CURRENT
            if key in cls._value2member_map_:
                return cls(key)
        return None


class Recompute(str, Enum):
    """Activation recompute policies (``inventory.recompute`` says what each re-runs)."""

    NONE = "none"
    SELECTIVE = "selective"  # Megatron-LM: the attention core
    FULL = "full"  # Megatron-LM: whole layers (recompute_method, recompute_num_layers)
    LAYER = "layer"  # torchtitan / fms-fsdp: every recompute_every-th layer whole
    OP = "op"  # torchtitan's per-op policy: keep matmul (every second) and attention outputs


class AttentionKernel(str, Enum):
    """The fused attention kernel a framework runs (``parallel.attention_kernel``): each has its
    own efficiency curve per GPU where operator-level data exists (``efficiency.attention_kernels``
    in the GPU's catalog file); unset, the GPU's one ``attention`` curve is used."""

    FA1 = "fa1"  # FlashAttention (Dao et al. 2022), the flash-attn 1.x package
    FA2 = "fa2"  # FlashAttention-2 (Dao 2023)
    FA3 = "fa3"  # FlashAttention-3 (Shah et al. 2024; Hopper)
    CUDNN = "cudnn"  # cuDNN fused attention (Transformer Engine's FusedAttention)
    TRITON = "triton"  # Triton's fused attention tutorial kernel
    SDPA = "sdpa"  # PyTorch scaled_dot_product_attention, its flash backend

    @property
    def curve_key(self) -> AttentionKernel:
        """The kernel whose measured curve times this one: PyTorch's SDPA flash backend is
        FlashAttention-2 (PyTorch 2.2 release notes: "scaled_dot_product_attention (SDPA) now
        supports FlashAttention-2, yielding around 2x speedups compared to previous versions")."""
        return AttentionKernel.FA2 if self is AttentionKernel.SDPA else self


class MemoryKernel(str, Enum):
    """How PyTorch runs a memory-bound (streaming) kernel, read off its name in a profiler trace
    (``calibrate.memory_kernels.kernel_class``): each kind streams at its own share of HBM
    bandwidth where measured (``efficiency.memory_kernels`` in the GPU's catalog file); a kind
    without a curve there is timed on the GPU's generic ``memory`` curve."""

    VECTORIZED = "vectorized"  # vectorized_elementwise_kernel: contiguous operands of one type
    UNROLLED = "unrolled"  # unrolled_elementwise_kernel: contiguous, no vector loads (mixed types)
    STRIDED = "strided"  # elementwise_kernel: a non-contiguous operand (transposed, sliced, broadcast)
    REDUCE = "reduce"  # reduce_kernel: a sum or mean over a dimension (no curve of its own yet)


class Schedule(str, Enum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    # Zero-bubble schedules (Qi et al. 2023, arXiv 2401.10241): the backward split into an
    # input-gradient pass B and a weight-gradient pass W that fills the bubbles
    ZB_H1 = "zb-h1"  # 1F1B's memory, W passes delayed (Section 2.1)
    ZB_V = "zb-v"  # two chunks per stage in a V (Section 6; torchtitan's ZBVZeroBubble)

    # What the rest of the package asks of a schedule is these properties, never its name:
    # a new schedule is a member here, its order and closed forms in ``paraplan.schedule`` and
    # its flags in ``paraplan.export`` (docs/extending.md).

    @property
    def splits_backward(self) -> bool:
        """Whether the schedule runs B and W as separate tasks."""
        return self in (Schedule.ZB_H1, Schedule.ZB_V)

    @property
    def uses_vpp(self) -> bool:
        """Whether the plan's virtual pipeline size (vpp) sets the chunks per stage
        (Megatron-LM's interleaving); other schedules own their chunk count."""
        return self is Schedule.INTERLEAVED

    @property
    def forwards_all_first(self) -> bool:
        """Whether every micro-batch's forward runs before any backward (GPipe), so that a
        stage holds every micro-batch's saved tensors at once."""
        return self is Schedule.GPIPE

    def chunks(self, vpp: int) -> int:
        """Model chunks per pipeline stage under this schedule."""
        return vpp if self.uses_vpp else 2 if self is Schedule.ZB_V else 1

    @classmethod
    def for_vpp(cls, vpp: int) -> Schedule:
        """Megatron-LM's schedule for a virtual pipeline size: interleaved when vpp > 1."""
        return cls.INTERLEAVED if vpp > 1 else cls.ONE_F_ONE_B

    def virtual_stage(self, p: int, stage: int, chunk: int) -> int:
        """The position of ``chunk`` of ``stage`` in the model (0 .. p x chunks - 1): Megatron-
        LM's interleaving puts chunk c of stage i at c p + i, ZB-V at i and 2p - 1 - i (a V)."""
        if self is Schedule.ZB_V:
            return stage if chunk == 0 else 2 * p - 1 - stage
        return chunk * p + stage


class Framework(str, Enum):
    """The training framework whose behaviour (grad sync, buffers) the prediction follows."""

    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"
    FSDP = "fsdp"  # PyTorch FSDP / FSDP2: torchtitan, IBM fms-fsdp, MosaicML llm-foundry
