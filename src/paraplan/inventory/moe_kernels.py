"""How many kernels Megatron-Core's MoE layer launches per operator, read from its code.

A mixture-of-experts layer launches many small kernels besides its GEMMs: the router's top-k
and auxiliary loss, the token dispatcher's bookkeeping, copies to the host and communication
kernels, the permutations. After the dispatcher's host sync (``prediction.host_sync``) the GPU
waits for each of them to be launched, so what matters there is how many the host launches.
Each count below is the code's, for Megatron-Core 0.13-0.14 (``megatron/core/transformer/moe``:
``router.py`` TopKRouter.routing / _apply_aux_loss / attach_and_log_load_balancing_loss,
``moe_utils.py`` topk_routing_with_score_function / compute_routing_scores_for_aux_loss /
switch_load_balancing_loss_func / save_to_aux_losses_tracker / permute / unpermute /
sort_chunks_by_idxs / RouterGatingLinearFunction, ``token_dispatcher.py`` MoEAlltoAllTokenDispatcher
and MoEFlexTokenDispatcher's _DeepepManager (NVIDIA/Megatron-LM 0014f137), ``fused_a2a.py``
FusedDispatch / FusedCombine (02ad939b), ``experts.py`` TEGroupedMLP.forward) with Transformer
Engine 2.5-2.8 (``pytorch/router.py`` fused_topk_with_score_function,
fused_compute_score_for_moe_aux_loss, fused_moe_aux_loss: one kernel each way;
``pytorch/triton/permutation.py`` make_row_id_map: three passes, permute_with_mask_map /
unpermute_with_mask_map / make_chunk_sort_map / sort_chunks_by_map: one each;
``common/gemm/cublaslt_gemm.cu`` multi_stream_cublas_gemm: one cuBLAS GEMM per expert) and
DeepEP (``deep_ep.cpp`` Buffer::get_dispatch_layout, intranode/internode notify_dispatch + dispatch,
cached_notify_combine + combine). A count includes the collectives' kernels an operator's code
launches (NCCL's all-to-all, the token counts' all-gather, the aux loss's all-reduce) and its
copies to the host: each is a launch the host makes, one after another.

What the counts assume, where the code branches on more than paraplan's fields say: the router
in fp32 (``--moe-router-dtype fp32``, every recipe; DeepEP needs it), dropless routing (no
capacity factor), the aux loss micro-batch level (``aux_loss``; ``seq_aux_loss`` adds a division),
no z-loss, no expert bias update, ``--enable-experimental`` with the permute fusion (the recipes set
both; DeepEP's multihot conversion is then TE's fused kernel), the fused SwiGLU with probabilities
(``--bias-swiglu-fusion``, Megatron's default). HybridEP (``flex`` with backend hybridep) is
counted as DeepEP (its code was not read). A PyTorch op that is a view (reshape, unsqueeze, a
split) launches nothing; an out-of-place ``scatter`` is a copy and the scatter (2), a
``masked_select`` and boolean indexing a nonzero count and the gather (3).
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.inventory.ops import DISPATCH_BACKENDS


@dataclass(frozen=True, slots=True)
class Kernels:
    """Kernels one operator launches per micro-batch: ``fwd`` in the forward (what the host
    launches after the dispatcher's sync), ``bwd`` in the backward."""

    fwd: int
    bwd: int


@dataclass(frozen=True, slots=True)
class MoeKernelConfig:
    """What the counts depend on: Megatron-Core's ``--moe-router-fusion`` and
    ``--moe-permute-fusion``, the score function, group-limited routing, whether an aux loss is
    on, the dispatcher ('alltoall', 'deepep', 'hybridep'), the expert-parallel and expert
    tensor-parallel sizes (the dispatcher's ``tp_size`` is the experts' TP), the router's
    reduce group (attention TP x CP), the rank's local experts, the grouped GEMM."""

    router_fusion: bool = False
    permute_fusion: bool = False
    score_function: str = "softmax"
    group_limited: bool = False
    aux_loss: bool = True
    dispatcher: str = "alltoall"
    ep: int = 1
    etp: int = 1
    tp_cp: int = 1
    local_experts: int = 1
    grouped_gemm: bool = True


def router_gemm(c: MoeKernelConfig) -> Kernels:
    """RouterGatingLinearFunction: forward one GEMM (Transformer Engine's general_gemm, bf16 in,
    fp32 out); backward the input and weight GEMMs on fp32 copies of the weight and input, each
    gradient cast back to bf16: 2 GEMMs + 4 casts."""
    return Kernels(1, 6)


def router_topk(c: MoeKernelConfig) -> Kernels:
    """topk_routing_with_score_function. Fused: TE's fused_topk_with_score_function, one kernel
    each way. Unfused softmax: torch.topk, softmax, the probabilities scattered into a zero
    [tokens, experts] (zeros, copy, scatter) and the routing map (zeros, int cast, copy, scatter,
    bool cast): 10; backward the gather, softmax backward and topk's scatter (zeros, scatter): 4.
    Sigmoid: sigmoid, top-k, the gather of the chosen scores, their normalisation (sum, + eps,
    divide) instead of the softmax: 13 (backward 6); group-limited top-k (group_limited_topk)
    replaces the one top-k by ten kernels (top-k in groups, sum, top-k of groups, zeros,
    scatter_, the mask's expand copy, bool cast, not, masked_fill, top-k)."""
    if c.router_fusion:
        return Kernels(1, 1)
    fwd, bwd = (13, 6) if c.score_function == "sigmoid" else (10, 4)
    if c.group_limited:
        fwd, bwd = fwd + 9, bwd + 2
    return Kernels(fwd, bwd)


def aux_loss(c: MoeKernelConfig) -> Kernels:
    """TopKRouter._apply_aux_loss (training, coefficient > 0). The scores for the loss
    (compute_routing_scores_for_aux_loss; fused: one kernel, unfused: softmax or sigmoid's four,
    top-k and the routing map's five), the tokens per expert (routing_map.sum) and their
    all-reduce over the router's TP x CP group (reduce_from_tensor_model_parallel_region, when it
    is larger than 1), the loss (switch_load_balancing_loss_func; fused: one kernel, unfused: sum,
    multiply, sum, scale) and its logging (save_to_aux_losses_tracker: the division by the
    coefficient and ``values[layer] += loss``, an add and its copy back). Backward:
    MoEAuxLossAutoScaler's ones_like x scale (2), the loss's and the scores' backward (fused one
    each, unfused 2 and 1) and the logits' two gradients summed (1)."""
    if not c.aux_loss:
        return Kernels(0, 0)
    reduce = 1 if c.tp_cp > 1 else 0
    if c.router_fusion:
        return Kernels(1 + 1 + reduce + 1 + 3, 2 + 1 + 1 + 1)
    scores = 4 if c.score_function == "sigmoid" else 1
    return Kernels(scores + 1 + 5 + 1 + reduce + 4 + 3, 2 + 2 + 1 + 1)


def _permute(c: MoeKernelConfig) -> Kernels:
    """moe_utils.permute with the probabilities. Fused (TE moe_permute_with_probs, mask map):
    make_row_id_map's three passes and the permute kernel; backward the unpermute kernel.
    Unfused: the routing map's transpose copy, arange, masked_select of the token indices (3),
    the probabilities' transpose copy and masked_select (4), index_select: 10; backward the
    index_select's scatter-add (zeros, index_add) and the masked_select's (zeros, masked_scatter): 4."""
    return Kernels(4, 1) if c.permute_fusion else Kernels(10, 4)


def _unpermute(c: MoeKernelConfig) -> Kernels:
    """moe_utils.unpermute weighted by the probabilities. Fused (TE moe_unpermute, mask map):
    one kernel each way. Unfused: the probabilities' and routing map's transpose copies, the
    masked_select (3), the multiply, zeros, scatter_add_ and the cast back: 9; backward the
    gather of the gradient, the multiply's two gradients and the probabilities' masked_scatter: 5."""
    return Kernels(1, 1) if c.permute_fusion else Kernels(9, 5)


def _sort_chunks(c: MoeKernelConfig) -> Kernels:
    """sort_chunks_by_idxs (alltoall with more than one local expert). Fused: TE's
    make_chunk_sort_map and sort_chunks_by_map (probabilities in the same kernel); backward
    sort_chunks_by_map. Unfused: torch.split (views) and one cat per tensor."""
    return Kernels(2, 1) if c.permute_fusion else Kernels(1, 1)


def dispatch(c: MoeKernelConfig) -> Kernels:
    """From the router's output to the experts' input (the ``moe_permute`` operator): the
    dispatcher's preprocessing, the permutation, the dispatch communication and the sort by
    local expert.

    alltoall (MoEAlltoAllTokenDispatcher.preprocess / dispatch_preprocess / token_dispatch /
    dispatch_postprocess): routing_map.sum; with EP or ETP the send counts' reshape-sum, the
    all-gather of the counts over the ETP x EP group, the local experts' slice (contiguous) and
    its three sums; the copies to the host at ``before_permutation_1`` (tokens per expert, input,
    output and ETP splits; the per-expert counts too without the permute fusion); the permute;
    the tokens' and probabilities' all-to-alls (EP > 1); their all-gathers over ETP; the sort by
    local expert (tokens and probabilities; backward their mirror images and the probabilities'
    two gradients summed).

    deepep (_DeepepManager): the routing map and probabilities expanded over ETP (two copies
    when ETP > 1), torch.topk of the probabilities to indices, FusedDispatch's
    get_dispatch_layout, notify_dispatch and dispatch kernels, the indices back to a multihot map
    (megatron/core/fusions/fused_indices_converter.py IndicesToMultihot: one Triton kernel each
    way; eager _indices_to_multihot: zeros x2, compare, boolean index x2, arange, sum,
    repeat_interleave (3), two index_put and a cast: 18) and the permute. Backward: the permute's,
    the multihot's, DeepEP's combine (cached notify and combine), topk's scatter (zeros, scatter),
    the ETP expansion's sum and the probabilities' two gradients summed."""
    permute = _permute(c)
    if c.dispatcher in DISPATCH_BACKENDS:
        expand = 2 if c.etp > 1 else 0
        multihot = Kernels(1, 1) if c.permute_fusion else Kernels(18, 2)
        fwd = expand + 1 + 3 + multihot.fwd + permute.fwd
        bwd = permute.bwd + multihot.bwd + 2 + 2 + (1 if c.etp > 1 else 0) + 1
        return Kernels(fwd, bwd)
    comm = c.ep > 1 or c.etp > 1
    preprocess = 1 + (6 if comm else 0)
    to_host = (4 if comm else 1) + (1 if c.local_experts > 1 and not c.permute_fusion else 0)
    a2a = 2 if c.ep > 1 else 0
    gather = 2 if c.etp > 1 else 0
    sort = _sort_chunks(c) if c.local_experts > 1 else Kernels(0, 0)
    fwd = preprocess + to_host + permute.fwd + a2a + gather + sort.fwd
    bwd = permute.bwd + a2a + gather + sort.bwd + 1
    return Kernels(fwd, bwd)


def combine(c: MoeKernelConfig) -> Kernels:
    """From the experts' output back to the tokens (the ``moe_unpermute`` operator).

    alltoall (combine_preprocess / token_combine / combine_postprocess): the sort back by
    local expert (fused: the chunk map and the sort; unfused: a cat), the reduce-scatter over ETP
    in the probabilities' fp32 (cast, reduce-scatter, cast back), the all-to-all (EP > 1), the
    unpermute weighted by the router's probabilities. Backward the mirror images.

    deepep: the unpermute (get_restored_hidden_states_by_experts) and FusedCombine's
    cached_notify_combine and combine kernels; backward the unpermute's and DeepEP's cached
    dispatch (cached notify and dispatch)."""
    unpermute = _unpermute(c)
    if c.dispatcher in DISPATCH_BACKENDS:
        return Kernels(unpermute.fwd + 2, unpermute.bwd + 2)
    sort = _sort_chunks(c) if c.local_experts > 1 else Kernels(0, 0)
    scatter = 3 if c.etp > 1 else 0
    a2a = 1 if c.ep > 1 else 0
    return Kernels(sort.fwd + scatter + a2a + unpermute.fwd, sort.bwd + scatter + a2a + unpermute.bwd)


def expert_gemm(c: MoeKernelConfig) -> Kernels:
    """One of the experts' linear layers. TEGroupedMLP's GroupedLinear: one cuBLAS GEMM per
    local expert (multi_stream_cublas_gemm, each call with its own heuristic query and launch);
    backward the input and weight gradients of each (weight gradients accumulated into
    main_grad by the GEMM). SequentialMLP: the same GEMMs, one TE linear layer per expert."""
    return Kernels(c.local_experts, 2 * c.local_experts)


def activation(c: MoeKernelConfig) -> Kernels:
    """The experts' activation weighted by the probabilities (TEGroupedMLP with
    --bias-swiglu-fusion: weighted_bias_swiglu_impl, one fused kernel; backward the input's and
    the probabilities' gradients, 2); SequentialMLP runs it once per expert."""
    n = 1 if c.grouped_gemm else c.local_experts
    return Kernels(n, 2 * n)


def dispatch_preprocess(c: MoeKernelConfig) -> int:
    """Of ``dispatch``'s forward kernels, those the dispatcher's ``dispatch_preprocess`` runs,
    which a CUDA graph of scope ``moe_preprocess`` captures (Megatron-Core dev, transformer/moe/
    token_dispatcher.py; its ``cudagraph_attrs`` are what leaves the graph). alltoall: preprocess
    (the counts, their all-gather and sums) and the permute; with the graph the copies to the host
    move to ``before_ep_alltoall`` (``cuda_dtoh_point``), after the graph, so they stay launched.
    deepep / hybridep: _DeepepManager.setup_metadata (the ETP expansion and the top-k to
    indices); the layout, notify, dispatch, multihot and permute run after the graph."""
    if c.dispatcher in DISPATCH_BACKENDS:
        return (2 if c.etp > 1 else 0) + 1
    comm = c.ep > 1 or c.etp > 1
    return 1 + (6 if comm else 0) + _permute(c).fwd


@dataclass(frozen=True, slots=True)
class AttentionKernelConfig:
    """What the attention block's forward launches depend on in Megatron-Core's TE layer spec:
    tensor parallelism and sequence parallelism (the collectives of the QKV and output
    projections), --qk-layernorm, rotary embedding and --no-rope-fusion (``apply_rope_fusion``,
    on by default: megatron/training/arguments.py ``--no-rope-fusion`` store_false), the
    rotary share, --no-bias-dropout-fusion."""

    tp: int = 1
    sp: bool = False
    qk_layernorm: bool = False
    rotary: bool = True
    rope_fusion: bool = True
    bias_dropout_fusion: bool = True


#: Kernels of one unfused rotary embedding of one tensor (Megatron-Core
#: models/common/embeddings/rope_utils.py ``_apply_rotary_pos_emb_bshd``, 0.13-0.14): cos, the
#: mscale multiply and the cast to the input dtype (3), the same for sin (3), ``t * cos_`` (1),
#: ``_rotate_half``'s negation and cat (2), the multiply by ``sin_`` (1), the sum (1) and the
#: final ``torch.cat((t, t_pass))`` (1, a copy even when t_pass is empty).
UNFUSED_ROPE_KERNELS = 12


def attention_kernels(c: AttentionKernelConfig) -> dict[str, int]:
    """Forward kernels per attention-block operator (``inventory.layer.attention_block_ops``
    names) as Megatron-Core 0.13-0.14's TransformerLayer and SelfAttention launch them with
    Transformer Engine 2.5-2.8:

    - the input norm: the norm kernel of TELayerNormColumnParallelLinear (TE
      pytorch/module/layernorm_linear.py ``_LayerNormLinear.forward``, apply_normalization), 1;
    - ``linear1`` (linear_qkv): its GEMM, and with sequence parallelism over TP > 1 the
      all-gather of the norm's output before it (same function, ``gather_along_first_dim``;
      without sequence parallelism the column-parallel input needs nothing forward): 1 or 2;
    - ``qkv_split``: views (SelfAttention.get_query_key_value_tensors; TE SplitAlongDim), 0;
    - ``qk_norm``: q_layernorm and k_layernorm, a TENorm each, 2;
    - ``RoPE``: apply_rotary_pos_emb on the query and the key: TE's fused_apply_rotary_pos_emb,
      one kernel each (2), or ``UNFUSED_ROPE_KERNELS`` each; ``rotary_concat`` is in that count;
    - ``flash_atten`` (TEDotProductAttention, cuDNN fused attention): TE's fused_attn_fwd
      (pytorch/csrc/extensions/attention.cpp) launches ``unpack`` for the RNG state and the
      cuDNN graph: 2 (q, k and v go in as strided views of their layout, get_qkv_layout, no
      copy: TE's ``.contiguous()`` of q, k, v is on its inference KV-cache path);
    - ``linear2`` (linear_proj, TERowParallelLinear): its GEMM and, with TP > 1, the
      reduce-scatter (sequence parallelism) or all-reduce of its output (TE pytorch/module/
      linear.py ``_Linear.forward``, reduce_scatter_along_first_dim / allreduce): 1 or 2;
    - ``bias_add`` / ``dropout`` / ``res_add``: TransformerLayer's self_attn_bda
      (megatron/core/fusions/fused_bias_dropout.py get_bias_dropout_add): fused, one kernel for
      bias, dropout and residual (on ``res_add``); unfused, the bias add, dropout and add each.

    A name not here launches its ``Op.launches`` (multi-latent attention's projections and
    latent norms one each: MLASelfAttention's latent all-gathers under sequence parallelism are
    not counted; context parallelism's attention steps as ``context_parallel_core`` counts them;
    the FP8 casts as ``fp8_casts`` counts them)."""
    comm = c.tp > 1
    unfused_bda = 0 if c.bias_dropout_fusion else 1
    return {
        "RMSlayernorm": 1,
        "layernorm": 1,
        "linear1": 1 + (1 if comm and c.sp else 0),
        "qkv_split": 0,
        "qk_norm": 2,
        "RoPE": 2 if c.rope_fusion else 2 * UNFUSED_ROPE_KERNELS,
        "RoPE_fused": 2,
        "rotary_concat": 0,
        "flash_atten": 2,
        "linear2": 1 + (1 if comm else 0),
        "bias_add": unfused_bda,
        "dropout": unfused_bda,
        "res_add": 1,
    }


#: The FP8 GEMMs whose input a fused norm writes already quantized (TE's LayerNormLinear:
#: ``_LayerNormLinear.forward`` hands the input quantizer to the norm): the QKV projection, the
#: dense MLP's up projection, multi-latent attention's up projections (Megatron-Core's MLA layer
#: spec: TELayerNormColumnParallelLinear with --qk-layernorm).
NORM_FED_FP8 = frozenset({"linear1", "linear3", "q_up", "kv_up"})


def fp8_input_casts(name: str, local_experts: int, delayed: bool) -> int:
    """Kernels that quantize one FP8 GEMM's input in the forward (Transformer Engine 2.5-2.8).
    A TE Linear quantizes its input (``_Linear.forward``, its input quantizer): 1; under a
    fused norm (``NORM_FED_FP8``) 0. The experts' GroupedLinear splits and quantizes its input
    per expert (``split_quantize``, pytorch/csrc/extensions/cast.cpp ``multi_quantize_impl``:
    "Currently only have fused kernel for FP8 delayed scaling"): one kernel under delayed
    scaling, one per local expert under the other recipes. Current scaling's amax passes and
    their reductions are not counted."""
    if name in NORM_FED_FP8:
        return 0
    if name in ("expert_fc1", "expert_fc2"):
        return 1 if delayed else local_experts
    return 1


def moe_kernels(c: MoeKernelConfig) -> dict[str, Kernels]:
    """Kernels per MoE operator, by the inventory's operator names (``inventory.moe``)."""
    gemm = expert_gemm(c)
    return {
        "router": router_gemm(c),
        "router_topk": router_topk(c),
        "moe_aux_loss": aux_loss(c),
        "moe_permute": dispatch(c),
        "expert_fc1": gemm,
        "activation": activation(c),
        "expert_fc2": gemm,
        "moe_unpermute": combine(c),
    }
