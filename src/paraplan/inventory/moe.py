"""The operators and collectives of a mixture-of-experts layer (one micro-batch, one rank).

A MoE layer is the dense layer's attention block followed, in place of the MLP, by what
Megatron-Core's ``MoELayer`` runs (``megatron/core/transformer/moe``): the router (a linear
layer to one score per expert, softmax or sigmoid, top-k), the auxiliary load-balancing loss,
the permutation of each token's top-k copies by expert, the all-to-all that dispatches them
to the experts' expert-parallel ranks (and the all-gather over the expert's tensor-parallel
ranks), the local experts' MLPs as one grouped GEMM (or one GEMM per expert), then the same
way back: the reduce-scatter, the all-to-all that combines, the unpermutation weighted by the
router's probabilities. Shared experts (DeepSeek, Qwen2-MoE, Llama 4) are a dense MLP every
token passes through, split by tensor parallelism.

Volumes follow ``LocalShape``: ``routed`` token copies reach a rank's experts (the busiest
rank's, with the load imbalance), each rank dispatches ``tokens x topk`` copies of its own.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from paraplan.inventory.kernel_mixes import VECTORIZED
from paraplan.inventory.layer import (
    _copy,
    attention_block_ops,
    count_layer_collectives,
    elementwise,
    gemm,
    input_gradient_sum,
    norm,
    separate_gemms,
    with_fp8_casts,
)
from paraplan.inventory.moe_kernels import (
    AttentionKernelConfig,
    Kernels,
    MoeKernelConfig,
    attention_kernels,
    dispatch_preprocess,
    fp8_input_casts,
    moe_kernels,
)
from paraplan.inventory.ops import (
    DISPATCH_BACKENDS,
    Collective,
    CollectiveKind,
    ExpertRouting,
    Op,
    OpKind,
    ParallelDim,
)
from paraplan.inventory.shapes import LocalShape
from paraplan.specs import FP8Recipe, ModelSpec, ParallelPlan, Phase

# Transformer Engine's grouped GEMM (GroupedLinear, Megatron-Core's TEGroupedMLP behind
# --moe-grouped-gemm): one cuBLAS GEMM per local expert, the i-th on compute stream i % 4
# (transformer_engine/common/gemm/cublaslt_gemm.cu multi_stream_cublas_gemm,
# `detail::get_compute_stream(i % num_streams)`; include/transformer_engine/gemm.h
# `constexpr int num_streams = 4`). ModelSpec.moe_grouped_gemm_streams overrides it.
TE_GROUPED_GEMM_STREAMS = 4


def _expert_gemm(name: str, role: str, x: LocalShape, k: int, n: int, *, grouped: bool,
                 streams: int = TE_GROUPED_GEMM_STREAMS) -> Op:
    """The local experts' GEMM of ``routed`` rows in all: each expert's weight [k, n] is read
    once, the rows of all experts together make the FLOPs. A grouped GEMM runs the experts'
    GEMMs ``streams`` at a time side by side (Transformer Engine's multi-stream cuBLAS: 4), each
    such wave filling the GPU as one GEMM of their summed rows: ceil(experts / streams) kernels
    ramp up (a single-kernel grouped GEMM, CUTLASS's, is ``streams`` >= the local experts);
    without it each expert's GEMM is a kernel of its own, one after another."""
    e, m, experts = x.e, x.routed, x.experts
    one = gemm(name, role, m, k, n, e, bias=False, saved=e * m * k, fp8=x.fp8_linears)
    operand = 1 if x.fp8_linears else e
    weights = experts * k * n
    return dataclasses.replace(
        one,
        bytes=operand * (m * k + weights) + e * m * n,
        bwd_bytes=operand * (m * n + weights) + e * m * k + operand * (m * k + m * n) + e * weights,
        bwd_weight_bytes=operand * (m * k + m * n) + e * weights,
        params=weights,
        expert=True,
        launches=-(-max(1, experts) // max(1, streams)) if grouped else max(1, experts),
        # Transformer Engine's 4 streams, as measured (``EfficiencySpec.grouped_gemm``); another
        # count stated (``ModelSpec.moe_grouped_gemm_streams``; torch._grouped_mm's one kernel) keeps its waves
        multi_stream_gemms=experts if grouped and experts > 1 and streams == TE_GROUPED_GEMM_STREAMS else 0,
        dims=(*one.dims, ("experts", experts)),
    )


def megatron_kernels(model: ModelSpec, x: LocalShape) -> dict[str, Kernels] | None:
    """The kernels per MoE operator Megatron-Core's code launches for this model and rank
    (``inventory.moe_kernels``); None for another framework's MoE or the allgather dispatcher
    (not counted: one kernel per operator, as before)."""
    config = megatron_kernel_config(model, x)
    return None if config is None else moe_kernels(config)


def megatron_kernel_config(model: ModelSpec, x: LocalShape) -> MoeKernelConfig | None:
    """What Megatron-Core's MoE kernel counts depend on, for this model and rank; None where
    ``megatron_kernels`` counts nothing."""
    if x.dispatcher != "alltoall" and x.dispatcher not in DISPATCH_BACKENDS:
        return None
    return MoeKernelConfig(
        router_fusion=bool(model.moe_router_fusion), permute_fusion=bool(model.moe_permute_fusion),
        score_function=model.moe_router_score_function or "softmax",
        group_limited=bool(model.moe_router_group_topk), aux_loss=bool(model.moe_aux_loss_coeff),
        dispatcher=x.dispatcher, ep=x.ep, etp=x.etp, tp_cp=x.tp_cp, local_experts=max(1, x.experts),
        grouped_gemm=bool(model.moe_grouped_gemm))


def _launching(op: Op, kernels: dict[str, Kernels] | None, key: str | None = None) -> Op:
    """``op`` with the forward kernels its code launches (``kernels``, by operator name); an
    operator Megatron-Core's MoE layer does not run (autograd's sum of split gate and up input
    gradients) keeps its own launch."""
    counted = kernels.get(key or op.name) if kernels is not None else None
    return op if counted is None else dataclasses.replace(op, host_launches=counted.fwd)


def _router(model: ModelSpec, x: LocalShape) -> list[Op]:
    """The router on the rank's own tokens (sequence-parallel layout): scores, top-k and the
    auxiliary loss's statistics over [tokens, experts]. The router keeps the pre-MLP norm's
    output for its weight gradient (the shared experts gather it again from there)."""
    tokens, experts, e = x.b * x.s_norm, x.num_experts, x.e
    scores = tokens * experts
    dims = (("tokens", tokens), ("experts", experts))
    ops = [
        gemm("router", "MoE router scores", tokens, x.h, experts, e, bias=False, saved=e * tokens * x.h),
        elementwise("router_topk", OpKind.SOFTMAX, f"router {model.moe_router_score_function} and top-k",
                    scores, e, flops_per_element=6.0, saved=e * scores, dims=dims),
    ]
    if model.moe_aux_loss_coeff:
        ops.append(elementwise("moe_aux_loss", OpKind.ELEMENTWISE, "auxiliary load-balancing loss",
                               scores, e, flops_per_element=2.0, dims=dims))
    kernels = megatron_kernels(model, x)
    return [_launching(op, kernels) for op in ops]


_SHARED = "shared experts"  # the roles of the shared experts' operators begin with it


def is_shared_expert(op: Op) -> bool:
    """Whether ``op`` belongs to a MoE layer's shared experts (which Megatron-Core's
    --moe-shared-expert-overlap runs beside the all-to-alls)."""
    return op.role.startswith(_SHARED)


def _shared_experts(model: ModelSpec, x: LocalShape) -> list[Op]:
    if not x.shared_ffn:
        return []
    e, tokens, fp8 = x.e, x.tokens, x.fp8_linears
    swiglu = model.activation == "swiglu"
    up = x.shared_ffn * (2 if swiglu else 1)
    if swiglu and not model.gate_up_fusion:  # torchtitan's shared FeedForward: w1 and w3 apart
        ups = separate_gemms("shared_fc1", ((f"{_SHARED} gate projection", x.shared_ffn),
                                            (f"{_SHARED} up projection", x.shared_ffn)),
                             f"{_SHARED} input gradients summed", tokens, x.h, e, bias=False, saved=0.0, fp8=fp8)
    else:
        ups = [gemm("shared_fc1", f"{_SHARED} up projection", tokens, x.h, up, e, bias=False, saved=0.0, fp8=fp8)]
    return [
        *ups,
        elementwise("swiglu" if swiglu else "gelu", OpKind.ELEMENTWISE, f"{_SHARED} activation",
                    tokens * x.shared_ffn, e, reads=2.0 if swiglu else 1.0, flops_per_element=8.0,
                    saved=e * tokens * up, dims=(("l", x.s), ("b", x.b), ("ffn", x.shared_ffn))),
        gemm("shared_fc2", f"{_SHARED} down projection", tokens, x.shared_ffn, x.h, e, bias=False,
             saved=e * tokens * x.shared_ffn, fp8=fp8),
    ]


def routed_expert_ops(x: LocalShape, ffn: int, *, gated: bool, activation: str, grouped: bool,
                      streams: int = TE_GROUPED_GEMM_STREAMS, kernels: dict[str, Kernels] | None = None,
                      fused_up: bool = True) -> list[Op]:
    """What one rank runs for its local routed experts (``x.experts`` of width ``ffn`` on this
    rank, ``x.routed`` token copies): the permutation of the copies by expert, the up projection
    (gate and up, ``gated``), the ``activation`` kernel, the down projection, and the
    unpermutation weighted by the router's probabilities. The hand-written MoE layer and a traced
    one (``inventory.traced_moe``, its widths from the model's own experts) both build them here.
    ``fused_up`` false (``model.gate_up_fusion``; torchtitan's GroupedExperts runs ``w1`` and
    ``w3`` as two grouped GEMMs): the gated up projection as a gate GEMM and an up GEMM of ``ffn``
    each, the second keeping no input of its own, and autograd's sum of their input gradients.
    ``kernels``: what each launches in Megatron-Core (``megatron_kernels``)."""
    e = x.e
    routed_h = float(x.b * x.s_norm * x.topk) * x.h  # this rank's copies, before dispatch and after combine
    up = ffn * (2 if gated else 1)
    how = "(grouped GEMM)" if grouped else "(one GEMM per expert)"
    if gated and not fused_up:
        ups = [_expert_gemm("expert_fc1", f"experts' gate projection {how}", x, x.h, ffn, grouped=grouped,
                            streams=streams),
               dataclasses.replace(_expert_gemm("expert_fc1", f"experts' up projection {how}", x, x.h, ffn,
                                                grouped=grouped, streams=streams), saved_bytes=0.0),
               input_gradient_sum("experts' input gradients summed", float(x.routed) * x.h, e, adds=1)]
    else:
        ups = [_expert_gemm("expert_fc1", f"experts' up projection {how}", x, x.h, up, grouped=grouped,
                            streams=streams)]
    ops = [
        _copy("moe_permute", "permute token copies by expert (gradient: unpermute)", routed_h, e,
              fwd_passes=1.0, bwd_passes=1.0),
        *ups,
        elementwise(activation, OpKind.ELEMENTWISE, "experts' activation", x.routed * ffn, e,
                    reads=2.0 if gated else 1.0, flops_per_element=8.0, saved=e * x.routed * up,
                    dims=(("tokens", x.routed), ("ffn", ffn))),
        _expert_gemm("expert_fc2", "experts' down projection", x, ffn, x.h, grouped=grouped, streams=streams),
        # the unpermutation scales each copy by its router probability and sums a token's copies;
        # the probabilities' gradient needs the experts' outputs, which it keeps
        dataclasses.replace(
            _copy("moe_unpermute", "unpermute and weight by router probabilities", routed_h, e,
                  fwd_passes=1.0, bwd_passes=2.0),
            saved_bytes=e * routed_h,
        ),
    ]
    # the gate and up GEMMs apart (stated against Megatron-Core's fused fc1): each as fc1's launches
    return [_launching(op, kernels, "activation" if op.name == activation else None) for op in ops]


def moe_block_ops(model: ModelSpec, x: LocalShape) -> tuple[Op, ...]:
    """The pre-MLP norm, router, dispatch, experts, combine and residual add, in order."""
    swiglu = model.activation == "swiglu"
    hidden_norm = x.b * x.s_norm * x.h
    ops: list[Op] = [norm(model, x, "pre-MLP norm"), *_router(model, x)]
    ops += routed_expert_ops(x, x.moe_ffn, gated=swiglu, activation="swiglu" if swiglu else "gelu",
                             grouped=bool(model.moe_grouped_gemm),
                             streams=model.moe_grouped_gemm_streams or x.grouped_gemm_streams or TE_GROUPED_GEMM_STREAMS,
                             kernels=megatron_kernels(model, x), fused_up=model.gate_up_fusion)
    ops += _shared_experts(model, x)
    ops.append(elementwise("res_add", OpKind.ELEMENTWISE, "residual add", hidden_norm, x.e, reads=2.0,
                           kernels=VECTORIZED))
    return tuple(ops)


@functools.lru_cache(maxsize=256)
def count_moe_layer_ops(model: ModelSpec, x: LocalShape) -> tuple[Op, ...]:
    """Every operator of one mixture-of-experts layer, in execution order; under Megatron-Core
    with the kernels the host launches for each (``megatron_attention``, ``graphed``)."""
    attention = attention_block_ops(model, x)
    moe = moe_block_ops(model, x)
    config = megatron_kernel_config(model, x)
    if config is None:
        return with_fp8_casts(attention + moe, x)
    attention = megatron_attention(model, x, attention)
    if x.fp8_linears:
        attention, moe = fp8_launching(x, config, attention), fp8_launching(x, config, moe)
    attention, moe = graphed(x, config, attention, moe)
    ops = with_fp8_casts(attention + moe, x)
    if not x.fp8_linears:
        return ops
    # the casts' kernels are launched with their GEMMs (``fp8_launching``)
    return (*ops[:-1], dataclasses.replace(ops[-1], host_launches=0))


def fp8_launching(x: LocalShape, config: MoeKernelConfig, ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """``ops`` with each FP8 GEMM launching the quantization of its input as well
    (``moe_kernels.fp8_input_casts``)."""
    delayed = x.fp8_recipe is None or x.fp8_recipe is FP8Recipe.DELAYED
    return tuple(dataclasses.replace(op, host_launches=op.forward_host_launches
                                     + fp8_input_casts(op.name, config.local_experts, delayed))
                 if op.fp8 else op for op in ops)


def megatron_attention(model: ModelSpec, x: LocalShape, ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """The attention block's operators with the forward kernels Megatron-Core launches for each
    (``moe_kernels.attention_kernels``: the norms, the GEMMs with their tensor- and
    sequence-parallel collectives, q/k norms, RoPE, TE's fused attention, bias-dropout-add)."""
    counts = attention_kernels(AttentionKernelConfig(
        tp=x.tp, sp=x.tp > 1 and x.s_norm != x.s, qk_layernorm=bool(model.qk_layernorm),
        rotary=model.position_embedding == "rotary", rope_fusion=bool(model.rope_fusion),
        bias_dropout_fusion=bool(model.bias_dropout_fusion)))
    seen: set[str] = set()
    out = []
    for op in ops:
        # the first of a name: context parallelism's ring steps follow the own chunk's attention
        # under the same name and keep their own launches
        first = op.name in counts and op.name not in seen
        out.append(dataclasses.replace(op, host_launches=counts[op.name]) if first else op)
        seen.add(op.name)
    return tuple(out)


def graphed(x: LocalShape, config: MoeKernelConfig, attention: tuple[Op, ...],
            moe: tuple[Op, ...]) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """The layer's operators with what Megatron-Core's partial CUDA graphs (``x.cuda_graph_scope``)
    leave the host to launch: a graph replays all it captured with one launch. ``attn``: the
    attention block (input norm to the bias-dropout-add); ``moe_router``: the pre-MLP norm, the
    router, top-k and aux loss, and the shared experts unless they overlap the dispatch
    (TransformerLayer's CUDA graph outputs: ``shared_expert_output`` without
    moe_shared_expert_overlap); ``moe_preprocess``: the dispatcher's dispatch_preprocess
    (``moe_kernels.dispatch_preprocess``; with moe_router). Graphed parts next to each other are
    one graph (one replay per layer and micro-batch, on its first operator); the input copies into
    a graph's static buffers are not counted."""
    scope = set(x.cuda_graph_scope)
    if not scope:
        return attention, moe
    router_ops = {"router", "router_topk", "moe_aux_loss"}
    out: list[Op] = []
    open_graph = False  # the previous operator ended inside a graph
    for i, op in enumerate(attention + moe):
        if is_shared_expert(op):  # listed after the combine, replayed in the router's graph
            graph = "moe_router" in scope and not x.shared_expert_overlap
            out.append(dataclasses.replace(op, host_launches=0) if graph else op)
            continue
        if i < len(attention):
            captured = "attn" in scope
        elif op.name == "moe_permute":
            captured = "moe_preprocess" in scope
        else:  # the pre-MLP norm opens the MoE block
            captured = "moe_router" in scope and (i == len(attention) or op.name in router_ops)
        if not captured:
            out.append(op)
            open_graph = False
            continue
        launches = 0 if open_graph else 1
        if op.name == "moe_permute":
            launches += op.forward_host_launches - dispatch_preprocess(config)
        out.append(dataclasses.replace(op, host_launches=launches))
        open_graph = op.name != "moe_permute"
    return tuple(out[:len(attention)]), tuple(out[len(attention):])


def expert_routing(model: ModelSpec, plan: ParallelPlan) -> ExpertRouting | None:
    """The routing a flex dispatcher (DeepEP, HybridEP) sends by; None for alltoall / allgather."""
    if plan.dispatcher not in DISPATCH_BACKENDS:
        return None
    return ExpertRouting(model.num_moe_experts or 1, model.moe_router_topk or 1, model.moe_router_num_groups,
                         model.moe_router_group_topk, plan.dispatcher)


def expected_units_touched(routing: ExpertRouting, units: int) -> float:
    """How many of ``units`` equal contiguous blocks of the experts (the EP group's nodes, or its
    ranks) one token's top-k experts fall in, on average, when the router picks uniformly: a
    block is missed with the hypergeometric probability C(E - E_u, k) / C(E, k), so
    E[blocks] = units (1 - C(E - E_u, k) / C(E, k)) (occupancy without replacement). Group-limited
    routing (Megatron-Core's group_limited_topk: ``group_topk`` of ``groups`` groups, then the
    top-k among their experts) picks from M = group_topk x E/groups experts: a block holding whole
    groups is missed when none of its groups is chosen or none of its experts is picked; a block
    inside a group when its group is not chosen or none of its experts is picked."""
    e, k = routing.experts, routing.topk
    if units <= 1:
        return float(units)
    per = max(1, e // units)
    groups, chosen = routing.groups, routing.group_topk
    missed = math.comb(e - per, k) / math.comb(e, k)
    if groups and chosen and chosen < groups:
        size = e // groups
        pick = chosen * size
        if groups % units == 0:  # a block holds groups // units whole groups
            held = groups // units
            missed = sum(math.comb(held, j) * math.comb(groups - held, chosen - j) / math.comb(groups, chosen)
                         * math.comb(pick - j * size, k) / math.comb(pick, k) for j in range(min(held, chosen) + 1))
        elif units % groups == 0:  # a group spans units // groups blocks
            p = chosen / groups
            missed = 1.0 - p + p * math.comb(pick - per, k) / math.comb(pick, k)
    return units * (1.0 - missed)


def most_units_touched(routing: ExpertRouting, units: int) -> int:
    """The most blocks (nodes, ranks) one token can reach: its top-k, and with group-limited
    routing the blocks its chosen groups cover (DeepSeek-V3 on 8 nodes: 4)."""
    most = min(units, routing.topk)
    groups, chosen = routing.groups, routing.group_topk
    if groups and chosen and chosen < groups:
        if groups % units == 0:
            most = min(most, chosen)
        elif units % groups == 0:
            most = min(most, chosen * (units // groups))
    return most


def count_moe_collectives(model: ModelSpec, plan: ParallelPlan, x: LocalShape) -> tuple[Collective, ...]:
    """The communication of one MoE layer: the attention's tensor- and context-parallel
    collectives, the shared experts' (as a dense MLP's), and the expert-parallel ones, by the
    token dispatcher (Megatron-Core's ``token_dispatcher.py``):

    - alltoall (``MoEAlltoAllTokenDispatcher``): the dispatch and combine all-to-alls over the EP
      group forward, their mirror images backward, and around the experts the all-gather and
      reduce-scatter over their ETP ranks. An all-to-all's size is one rank's whole send buffer
      (nccl-tests), taken at the busiest rank's load: it receives the most.
    - flex (``MoEFlexTokenDispatcher``, DeepEP / HybridEP): the same four calls, marked with the
      routing, so that the cost model sends a token once to each node and each rank it reaches.
    - allgather (``MoEAllGatherTokenDispatcher``): every rank gathers the tokens of its
      ETP x EP group (its ``tp_ep_group``) and keeps its experts' copies; the combine reduce-
      scatters the outputs back; backward the mirror images."""
    out = list(count_layer_collectives(model, plan, x, dense_mlp=bool(x.shared_ffn)))
    if plan.dispatcher == "allgather":
        tokens = x.e * x.b * x.s_norm * x.h  # this rank's hidden states
        for dim, size in ((ParallelDim.EP, plan.ep), (ParallelDim.ETP, plan.etp)):
            if size > 1:
                tokens *= size
                out += [
                    Collective(f"{dim.value}_allgather", CollectiveKind.ALL_GATHER, dim, tokens, phase)
                    for phase in (Phase.FWD, Phase.BWD_INPUT)
                ] + [
                    Collective(f"{dim.value}_reducescatter", CollectiveKind.REDUCE_SCATTER, dim, tokens, phase)
                    for phase in (Phase.FWD, Phase.BWD_INPUT)
                ]
        return tuple(out)
    load = x.routed / max(1, plan.etp)  # token copies reaching this rank's experts from the EP group
    if plan.ep > 1:
        size = x.e * load * x.h
        routing = expert_routing(model, plan)
        out += [
            Collective("ep_alltoall", CollectiveKind.ALL_TO_ALL, ParallelDim.EP, size, Phase.FWD, 2, routing),
            Collective("ep_alltoall", CollectiveKind.ALL_TO_ALL, ParallelDim.EP, size, Phase.BWD_INPUT, 2, routing),
        ]
    if plan.etp > 1:
        size = x.e * x.routed * x.h
        out += [
            Collective("etp_allgather", CollectiveKind.ALL_GATHER, ParallelDim.ETP, size, Phase.FWD),
            Collective("etp_reducescatter", CollectiveKind.REDUCE_SCATTER, ParallelDim.ETP, size, Phase.FWD),
            Collective("etp_allgather", CollectiveKind.ALL_GATHER, ParallelDim.ETP, size, Phase.BWD_INPUT),
            Collective("etp_reducescatter", CollectiveKind.REDUCE_SCATTER, ParallelDim.ETP, size, Phase.BWD_INPUT),
        ]
    return tuple(out)
