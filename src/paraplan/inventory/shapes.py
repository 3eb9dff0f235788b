"""The tensor dimensions one rank sees for one micro-batch, derived once per job."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from paraplan.inventory.fp8 import te0_meta_kernels
from paraplan.specs import FP8Recipe, Framework, ModelSpec, ParallelPlan, Precision

# Bytes of one activation element. FP8 training keeps activations in 16-bit between GEMMs.
# ``LocalShape.grouped_gemm_streams`` of a grouped GEMM that is one kernel (torch._grouped_mm)
ONE_KERNEL_STREAMS = 1 << 30

_ACTIVATION_BYTES = {Precision.FP32: 4, Precision.TF32: 4, Precision.FP16: 2, Precision.BF16: 2, Precision.FP8: 2}


@dataclass(frozen=True, slots=True)
class LocalShape:
    """Per-rank sizes: ``b`` micro-batch, ``s`` query tokens (seq/cp), ``s_kv`` key tokens,
    ``s_norm`` tokens seen by norms/dropout/residual (s/tp with sequence parallelism),
    ``h`` hidden, ``heads``/``groups`` attention heads and KV groups on this rank, ``d``
    head dim, ``ffn`` MLP width on this rank, ``vocab`` LM-head rows on this rank, ``e``
    activation bytes per element, ``fp8_linears`` whether the layers' linear GEMMs run in FP8
    (FP8 training as Transformer Engine runs it: only the linear layers of the transformer
    layers; attention, the LM head, norms and the optimizer stay in 16/32 bits)."""

    b: int
    s: int
    s_kv: int
    s_norm: int
    h: int
    heads: int
    groups: int
    d: int
    ffn: int
    vocab: int
    tp: int
    e: int
    fp8_linears: bool = False
    # how the FP8 linears scale their tensors (``inventory.fp8``); None: delayed, today's default
    fp8_recipe: FP8Recipe | None = None
    # kernels each Transformer Engine 0.x FP8 module runs per micro-batch in its forward and again
    # in its backward to update its amax history and scales (``inventory.fp8.te0_meta_kernels``);
    # 0: not priced (``parallel.te_fp8_bookkeeping: none``)
    fp8_meta_kernels: int = 0
    # mixture of experts on this rank: ``experts`` local experts of ``moe_ffn`` width each
    # (1/etp of it), ``routed`` token copies they process (the busiest rank's), ``shared_ffn``
    # the shared experts' width (1/tp of it), ``topk`` experts per token, ``num_experts`` all
    experts: int = 0
    moe_ffn: int = 0
    routed: int = 0
    shared_ffn: int = 0
    topk: int = 0
    num_experts: int = 0
    # the per-expert GEMMs a grouped GEMM runs side by side (``inventory.moe``): 0 means the
    # framework's own default (Transformer Engine's 4 streams under Megatron-Core); 1 << 30 one
    # kernel for every local expert (torch._grouped_mm, as torchtitan runs its experts)
    grouped_gemm_streams: int = 0
    # how the attention kernels of context parallelism (s_kv = cp s) are launched
    # (``layer.context_parallel_core``): "ring" one launch per K/V chunk (Transformer Engine's
    # p2p, PyTorch's ring attention in either rotation), "gathered" Transformer Engine's
    # all-gather (two query chunks against the gathered keys, side by side), "heads" the
    # all-to-all (whole sequences of heads / cp)
    cp_kernels: str = "ring"
    # the Megatron-Core token dispatcher ('alltoall', 'deepep', ...; "" for another framework's
    # MoE) and the groups its kernels depend on (``inventory.moe_kernels``): EP, the experts' TP,
    # the router's TP x CP
    dispatcher: str = ""
    ep: int = 1
    etp: int = 1
    tp_cp: int = 1
    # Megatron-Core's partial CUDA graphs (ParallelPlan.cuda_graph_scope; () for none or another
    # framework) and --moe-shared-expert-overlap (the shared experts then run outside the router's
    # graph): what the host launches per MoE layer (``inventory.moe``)
    cuda_graph_scope: tuple[str, ...] = ()
    shared_expert_overlap: bool = False

    @property
    def tokens(self) -> int:
        return self.b * self.s


def local_shape(model: ModelSpec, plan: ParallelPlan, precision: Precision) -> LocalShape:
    return shard_shape(
        model, plan.tp, plan.cp, plan.sequence_parallel, plan.micro_batch_size, precision,
        ep=plan.ep, etp=plan.etp, imbalance=plan.expert_load_imbalance, fp8_recipe=plan.fp8_recipe,
        one_kernel_experts=plan.framework is Framework.FSDP, cp_kernels=cp_kernels_of(plan),
        dispatcher=plan.dispatcher if plan.framework is Framework.MEGATRON else "",
        cuda_graph_scope=tuple(plan.cuda_graph_scope or ()) if plan.framework is Framework.MEGATRON else (),
        shared_expert_overlap=plan.moe_shared_expert_overlap,
        fp8_meta_kernels=te0_meta_kernels(plan) if precision is Precision.FP8 else 0,
    )


def cp_kernels_of(plan: ParallelPlan) -> str:
    """``LocalShape.cp_kernels`` for ``plan``: "ring" unless context parallelism gathers K/V
    in Transformer Engine ("gathered") or all-to-alls the heads ("heads")."""
    if plan.cp > 1 and plan.cp_comm == "a2a":
        return "heads"
    if plan.cp > 1 and plan.cp_comm == "allgather" and plan.framework is not Framework.FSDP:
        return "gathered"
    return "ring"


# A plan search asks for the same few shapes with every Job it counts (each ``count_job`` asks
# twice: the rank's shape and the unsharded one): one object per shape, kept (LocalShape is
# frozen, and the identity caches of ``inventory.recompute`` then hit across Jobs).
@functools.lru_cache(maxsize=1024)
def shard_shape(
    model: ModelSpec, tp: int, cp: int, sequence_parallel: bool, micro_batch: int, precision: Precision,
    *, ep: int = 1, etp: int | None = None, imbalance: float = 1.0, fp8_recipe: FP8Recipe | None = None,
    one_kernel_experts: bool = False, cp_kernels: str = "ring", dispatcher: str = "",
    cuda_graph_scope: tuple[str, ...] = (), shared_expert_overlap: bool = False, fp8_meta_kernels: int = 0,
) -> LocalShape:
    """The shape for explicit degrees (``tp = cp = 1`` gives the unsharded model).

    Experts: the tokens a rank's MoE layer takes in are its own (b x s/cp, /tp under sequence
    parallelism); the ETP x EP ranks of an expert group each send theirs to the experts' owners,
    so a rank's ``experts = E/ep`` experts receive tokens x topk x etp copies on average (the
    etp ranks of an expert all see its tokens), times the load imbalance, capped by the capacity
    factor when tokens over it are dropped."""
    s = model.seq_length // cp
    s_norm = s // tp if sequence_parallel else s
    moe: dict[str, int | str | bool | tuple[str, ...]] = {}
    if model.num_moe_experts is not None:
        etp = etp or tp
        load = imbalance
        if model.moe_expert_capacity_factor is not None:
            load = min(load, model.moe_expert_capacity_factor)
        moe = {
            "experts": model.num_moe_experts // ep,
            "moe_ffn": model.moe_ffn_hidden_size // etp,
            "routed": round(micro_batch * s_norm * model.moe_router_topk * etp * load),
            "shared_ffn": (model.moe_shared_expert_intermediate_size or 0) // tp,
            "topk": model.moe_router_topk,
            "num_experts": model.num_moe_experts,
            # torchtitan (framework fsdp) runs its experts through torch._grouped_mm, one kernel
            # (torchtitan/models/moe/moe.py GroupedExperts); Megatron-Core through Transformer Engine
            "grouped_gemm_streams": ONE_KERNEL_STREAMS if one_kernel_experts else 0,
            "dispatcher": dispatcher, "ep": ep, "etp": etp, "tp_cp": tp * cp,
            "cuda_graph_scope": cuda_graph_scope, "shared_expert_overlap": shared_expert_overlap,
        }
    return LocalShape(
        b=micro_batch,
        s=s,
        s_kv=model.seq_length,
        s_norm=s_norm,
        h=model.hidden_size,
        heads=model.num_attention_heads // tp,
        groups=max(1, model.num_query_groups // tp),
        d=model.kv_channels,
        ffn=model.ffn_hidden_size // tp,
        vocab=model.vocab_for(tp) // tp,
        tp=tp,
        e=_ACTIVATION_BYTES[precision],
        fp8_linears=precision is Precision.FP8,
        # the default recipe stays None so that its shapes (and cached inventories) are today's
        fp8_recipe=fp8_recipe if precision is Precision.FP8 and fp8_recipe is not FP8Recipe.DELAYED else None,
        cp_kernels=cp_kernels,
        fp8_meta_kernels=fp8_meta_kernels if precision is Precision.FP8 else 0,
        **moe,
    )
