"""The operators and collectives of one transformer layer (one micro-batch, one rank).

Saved-activation bytes follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models", section 4.1) term by term: with dropout, unfused attention and
tp = 1 they add up to s*b*h*(34 + 5*a*s/h) bytes; tests check the sum against that formula.
"""

from __future__ import annotations

import dataclasses
import functools

from paraplan.inventory import kernel_mixes as mixes
from paraplan.inventory.fp8 import current_amax_reductions, recipe_costs, te0_meta_update
from paraplan.inventory.ops import Collective, CollectiveKind, KernelMix, Op, OpKind, ParallelDim
from paraplan.inventory.shapes import LocalShape
from paraplan.inventory.sp_comm import gather_bytes, saved_shard_regathers
from paraplan.specs import FP8Recipe, Framework, ModelSpec, ParallelPlan, Phase


def gemm(
    name: str, role: str, m: int, k: int, n: int, e: int, *, bias: bool, saved: float, fp8: bool = False
) -> Op:
    """Y[m,n] = X[m,k] @ W[k,n] (+ bias). Backward: dX = dY W^T and dW = X^T dY.

    An ``fp8`` GEMM reads one-byte operands (the casts that make them are ``fp8_casts``),
    writes its output in the activation precision, and keeps the FP8 copy of its input for
    the weight gradient (Transformer Engine saves ``inputmat_t`` in FP8)."""
    flops = 2.0 * m * k * n
    operand = 1 if fp8 else e
    traffic = operand * (m * k + k * n) + e * m * n
    # backward: dX = dY W^T reads dY and W (FP8 copies when fp8) and writes dX; dW = X^T dY
    # reads X and dY and writes dW
    dgrad = operand * (m * n + k * n) + e * m * k
    wgrad = operand * (m * k + m * n) + e * k * n
    return Op(
        name=name,
        kind=OpKind.GEMM,
        role=role,
        flops=flops,
        bytes=traffic,
        bwd_flops=2.0 * flops,
        bwd_bytes=dgrad + wgrad,
        bwd_weight_flops=flops,
        bwd_weight_bytes=wgrad,
        params=k * n + (n if bias else 0),
        saved_bytes=saved / e if fp8 else saved,
        dims=(("m", m), ("k", k), ("n", n)),
        fp8=fp8,
    )


# The linear layers torchtitan's tensor parallelism (PyTorch DTensor) feeds a gathered input:
# QKV and the MLP's up projection behind ``PrepareModuleInput(desired_input_layouts=
# Replicate())``, and the LM head's ``ColwiseParallel(input_layouts=Shard(1))``.
DTENSOR_GATHERED = frozenset({"linear1", "linear3", "linear_final"})


def dtensor_gathered_inputs(plan: ParallelPlan, x: LocalShape, ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """``ops`` with the inputs torchtitan's tensor parallelism saves for the backward pass: with
    sequence parallelism, the whole all-gathered sequence of the linears ``DTENSOR_GATHERED``
    names, where Megatron-LM saves its sequence shard and gathers it again in the backward
    pass (what ``gemm``'s ``saved`` counts). torchtitan's ``apply_tp``
    (parallelisms/parallelize_llama.py at 9dec370; models/llama3/infra/parallelize.py later)
    gathers the attention's and the feed-forward's input with ``PrepareModuleInput`` (input
    ``Shard(1)``, desired ``Replicate()``) and the LM head's with ``ColwiseParallel``'s
    ``_prepare_input_fn`` (torch/distributed/tensor/parallel/style.py: ``redistribute`` to
    ``Replicate()`` before ``nn.Linear`` runs); the linear's autograd saves that gathered tensor.
    Under float8 TP, ``PrepareFloat8ModuleInput`` gathers it in float8 and torchao's
    ``matmul_with_hp_or_float8_args`` saves its input as given (``save_for_backward(input_hp,
    ...)``): one byte, as ``gemm`` counts an FP8 input. The saved bytes grow by s / s_norm."""
    if plan.framework is not Framework.FSDP or plan.tp == 1 or not plan.sequence_parallel or x.s_norm == x.s:
        return ops
    return tuple(dataclasses.replace(op, saved_bytes=op.saved_bytes * x.s / x.s_norm)
                 if op.name in DTENSOR_GATHERED else op for op in ops)


# Linear layers whose FP8 input the preceding norm writes itself (Transformer Engine's
# LayerNormLinear / LayerNormMLP): only the transpose for the weight gradient is extra.
_NORM_FED = frozenset({"linear1", "linear3"})
# the recipes whose sequence-parallel quantizers all-reduce a tensor's amax over tp first
# (``inventory.fp8.current_amax_reductions``; Transformer Engine's, framework megatron)
_TP_AMAX_RECIPES = frozenset({FP8Recipe.CURRENT, FP8Recipe.NVFP4})


def _eager_swiglu(fused: Op, elements: float, e: int, *, chunked: bool) -> Op:
    """SwiGLU as eager PyTorch runs it, ``silu(gate) * up``: forward, silu reads the gate and
    writes its activation, the multiply reads both and writes the product (5 passes over
    [tokens, ffn] against the fused kernel's 3); backward, the multiply's two gradients (read
    2, write 1 each) and silu's (read 2, write 1): 9 passes against 4. It keeps the silu output
    for the backward as well (3 tensors against 2). Two kernels forward (``Op.launches``; its
    backward runs three: the multiply's two gradients and silu's). ``chunked``: gate and up are
    halves of one projection's output (strided kernels, ``kernel_mixes.SWIGLU_CHUNKED``)."""
    return dataclasses.replace(
        fused,
        memory_kernels=mixes.SWIGLU_CHUNKED if chunked else mixes.SWIGLU_SEPARATE,
        role="MLP activation (eager: silu, then multiply)",
        launches=2,
        bytes=5.0 * e * elements,
        bwd_bytes=9.0 * e * elements,
        saved_bytes=3.0 * e * elements,
    )


def fp8_casts(gemms: list[Op], e: int, recipe: FP8Recipe | None = None, norm_fed: frozenset[str] = _NORM_FED) -> Op:
    """The casts around a layer's FP8 GEMMs under ``recipe`` (None: delayed), from the bytes
    they move (``inventory.fp8`` gives each recipe's kernels and their sources).

    Delayed scaling (Transformer Engine): forward, every GEMM input is cast to FP8 and
    transposed for the weight gradient (``cast_transpose``: read e bytes, write 1 + 1), except
    where a fused norm writes the FP8 input itself (read 1, write 1 for the transpose).
    Backward, every output gradient is cast and transposed (read e, write 1 + 1) for the data-
    and weight-gradient GEMMs. The amax of each tensor is reduced inside these kernels. Current
    scaling adds a pass that reads each tensor for its amax; rowwise scaling casts rows and
    columns from a 16-bit transpose; MXFP8 writes a scale per 32 elements of each copy. The
    weights' casts are counted per job (``inventory.job``). ``norm_fed``: the names of the GEMMs
    whose input a fused norm writes in FP8."""
    costs = recipe_costs(recipe)
    per = costs.act_reads * e + costs.act_writes
    fed = costs.norm_fed if costs.norm_fed is not None else per
    fwd = bwd = elements = grads = 0.0
    for op in gemms:
        dims = dict(op.dims)
        fwd += dims["m"] * dims["k"] * (fed if op.name in norm_fed else per)
        elements += dims["m"] * dims["k"]
        grads += dims["m"] * dims["n"]
    bwd = grads * per
    if recipe is None:  # today's arithmetic, to the last bit
        fwd, bwd = _delayed_bytes(gemms, e, norm_fed)
        elements, grads = fwd / (e + 2.0), bwd / (e + 2.0)
    name = (recipe or FP8Recipe.DELAYED).value
    return Op(
        name="fp8_cast",
        kind=OpKind.ELEMENTWISE,
        role=f"FP8 casts, amaxes and transposes of the GEMMs' inputs and gradients ({name} scaling)",
        flops=elements * (costs.act_reads + costs.rht_flops),
        bytes=fwd,
        bwd_flops=grads * (costs.act_reads + costs.rht_flops),
        bwd_bytes=bwd,
        dims=(("gemms", len(gemms)),),
    )


def _delayed_bytes(gemms: list[Op], e: int, norm_fed: frozenset[str] = _NORM_FED) -> tuple[float, float]:
    fwd = bwd = 0.0
    for op in gemms:
        dims = dict(op.dims)
        fwd += dims["m"] * dims["k"] * (2.0 if op.name in norm_fed else e + 2.0)
        bwd += dims["m"] * dims["n"] * (e + 2.0)
    return fwd, bwd


def recipe_gemm(op: Op, recipe: FP8Recipe | None, e: int) -> Op:
    """An FP8 GEMM as ``recipe`` runs it: MXFP8 reads a scale byte per 32 operand elements,
    NVFP4 half a byte and a scale byte per 16 (on the FP4 tensor cores, ``Op.fp4``, saving its
    input as NVFP4);
    rowwise keeps its input for the weight gradient in 16 bits (torchao saves the high-
    precision input). Delayed and current scaling: the GEMM as ``gemm`` counts it."""
    costs = recipe_costs(recipe)
    if not op.fp8 or recipe is None:
        return op
    dims = dict(op.dims)
    m, k, n, w = dims["m"], dims["k"], dims["n"], op.params
    extra = costs.operand_bytes - 1.0
    saved = costs.saved_per_element if costs.saves_fp8_input else e
    return dataclasses.replace(
        op,
        bytes=op.bytes + extra * (m * k + w),
        bwd_bytes=op.bwd_bytes + extra * ((m * n + w) + (m * k + m * n)),
        bwd_weight_bytes=op.bwd_weight_bytes + extra * (m * k + m * n),
        saved_bytes=op.saved_bytes * saved,
        fp4=costs.fp4_gemms,
    )


def elementwise(
    name: str,
    kind: OpKind,
    role: str,
    elements: float,
    e: int,
    *,
    reads: float = 1.0,
    flops_per_element: float = 1.0,
    saved: float = 0.0,
    params: float = 0.0,
    selective: bool = False,
    dims: tuple[tuple[str, int], ...] = (),
    kernels: KernelMix | None = None,
) -> Op:
    """A memory-bound kernel: reads ``reads`` tensors of ``elements`` and writes one.
    Its backward reads the incoming gradient and what it saved, and writes one gradient.
    ``kernels``: the kinds of streaming kernel it runs (``inventory.kernel_mixes``)."""
    traffic = e * elements * (reads + 1.0) + e * params
    return Op(
        name=name,
        kind=kind,
        role=role,
        flops=flops_per_element * elements,
        bytes=traffic,
        bwd_flops=2.0 * flops_per_element * elements,
        bwd_bytes=e * elements * (reads + 2.0) + 2 * e * params,
        params=params,
        saved_bytes=saved,
        selective_recompute=selective,
        dims=dims,
        memory_kernels=kernels,
    )


def norm(model: ModelSpec, x: LocalShape, role: str) -> Op:
    n = x.b * x.s_norm * x.h
    rms = model.normalization == "rmsnorm"
    op = elementwise(
        "RMSlayernorm" if rms else "layernorm",
        OpKind.NORM,
        role,
        n,
        x.e,
        flops_per_element=4.0 if rms else 5.0,
        saved=x.e * n,
        params=x.h if rms else 2 * x.h,
        dims=(("b", x.b), ("l", x.s_norm), ("dim", x.h)),
    )
    if rms and not model.rmsnorm_fusion:
        op = _eager_rmsnorm(op, n, x.e)
    return op


#: The eager RMSNorm's name: no GPU has an ``efficiency.ops`` curve of it, so its kernels are
#: timed on the GPU's generic ``memory`` curve (the ``RMSlayernorm`` curves time one fused
#: kernel, or on A100 and GH200 GPT-NeoX's norm as sampled, and would count the eager
#: kernels' extra traffic twice).
EAGER_RMSNORM = "RMSnorm_eager"
#: Its forward kernels, each launched on its own: x.to(float32), pow, mean, + eps, rsqrt,
#: the multiply, .to(input dtype) and the weight's multiply (the backward pass runs more; one
#: count serves both, as ``Op.launches`` does).
EAGER_RMSNORM_KERNELS = 8


def _eager_rmsnorm(fused: Op, elements: float, e: int) -> Op:
    """RMSNorm as Hugging Face's eager code runs it (``LlamaRMSNorm.forward`` in transformers
    models/llama/modeling_llama.py, the same in its Mistral, Qwen2 and other copies):
    ``x.to(float32)`` (read e bytes, write 4), ``pow(2)`` (read 4, write 4), ``mean(-1)`` (read
    4), ``x * rsqrt(var + eps)`` (read 4, write 4), ``.to(input_dtype)`` (read 4, write e) and
    ``weight * x`` (read e, write e): 28 + 4e bytes per element against the fused kernel's 2e.
    The backward pass retraces them in reverse, each gradient in the precision of its tensor:
    the weight's multiply (read e, write e; the weight gradient reads 2e), the cast back
    (read e, write 4), the multiply by the reciprocal (read 4, write 4; the reciprocal's
    gradient, a sum, reads 8), the square's gradient (read 4, write 4), the sum of the input's
    two gradients (read 8, write 4) and its cast (read 4, write e): 44 + 6e. Saved for the
    backward pass: the float32 copy of the input (``pow`` and the multiply keep it) and the
    e-byte normalized tensor (the weight's multiply keeps it), 4 + e bytes per element against
    the fused kernel's e. The role stays the fused norm's (selective recompute finds norms by
    it). Named ``EAGER_RMSNORM``: timed as ``EAGER_RMSNORM_KERNELS`` memory-bound kernels on the
    GPU's generic memory curve, never on the fused norm's ``RMSlayernorm`` curve."""
    return dataclasses.replace(
        fused,
        name=EAGER_RMSNORM,
        launches=EAGER_RMSNORM_KERNELS,
        bytes=(28.0 + 4.0 * e) * elements + e * fused.params,
        bwd_bytes=(44.0 + 6.0 * e) * elements + 2 * e * fused.params,
        saved_bytes=(4.0 + e) * elements,
        memory_kernels=mixes.RMSNORM_EAGER,
    )


def separate_gemms(name: str, parts: tuple[tuple[str, int], ...], summed: str, m: int, k: int, e: int, *,
                   bias: bool, saved: float, fp8: bool) -> list[Op]:
    """The projections a fused GEMM of ``sum(widths)`` columns would run, as model code with an
    ``nn.Linear`` each runs them (torchtitan's ``wq``/``wk``/``wv`` and ``w1``/``w3``, IBM fms'
    ``query``/``key``/``value`` and ``wg``/``w1``, Hugging Face's ``q_proj``/``k_proj``/``v_proj``
    and ``gate_proj``/``up_proj``): one GEMM per part, each reading the whole input ``[m, k]``
    and, in the backward pass, writing its own input gradient; then autograd's sums of those
    gradients (``len(parts) - 1`` adds of ``[m, k]``: torch's ``InputBuffer::accumulate``), whose
    role is ``summed``. ``parts``: (role, columns) of each GEMM. FLOPs and parameters are the fused
    GEMM's; the input is one tensor, saved once (by the first part). Each part keeps ``name`` (the
    fused GEMM's: the sequence-parallel gather, float8 and async-TP rules that name it hold for
    every part)."""
    ops = [gemm(name, role, m, k, n, e, bias=bias, saved=saved if i == 0 else 0.0, fp8=fp8)
           for i, (role, n) in enumerate(parts)]
    ops.append(input_gradient_sum(summed, float(m) * k, e, adds=len(parts) - 1))
    return ops


def input_gradient_sum(role: str, elements: float, e: int, *, adds: int) -> Op:
    """Autograd's sum of the input gradients of ``adds + 1`` GEMMs that read one tensor of
    ``elements``: ``adds`` add kernels in the backward pass (each reads two gradients and writes
    one), nothing forward."""
    return Op(
        name="grad_sum",
        kind=OpKind.ELEMENTWISE,
        role=role,
        flops=0.0,
        bytes=0.0,
        bwd_flops=adds * elements,
        bwd_bytes=adds * 3.0 * e * elements,
        dims=(("elements", int(elements)), ("adds", adds)),
        launches=adds,
        memory_kernels=mixes.VECTORIZED,
    )


def _dropout(x: LocalShape, elements: float, role: str, *, selective: bool) -> Op:
    # Saves a one-byte mask per element (Korthikanti et al. count it as 1 byte).
    return elementwise(
        "dropout", OpKind.ELEMENTWISE, role, elements, x.e, saved=elements, selective=selective,
    )  # PyTorch's fused_dropout_kernel (random numbers drawn in it), not an element-wise kernel of a measured kind


def _bias(role: str, elements: float, width: int, e: int, *, own_kernel: bool) -> Op:
    """The bias of a linear layer that returns it unapplied (``skip_bias_add`` in Megatron-LM
    and GPT-NeoX: both row-parallel projections and the MLP up projection). Forward: an add
    kernel of its own unless a fused kernel applies it (bias-GELU, bias-dropout-add with a
    residual); backward: the bias gradient, a sum of the incoming gradient over the tokens
    (a weight gradient). ``elements`` is the layer output's size, ``width`` the bias's."""
    forward = e * (2.0 * elements + width) if own_kernel else 0.0
    reduction = e * (elements + width)
    return Op(
        name="bias_add",
        kind=OpKind.ELEMENTWISE,
        role=role,
        flops=elements if own_kernel else 0.0,
        bytes=forward,
        bwd_flops=elements,
        bwd_bytes=reduction,
        bwd_weight_flops=elements,
        bwd_weight_bytes=reduction,
        dims=(("elements", int(elements)), ("width", width)),
        memory_kernels=mixes.BIAS_ADD,
    )


def _copy(name: str, role: str, elements: float, e: int, *, fwd_passes: float, bwd_passes: float) -> Op:
    """A layout copy (``contiguous``, ``cat``, the gradient of a ``split``) that moves
    ``elements`` once per pass: each pass reads and writes them."""
    return Op(
        name=name,
        kind=OpKind.ELEMENTWISE,
        role=role,
        flops=0.0,
        bytes=2.0 * e * elements * fwd_passes,
        bwd_flops=0.0,
        bwd_bytes=2.0 * e * elements * bwd_passes,
        dims=(("elements", int(elements)),),
    )


def _bmm(name: str, role: str, flops: float, traffic: float, *, saved: float, kept: float, dims) -> Op:
    """A batched matmul of the unfused attention core; its backward runs two (dA and dB)."""
    return Op(
        name=name,
        kind=OpKind.BMM,
        role=role,
        flops=flops,
        bytes=traffic,
        bwd_flops=2.0 * flops,
        bwd_bytes=2.0 * traffic,
        saved_bytes=saved,
        selective_recompute=True,
        selective_kept_bytes=kept,
        dims=dims,
    )


def kernel_kv_heads(model: ModelSpec, x: LocalShape) -> int:
    """The K and V heads the attention kernel reads and keeps: the query heads where the model
    code repeats grouped K and V to every head first (``gqa_expand: copy``), else the groups."""
    return x.heads if model.gqa_expand == "copy" else x.groups


def attention_core(model: ModelSpec, x: LocalShape) -> list[Op]:
    kv_heads = kernel_kv_heads(model, x)
    q_elems = x.b * x.s * x.heads * x.d
    kv_elems = x.b * x.s_kv * kv_heads * x.d  # K and V a rank attends to (all chunks under CP)
    kv_kept = x.b * x.s * kv_heads * x.d  # its own chunk: context parallelism re-gathers the rest
    core_flops = 4.0 * x.b * x.heads * x.s * x.s_kv * x.d  # QK^T and PV, full square
    head_dims = (("b", x.b), ("h", x.heads), ("l", x.s), ("l_kv", x.s_kv), ("d", x.d))
    if model.attention == "flash":
        traffic = x.e * (2 * q_elems + 2 * kv_elems)
        lse = 4.0 * x.b * x.heads * x.s
        return context_parallel_core(
            Op(
                name="flash_atten",
                kind=OpKind.ATTENTION,
                role="attention core (flash, causal)",
                flops=core_flops,
                bytes=traffic,
                bwd_flops=2.5 * core_flops,  # backward recomputes QK^T: 5 matmuls vs 2
                bwd_bytes=2.0 * traffic,
                saved_bytes=x.e * (q_elems + 2 * kv_kept) + lse,  # q, k, v, logsumexp
                selective_recompute=True,
                selective_kept_bytes=x.e * (q_elems + 2 * kv_kept),
                exec_fraction=0.5,
                dims=head_dims,
            ),
            x,
            kv_heads=kv_heads,
        )
    scores = x.b * x.heads * x.s * x.s_kv
    half = core_flops / 2.0
    dropout = model.attention_dropout > 0
    # V, and for P V the dropped-out probabilities when dropout made a new tensor
    ops = [
        _bmm(
            "baddbmm",
            "attention scores Q K^T",
            half,
            x.e * (q_elems + kv_elems + scores),
            saved=x.e * (q_elems + kv_kept),
            kept=x.e * (q_elems + kv_kept),
            dims=head_dims,
        ),
        elementwise(
            "softmax",
            OpKind.SOFTMAX,
            "scaled causal-mask softmax",
            scores,
            x.e,
            flops_per_element=5.0,
            saved=x.e * scores,
            selective=True,
            dims=head_dims,
        ),
    ]
    # baddbmm applies the 1/sqrt(d) scale in the GEMM; its backward scales dQ and dK in
    # two separate multiplications (ATen's maybe_multiply)
    ops.insert(
        1,
        _copy("score_scale", "1/sqrt(d) on dQ and dK (baddbmm backward)", q_elems + kv_elems, x.e,
              fwd_passes=0.0, bwd_passes=1.0),
    )
    if dropout:
        ops.append(_dropout(x, scores, "attention dropout", selective=True))
    ops.append(
        _bmm(
            "bmm",
            "attention context P V",
            half,
            x.e * (scores + kv_elems + q_elems),
            saved=x.e * (kv_kept + (scores if dropout else 0.0)),
            kept=x.e * kv_kept,
            dims=head_dims,
        )
    )
    return ops


@functools.lru_cache(maxsize=256)
def count_layer_ops(model: ModelSpec, x: LocalShape) -> tuple[Op, ...]:
    """Every operator of one dense transformer layer, in execution order (a mixture-of-experts
    layer: ``inventory.moe.count_moe_layer_ops``). Transformer Engine 0.x's FP8 bookkeeping
    (``LocalShape.fp8_meta_kernels``) comes last, one operator for the layer's modules."""
    ops = with_fp8_casts(attention_block_ops(model, x) + mlp_block_ops(model, x), x)
    return (*ops, te0_meta_update(x.fp8_meta_kernels)) if x.fp8_meta_kernels else ops


def with_fp8_casts(ops: tuple[Op, ...], x: LocalShape) -> tuple[Op, ...]:
    """A layer's operators, followed in FP8 training by the casts of its FP8 GEMMs (its GEMMs as
    the shape's FP8 recipe runs them)."""
    if not x.fp8_linears:
        return ops
    ops = tuple(recipe_gemm(op, x.fp8_recipe, x.e) for op in ops)
    return (*ops, fp8_casts([op for op in ops if op.fp8], x.e, x.fp8_recipe))


def _qk_norm(x: LocalShape, heads: int, groups: int, d: int) -> Op:
    """RMSNorm of each query and key head (Qwen3, OLMo 2; Megatron-LM --qk-layernorm)."""
    n = x.tokens * (heads + groups) * d
    return elementwise("qk_norm", OpKind.NORM, "RMSNorm of query and key heads", n, x.e,
                       flops_per_element=4.0, saved=x.e * n, params=2 * d, dims=(("elements", int(n)), ("dim", d)))


def _mla_projections(model: ModelSpec, x: LocalShape) -> list[Op]:
    """Multi-head latent attention's projections (DeepSeek-V2 section 2.1, Megatron-Core
    ``MLASelfAttention``): the down projections to the query and key-value latents are
    replicated on every tensor-parallel rank (``duplicated`` linears), their norms too; the up
    projections split the heads. The key's rotary part is shared by the heads."""
    e, tokens, fp8 = x.e, x.tokens, x.fp8_linears
    qk, rope, v, heads = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim, x.heads
    own = x.b * x.s_norm  # the rank's own tokens: all of them, or 1/tp under sequence parallelism
    hidden_norm = own * x.h
    ops: list[Op] = []
    if model.q_lora_rank:
        r = model.q_lora_rank
        ops.append(gemm("q_down", "query down projection (MLA)", own, x.h, r, e, bias=False, saved=e * hidden_norm, fp8=fp8))
        ops.append(_latent_norm("q_norm", x, r, own))
        ops.append(gemm("q_up", "query up projection (MLA)", tokens, r, heads * (qk + rope), e, bias=False, saved=e * tokens * r, fp8=fp8))
    else:
        ops.append(gemm("q_proj", "query projection (MLA)", tokens, x.h, heads * (qk + rope), e, bias=False, saved=e * hidden_norm, fp8=fp8))
    kv = model.kv_lora_rank
    ops.append(gemm("kv_down", "key-value down projection (MLA)", own, x.h, kv + rope, e, bias=False, saved=0.0, fp8=fp8))
    ops.append(_latent_norm("kv_norm", x, kv, own))
    ops.append(gemm("kv_up", "key-value up projection (MLA)", tokens, kv, heads * (qk + v), e, bias=False, saved=e * tokens * kv, fp8=fp8))
    rotated = tokens * (heads + 1) * rope
    ops.append(elementwise(rope_name(model), OpKind.ELEMENTWISE, "rotary embedding of the rope parts (MLA)", rotated, e,
                           flops_per_element=3.0, dims=(("l", x.s), ("b", x.b), ("h", heads), ("d_rot", rope))))
    return ops


# MLA's operators whose weights every tensor-parallel rank holds whole (Megatron-Core's
# ``duplicated`` linears and the latent norms): under sequence parallelism each rank's gradient
# covers its own tokens only, and the ranks all-reduce them once per iteration
DUPLICATED_ACROSS_TP = frozenset({"q_down", "q_norm", "kv_down", "kv_norm"})


def _latent_norm(name: str, x: LocalShape, width: int, tokens: int) -> Op:
    n = tokens * width
    return elementwise(name, OpKind.NORM, "RMSNorm of the latent (MLA)", n, x.e, flops_per_element=4.0,
                       saved=x.e * n, params=width, dims=(("tokens", tokens), ("dim", width)))


def _mla_core(model: ModelSpec, x: LocalShape) -> Op:
    """Flash attention over MLA's heads: queries and keys of qk_head_dim + qk_pos_emb_head_dim,
    values of v_head_dim (192 and 128 in DeepSeek-V3)."""
    d_qk, d_v = model.qk_head_dim + model.qk_pos_emb_head_dim, model.v_head_dim
    q = x.b * x.s * x.heads
    kv = x.b * x.s_kv * x.heads
    flops = 2.0 * x.b * x.heads * x.s * x.s_kv * (d_qk + d_v)
    traffic = x.e * (q * (d_qk + d_v) + kv * (d_qk + d_v))
    kept = x.e * (q * d_qk + x.b * x.s * x.heads * (d_qk + d_v))
    return Op(
        name="flash_atten",
        kind=OpKind.ATTENTION,
        role="attention core (flash, causal; MLA heads)",
        flops=flops,
        bytes=traffic,
        bwd_flops=2.5 * flops,
        bwd_bytes=2.0 * traffic,
        saved_bytes=kept + 4.0 * q,
        selective_recompute=True,
        selective_kept_bytes=kept,
        exec_fraction=0.5,
        dims=(("b", x.b), ("h", x.heads), ("l", x.s), ("l_kv", x.s_kv), ("d", d_qk)),
    )


def context_parallel_core(op: Op, x: LocalShape, kv_heads: int | None = None) -> list[Op]:
    """The causal fused attention ``op`` of a rank's ``s`` queries against all ``s_kv = cp s``
    keys (one launch, the full-square FLOPs 4 b h s s_kv d, half executed) as context
    parallelism launches it (``x.cp_kernels``); the same list ``[op]`` without it.

    The sequence is cut into 2 cp chunks of s / 2, rank r holding chunks r and 2cp - 1 - r
    (causal load balancing):

    - ring (Transformer Engine's AttnFuncWithCPAndKVP2P, PyTorch's _templated_ring_attention):
      cp launches forward and cp backward, one per K/V chunk. The rank's own chunk is the
      causal square of s queries and s keys (``op`` at s_kv = s, holding what it saves and any
      parameters); each of the cp - 1 others half of a square run whole, as a second op of cp - 1
      launches: a chunk
      from an earlier rank is all queries against its first half (s x s/2), from a later rank
      the second half of the queries against all of it (s/2 x s). Rank 0 runs only the
      latter, rank cp - 1 only the former, and every rank waits on the ring: the dims say
      s/2 x s and carry ``ring``, and the cost model prices each launch as the slower of the
      shape and its transpose (``roofline.attention_tile_s``). FLOPs and bytes add up to ``op``'s;
    - gathered (Transformer Engine's AttnFuncWithCPAndKVAllGather): the two query chunks
      against the gathered keys up to their own ends, on two streams side by side: one wave of
      both launches' tiles, ``op`` as it is;
    - heads (Transformer Engine's AttnFuncWithCPAndQKVOA2A, DeepSpeed-Ulysses): one launch over
      the whole sequence with heads / cp: the same FLOPs at that shape.

    ``kv_heads``: the heads of K and V the bytes count (``x.groups``; MLA's keys and values have
    every head), splitting the bytes between the launches."""
    cp = x.s_kv // x.s
    if cp <= 1 or x.cp_kernels == "gathered":
        return [op]
    dims = dict(op.dims)
    if x.cp_kernels == "heads":
        dims.update(h=dims["h"] // cp, l=x.s_kv, l_kv=x.s_kv)
        return [dataclasses.replace(op, dims=tuple(dims.items()))]
    own = dataclasses.replace(
        op, flops=op.flops / cp, bwd_flops=op.bwd_flops / cp,
        bytes=_own_chunk_bytes(op.bytes, x, cp, kv_heads), bwd_bytes=_own_chunk_bytes(op.bwd_bytes, x, cp, kv_heads),
        dims=tuple({**dims, "l_kv": x.s}.items()),
    )
    steps = cp - 1
    ring = dataclasses.replace(
        op, role=f"{op.role}: {steps} ring steps",
        flops=steps * op.flops / (2 * cp), bwd_flops=steps * op.bwd_flops / (2 * cp),
        bytes=op.bytes - own.bytes, bwd_bytes=op.bwd_bytes - own.bwd_bytes,
        saved_bytes=0.0, selective_kept_bytes=0.0, params=0.0, exec_fraction=1.0, launches=steps,
        dims=tuple({**dims, "l": x.s // 2, "l_kv": x.s, "ring": 1}.items()),
    )
    return [own, ring]


def _own_chunk_bytes(traffic: float, x: LocalShape, cp: int, kv_heads: int | None) -> float:
    """Of a core's ``traffic`` over all cp chunks of K and V (q and o once, each chunk's k and
    v), what the launch over the rank's own chunk moves."""
    kv = x.groups if kv_heads is None else kv_heads
    return traffic * (x.heads + kv) / (x.heads + cp * kv)


def attention_block_ops(model: ModelSpec, x: LocalShape) -> tuple[Op, ...]:
    """The input norm, the attention and its residual add, in execution order."""
    e, tokens, bias = x.e, x.tokens, model.add_bias_linear
    hidden_norm = x.b * x.s_norm * x.h  # what norms, dropout and residual adds touch
    qkv_out = (x.heads + 2 * x.groups) * x.d
    ops: list[Op] = [norm(model, x, "input norm")]
    fp8 = x.fp8_linears
    if model.multi_latent_attention:
        ops += _mla_projections(model, x)
        ops.extend(context_parallel_core(_mla_core(model, x), x, kv_heads=x.heads))
        out_width = x.heads * model.v_head_dim
    else:
        ops += _mha_projections(model, x, qkv_out, hidden_norm)
        ops.extend(attention_core(model, x))
        out_width = x.heads * x.d
    if model.attention == "unfused":
        # context [b, np, s, hn] -> [s, b, np*hn]: permute(...).contiguous(); its gradient is a view
        ops.append(
            dataclasses.replace(_copy(
                "context_copy",
                "attention context to [s, b, h] layout",
                tokens * x.heads * x.d,
                e,
                fwd_passes=1.0,
                bwd_passes=0.0,
            ), memory_kernels=mixes.STRIDED_COPY)
        )
    ops.append(
        gemm(
            "linear2",
            "attention output projection",
            tokens,
            out_width,
            x.h,
            e,
            bias=bias,
            saved=e * tokens * out_width,
            fp8=fp8,
        )
    )
    if bias:
        # GPT-J's parallel residual adds the attention output to nothing yet: its bias is a
        # kernel of its own even when fused with dropout
        alone = not model.bias_dropout_fusion or model.parallel_residual
        ops.append(_bias("attention output bias", hidden_norm, x.h, e, own_kernel=alone))
    if model.hidden_dropout > 0:
        ops.append(_dropout(x, hidden_norm, "attention output dropout", selective=False))
    ops.append(elementwise("res_add", OpKind.ELEMENTWISE, "residual add", hidden_norm, e, reads=2.0,
                           kernels=mixes.VECTORIZED))
    return tuple(ops)


def _mha_projections(model: ModelSpec, x: LocalShape, qkv_out: int, hidden_norm: float) -> list[Op]:
    e, tokens = x.e, x.tokens
    # Its bias (add_qkv_bias: GPT-2, GPT-NeoX, Qwen2) is applied by the GEMM kernel itself (addmm,
    # Transformer Engine's epilogue): parameters, gradients and optimizer states count it; its
    # FLOPs (one add per output) stay inside the kernel's 2mkn, as in the sampled GPT-NeoX linear1
    # the GPU curves were fitted on.
    if model.qkv_fusion:
        ops = [
            gemm("linear1", "QKV projection", tokens, x.h, qkv_out, e, bias=model.add_qkv_bias,
                 saved=e * hidden_norm, fp8=x.fp8_linears)
        ]
        # q, k and v are views of the projection's output; backward joins their gradients (cat)
        ops.append(
            _copy("qkv_split", "split of the QKV output (gradient: cat)", tokens * qkv_out, e, fwd_passes=0.0, bwd_passes=1.0)
        )
    else:
        parts = (("query projection", x.heads * x.d), ("key projection", x.groups * x.d),
                 ("value projection", x.groups * x.d))
        ops = separate_gemms("linear1", parts, "q, k, v input gradients summed", tokens, x.h, e,
                             bias=model.add_qkv_bias, saved=e * hidden_norm, fp8=x.fp8_linears)
    if model.qk_layernorm:
        ops.append(_qk_norm(x, x.heads, x.groups, x.d))
    if model.position_embedding == "rotary" and model.rope_impl != "kernel":
        ops.append(eager_rope(model, x))
    elif model.position_embedding == "rotary":
        rotated = tokens * (x.heads + x.groups) * x.d * model.rotary_percent
        ops.append(
            elementwise(
                rope_name(model),
                OpKind.ELEMENTWISE,
                "rotary embedding of q and k",
                rotated,
                e,
                flops_per_element=3.0,
                dims=(
                    ("l", x.s),
                    ("b", x.b),
                    ("h", x.heads),
                    ("g", x.groups),
                    ("d", x.d),
                    ("d_rot", max(1, round(x.d * model.rotary_percent))),
                ),
            )
        )
        if model.rotary_percent < 1.0:
            # q and k are sliced into rotated and passed-through parts and joined again with
            # torch.cat (GPT-NeoX ParallelSelfAttention, Megatron-LM apply_rotary_pos_emb).
            # Backward: each slice's gradient is a zero-filled full-size tensor with the part
            # copied in, and the two are added: 2 fills + 1 copy + 1 add = 3.5 passes.
            ops.append(
                _copy(
                    "rotary_concat",
                    "rejoin rotated and pass-through q, k",
                    tokens * (x.heads + x.groups) * x.d,
                    e,
                    fwd_passes=1.0,
                    bwd_passes=3.5,
                )
            )
    if model.gqa_expand == "copy" and x.groups < x.heads:
        ops.append(kv_repeat(x))
    return ops


#: The rotary embedding's name where one kernel per tensor applies it (Transformer Engine's
#: ``fused_apply_rotary_pos_emb``, Megatron-Core's default ``apply_rope_fusion``; Apex's and
#: flash-attn's rotary kernels): no GPU has an ``efficiency.ops`` curve of it, and its kernels'
#: kind is not known (``inventory.kernel_mixes``), so it is timed on the GPU's generic ``memory``
#: curve. ``RoPE`` is the unfused form the ``RoPE`` curves were sampled on: GPT-NeoX's
#: ``apply_rotary_pos_emb`` (GPUModeling25's sampler, Kernel_sampling/megatron/RoPE.py: two
#: slices, a negation, a concatenation, two multiplies and an add per tensor, under
#: ``torch.jit.script`` in fp16; its backward events DifferentiableGraphBackward, NegBackward0
#: and SliceBackward0), as Megatron-LM runs it with ``--no-rope-fusion`` (``_rotate_half``).
FUSED_ROPE = "RoPE_fused"


def rope_name(model: ModelSpec) -> str:
    """The rotary embedding's operator name: ``FUSED_ROPE`` under ``model.rope_fusion``, else
    ``RoPE`` (the multi-kernel form the GPUs' ``RoPE`` curves time)."""
    return FUSED_ROPE if model.rope_fusion else "RoPE"


#: The eager rotary embeddings' names: no GPU has an ``efficiency.ops`` curve of them, so their
#: kernels are timed on the GPU's generic ``memory`` curve (the ``RoPE`` curves time GPT-NeoX's
#: rotary embedding as sampled, against its own bytes).
EAGER_ROPE = {"complex": "RoPE_complex", "rotation": "RoPE_rotation"}
#: Per rotated element of q and k, (forward bytes beyond the 2e of reading and writing it in the
#: model's precision, backward bytes beyond 2e, kernels of each tensor each way), from the code:
#: ``complex`` (torchtitan models/llama/model.py ``apply_rotary_emb``): ``xq.float()`` (read e,
#: write 4), the complex64 multiply by the broadcast ``freqs_cis`` (read 4, write 4),
#: ``type_as`` (read 4, write e); its backward the same three: the cast of the gradient to
#: float32, the multiply by the conjugate, the cast back. ``rotation`` (ibm-fms 0.0.3/0.0.4
#: fms/modules/positions.py ``RotaryEmbedding.adjusted_qk``): ``q.float()`` (read e, write 4),
#: ``freqs.mul(q_.unsqueeze(-2))`` broadcasting each pair against its 2 x 2 float32 matrix (read
#: 4, write 8), ``.sum(5)`` (read 8, write 4), ``type_as`` (read 4, write e); its backward the
#: cast, the multiply of the expanded gradient by the matrices (read 4, write 8), their sum over
#: the pair (read 8, write 4) and the cast back.
_EAGER_ROPE_COSTS = {"complex": (16.0, 16.0, 3), "rotation": (32.0, 32.0, 4)}


def eager_rope(model: ModelSpec, x: LocalShape) -> Op:
    """The rotary embedding of q and k as eager model code runs it (``model.rope_impl``:
    ``_EAGER_ROPE_COSTS``), float32 in between, timed on the memory curve by its own bytes.
    ``rotation`` gathers the float32 matrices of each token's position first (``cached_freqs[
    position_ids]``: 2 x d floats a token, read and written) and the multiplies keep them for the
    backward pass (q's and k's share one tensor); ``complex`` keeps a view of the ``freqs_cis``
    buffer (nothing new)."""
    e, d_rot = x.e, max(1, round(x.d * model.rotary_percent))
    rotated = x.tokens * (x.heads + x.groups) * d_rot
    fwd, bwd, kernels = _EAGER_ROPE_COSTS[model.rope_impl]
    matrices = 4.0 * 2 * d_rot * x.tokens if model.rope_impl == "rotation" else 0.0
    return Op(
        name=EAGER_ROPE[model.rope_impl],
        kind=OpKind.ELEMENTWISE,
        role=f"rotary embedding of q and k (eager, {model.rope_impl}, float32)",
        flops=3.0 * rotated,
        bytes=(fwd + 2.0 * e) * rotated + 2.0 * matrices,
        bwd_flops=6.0 * rotated,
        bwd_bytes=(bwd + 2.0 * e) * rotated,
        saved_bytes=matrices,
        launches=2 * kernels + (1 if matrices else 0),
        memory_kernels=mixes.EAGER_ROPE[model.rope_impl],
        dims=(("l", x.s), ("b", x.b), ("h", x.heads), ("g", x.groups), ("d", x.d), ("d_rot", d_rot)),
    )


def kv_repeat(x: LocalShape) -> Op:
    """K and V repeated from their groups to every query head before the attention kernel
    (``gqa_expand: copy``): forward one copy each, reading the group's heads and writing every
    head (``expand`` then ``reshape``/``flatten``: a clone); backward the expand's gradient, a
    sum over the repeats (reading every head's gradient, writing the group's). It saves nothing:
    the attention kernel keeps the repeated K and V (``attention_core``)."""
    moved = 2.0 * x.e * x.tokens * (x.groups + x.heads) * x.d  # K and V
    return Op(
        name="kv_repeat",
        kind=OpKind.ELEMENTWISE,
        role="K and V repeated to every query head (GQA, eager)",
        flops=0.0,
        bytes=moved,
        bwd_flops=x.tokens * 2.0 * x.heads * x.d,
        bwd_bytes=moved,
        launches=2,
        dims=(("l", x.s), ("b", x.b), ("h", x.heads), ("g", x.groups), ("d", x.d)),
        memory_kernels=mixes.STRIDED_COPY,
    )


def mlp_block_ops(model: ModelSpec, x: LocalShape) -> tuple[Op, ...]:
    """The pre-MLP norm, the dense MLP and its residual add, in execution order."""
    e, tokens, mlp_bias, fp8 = x.e, x.tokens, model.add_bias_mlp, x.fp8_linears
    hidden_norm = x.b * x.s_norm * x.h
    ops: list[Op] = []
    ops.append(norm(model, x, "pre-MLP norm"))
    swiglu = model.activation == "swiglu"
    up_width = x.ffn * (2 if swiglu else 1)
    if model.gate_up_fusion:
        ops.append(
            gemm("linear3", "MLP up projection", tokens, x.h, up_width, e, bias=mlp_bias, saved=e * hidden_norm, fp8=fp8)
        )
    else:
        parts = (("MLP gate projection", x.ffn), ("MLP up projection", x.ffn))
        ops += separate_gemms("linear3", parts, "MLP input gradients summed", tokens, x.h, e,
                              bias=mlp_bias, saved=e * hidden_norm, fp8=fp8)
    if mlp_bias:  # applied by the fused bias-GELU kernel, or by an add of its own
        own = not model.bias_gelu_fusion
        ops.append(_bias("MLP up projection bias", tokens * up_width, up_width, e, own_kernel=own))
    act_in = tokens * up_width
    activation = elementwise(
        "swiglu" if swiglu else "gelu",
        OpKind.ELEMENTWISE,
        "MLP activation",
        tokens * x.ffn,
        e,
        reads=2.0 if swiglu else 1.0,
        flops_per_element=8.0,
        saved=e * act_in,
        dims=(("l", x.s), ("b", x.b), ("ffn", x.ffn)),
    )  # a fused activation (Megatron's jit/compiled bias-GELU or SwiGLU, TE's): its kernels' kind unknown
    if swiglu and not model.swiglu_fusion:
        activation = _eager_swiglu(activation, tokens * x.ffn, e, chunked=model.gate_up_fusion)
    ops.append(activation)
    ops.append(
        gemm(
            "linear4",
            "MLP down projection",
            tokens,
            x.ffn,
            x.h,
            e,
            bias=mlp_bias,
            saved=e * tokens * x.ffn,
            fp8=fp8,
        )
    )
    if mlp_bias:
        ops.append(_bias("MLP output bias", hidden_norm, x.h, e, own_kernel=not model.bias_dropout_fusion))
    if model.hidden_dropout > 0:
        ops.append(_dropout(x, hidden_norm, "MLP output dropout", selective=False))
    ops.append(elementwise("res_add", OpKind.ELEMENTWISE, "residual add", hidden_norm, e, reads=2.0,
                           kernels=mixes.VECTORIZED))
    return tuple(ops)


def _mla_gathers(model: ModelSpec, x: LocalShape, out: list[Collective], halves: int) -> list[Collective]:
    """With sequence parallelism MLA gathers its latents, not the hidden state: the duplicated
    down projections run on the rank's s/tp tokens and the query latent (or, uncompressed, the
    hidden state for the column-parallel query projection) and the key-value latent with the
    shared rotary key are all-gathered for the up projections (Megatron-Core
    ``MLASelfAttention``); the backward pass reduce-scatters their gradients."""
    width = (model.q_lora_rank or x.h) + model.kv_lora_rank + model.qk_pos_emb_head_dim
    latent = x.e * x.tokens * width
    kept = []
    for c in out:
        first = c.kind is CollectiveKind.ALL_GATHER and c.phase is Phase.FWD
        if first or (c.kind is CollectiveKind.REDUCE_SCATTER and c.phase is Phase.BWD_INPUT):
            kept.append(dataclasses.replace(c, name=c.name + "_latent", bytes=latent, count=1))
            if halves > 1:
                kept.append(dataclasses.replace(c, count=halves - 1))
        else:
            kept.append(c)
    return kept


def count_layer_collectives(
    model: ModelSpec, plan: ParallelPlan, x: LocalShape, *, dense_mlp: bool = True
) -> tuple[Collective, ...]:
    """Tensor- and context-parallel communication of one layer (``dense_mlp=False``: of its
    attention alone, as in a MoE layer whose experts communicate over their own groups).

    Without sequence parallelism Megatron's f/g operators all-reduce the [s, b, h] activation
    twice forward and twice backward (GPT-NeoX's parallel residual reduces attention and MLP
    outputs together: once forward). With sequence parallelism each all-reduce becomes a
    reduce-scatter plus an all-gather. Context parallelism passes K and V around a ring.
    """
    out: list[Collective] = []
    if plan.tp > 1:
        size = x.e * x.tokens * x.h
        halves = 2 if dense_mlp else 1
        fwd_reductions = 1 if model.parallel_residual else halves
        if plan.sequence_parallel:
            gathered, gathered_grad = gather_bytes(plan, x, backward=False), gather_bytes(plan, x, backward=True)
            out += [
                Collective("tp_allgather", CollectiveKind.ALL_GATHER, ParallelDim.TP, gathered, Phase.FWD, halves),
                Collective(
                    "tp_reducescatter",
                    CollectiveKind.REDUCE_SCATTER,
                    ParallelDim.TP,
                    size,
                    Phase.FWD,
                    fwd_reductions,
                ),
                Collective(
                    "tp_allgather",
                    CollectiveKind.ALL_GATHER,
                    ParallelDim.TP,
                    gathered_grad,
                    Phase.BWD_INPUT,
                    fwd_reductions,
                ),
                Collective(
                    "tp_reducescatter",
                    CollectiveKind.REDUCE_SCATTER,
                    ParallelDim.TP,
                    size,
                    Phase.BWD_INPUT,
                    halves,
                ),
            ]
            # Megatron's and TE's column-parallel linears gather their saved input shard again
            out += saved_shard_regathers(model, plan, x, halves, gathered)
            if model.multi_latent_attention:
                out = _mla_gathers(model, x, out, halves)
            if x.fp8_linears and x.fp8_recipe in _TP_AMAX_RECIPES and plan.framework is Framework.MEGATRON:
                out += current_amax_reductions(halves)  # Transformer Engine's, before the FP8 all-gather
        else:
            out += [
                Collective(
                    "tp_allreduce", CollectiveKind.ALL_REDUCE, ParallelDim.TP, size, Phase.FWD, fwd_reductions
                ),
                Collective(
                    "tp_allreduce", CollectiveKind.ALL_REDUCE, ParallelDim.TP, size, Phase.BWD_INPUT, halves
                ),
            ]
    if plan.partition_activations and plan.tp > 1 and not plan.sequence_parallel:
        # the checkpointed layer input, kept as 1/tp per rank, is gathered before the recompute
        out.append(
            Collective(
                "tp_allgather_checkpoint",
                CollectiveKind.ALL_GATHER,
                ParallelDim.TP,
                x.e * x.tokens * x.h,
                Phase.BWD_INPUT,
            )
        )
    if plan.cp > 1:
        out += context_parallel_collectives(plan, x)
    return tuple(out)


def context_parallel_collectives(plan: ParallelPlan, x: LocalShape) -> list[Collective]:
    """What context parallelism moves per layer, as ``plan.cp_comm`` runs it (the prediction's
    ``stages.context_comm`` says which of it overlaps attention):

    - p2p (Transformer Engine's ring, torchtitan's alltoall rotation): cp - 1 sends of this
      rank's K/V chunk forward; backward cp - 1 sends of K/V with the previous step's dK/dV, and
      the last dK/dV hop back to its owner (TE's AttnFuncWithCPAndKVP2P, PyTorch's
      _templated_ring_attention_backward);
    - allgather: K/V gathered whole forward and again backward; Transformer Engine
      reduce-scatters dK/dV (AttnFuncWithCPAndKVAllGather), PyTorch rotates them around the
      ring (its dkv rotater is an all-to-all shift, cp hops);
    - a2a (DeepSpeed-Ulysses, TE's AttnFuncWithCPAndQKVOA2A): Q, K, V all-to-all to whole
      sequences of heads / cp, the output back; backward the output gradient in, dQ/dK/dV back.
    """
    cp = plan.cp
    kv = 2.0 * x.e * x.b * x.s * x.groups * x.d  # this rank's K and V chunk
    dim = ParallelDim.CP
    kind = plan.cp_comm
    if kind == "a2a":
        qkv = x.e * x.b * x.s * (x.heads + 2 * x.groups) * x.d  # one rank's whole send buffer
        o = x.e * x.b * x.s * x.heads * x.d
        return [
            Collective("cp_a2a_qkv", CollectiveKind.ALL_TO_ALL, dim, qkv, Phase.FWD),
            Collective("cp_a2a_out", CollectiveKind.ALL_TO_ALL, dim, o, Phase.FWD),
            Collective("cp_a2a_dout", CollectiveKind.ALL_TO_ALL, dim, o, Phase.BWD_INPUT),
            Collective("cp_a2a_dqkv", CollectiveKind.ALL_TO_ALL, dim, qkv, Phase.BWD_INPUT),
        ]
    if kind == "allgather":
        gathered = cp * kv  # nccl-tests' all-gather size: the whole output
        out = [
            Collective("cp_allgather", CollectiveKind.ALL_GATHER, dim, gathered, Phase.FWD),
            Collective("cp_allgather", CollectiveKind.ALL_GATHER, dim, gathered, Phase.BWD_INPUT),
        ]
        if plan.framework is Framework.FSDP:
            out.append(Collective("cp_dkv_ring", CollectiveKind.SEND_RECV, dim, kv, Phase.BWD_INPUT, cp))
        else:
            out.append(Collective("cp_reducescatter", CollectiveKind.REDUCE_SCATTER, dim, gathered, Phase.BWD_INPUT))
        return out
    return [
        Collective("cp_p2p", CollectiveKind.SEND_RECV, dim, kv, Phase.FWD, cp - 1),
        # backward passes K, V and their gradients around the ring
        Collective("cp_p2p", CollectiveKind.SEND_RECV, dim, 2 * kv, Phase.BWD_INPUT, cp - 1),
        Collective("cp_p2p_dkv_last", CollectiveKind.SEND_RECV, dim, kv, Phase.BWD_INPUT),
    ]
