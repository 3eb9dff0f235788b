"""Which kinds of streaming kernel (``MemoryKernel``) each memory-bound operator of the inventory
runs, and the bytes per element each kind moves: the one place these are written down.

PyTorch runs an element-wise operator as its vectorized kernel when every operand is contiguous
and of one type, as its unrolled kernel when they are contiguous but of mixed types (a bf16 ->
fp32 cast), and as its generic strided kernel when an operand is not contiguous (a transposed or
sliced tensor, or one broadcast against the other: a per-row scale, a bias, a rotary table).
Read off our H100 trace (benchmarks/data/gpu/h100-2026-11-27, run2/gpucheck/trace/rank0.json.gz,
a small Llama under autocast, each kernel linked to its aten operator): fp32 -> bf16 casts ran
``vectorized_elementwise_kernel`` (408 calls), bf16 -> fp32 casts ``unrolled_elementwise_kernel``
(216), fp32 + bf16 adds unrolled (64); the eager rotary embedding of the transposed q and k ran
its ``mul`` (320), ``neg`` (128), ``add`` (64) as ``elementwise_kernel`` (strided), SwiGLU on the
chunked halves of the fused gate/up projection its ``silu`` (32), ``silu_backward`` (32) and the
multiplies by the up half strided, and only the multiply of two contiguous gradients (32)
vectorized; layout copies of transposed tensors (``copy_``, 256) strided; same-type contiguous
adds (``add_``, 64 fp32 and 64 bf16) and fills vectorized. The mean of an eager RMSNorm and
the sums of gradients over broadcast dimensions run ``reduce_kernel``.

An operator with no mix here is timed on its per-operator curve where the GPU has one, else on
the GPU's generic ``memory`` curve: its kernels' kind is not known (kernels of their own that
are not PyTorch's element-wise kernels, and none of ours was traced): fused norms, fused
activations (Megatron's jit-compiled bias-GELU and SwiGLU, Transformer Engine's), dropout
(PyTorch's ``fused_dropout_kernel``), cross entropy (``log_softmax`` and ``nll_loss`` kernels),
the optimizer (``multi_tensor_apply_kernel``: our trace's fused AdamW, 48 calls), ``cat``
(``CatArrayBatchedCopy``), Transformer Engine's FP8 casts and transposes, a fused rotary
embedding (``RoPE_fused``), FSDP1's reduction chain, the memory side of GEMMs.
"""

from __future__ import annotations

from paraplan.inventory.ops import KernelMix
from paraplan.specs.enums import MemoryKernel

V, U, S, R = MemoryKernel.VECTORIZED, MemoryKernel.UNROLLED, MemoryKernel.STRIDED, MemoryKernel.REDUCE

#: Contiguous operands of one type (and fp32 -> bf16 casts): residual adds, autograd's sums of
#: gradients, FSDP1's shard casts, eager activations on contiguous inputs, fills.
VECTORIZED = KernelMix("vectorized", ((V, 1.0),),
                       source="same-type contiguous add_/mul, fills and fp32->bf16 casts: vectorized in our H100 trace")
#: One kind alone: a kernel of a trace as ``calibrate.memory_kernels`` samples it.
UNROLLED = KernelMix("unrolled", ((U, 1.0),), source="unrolled_elementwise_kernel")
STRIDED = KernelMix("strided", ((S, 1.0),), source="elementwise_kernel (strided)")

#: A copy from a non-contiguous source (``permute(...).contiguous()``, ``expand(...).reshape``).
STRIDED_COPY = KernelMix("strided_copy", ((S, 1.0),), ((R, 1.0),),
                         source="copy_ of transposed tensors: elementwise_kernel in our H100 trace; the "
                                "gradient of an expand is a sum over the repeats (reduce_kernel)")

#: A bias added by its own kernel (broadcast over the tokens: strided); its gradient a sum over
#: the tokens (reduce).
BIAS_ADD = KernelMix("bias_add", ((S, 1.0),), ((R, 1.0),),
                     source="a broadcast operand makes TensorIterator's operands non-contiguous")

#: Hugging Face's eager RMSNorm (``inventory.layer._eager_rmsnorm``), e = 2 bytes, per element:
#: forward ``x.to(float32)`` (6, unrolled), ``pow(2)`` (8, vectorized), ``mean`` (4, reduce),
#: ``x * rsqrt(var + eps)`` (8, strided: the per-row scale is broadcast), ``.to(bf16)`` (6,
#: vectorized), ``weight * x`` (4, strided: the weight is broadcast): 36 = 28 + 4e. Backward: the
#: weight's multiply (4, strided) and its gradient's product and sum over tokens (4, reduce), the
#: cast back to float32 (6, unrolled), the multiply by the reciprocal (8, strided), the
#: reciprocal's gradient (8, reduce), the square's gradient (8, vectorized), the sum of the two
#: input gradients (12, vectorized) and its cast (6, vectorized): 56 = 44 + 6e.
RMSNORM_EAGER = KernelMix("rmsnorm_eager", ((U, 6.0), (V, 14.0), (R, 4.0), (S, 12.0)),
                          ((U, 6.0), (V, 26.0), (R, 12.0), (S, 12.0)),
                          source="transformers LlamaRMSNorm.forward; kinds as our H100 trace ran casts "
                                 "(bf16->fp32 unrolled, fp32->bf16 vectorized) and broadcast operands")

#: torchtitan's ``apply_rotary_emb`` (``rope_impl: complex``), per rotated element, e = 2:
#: ``xq.float()`` (6, unrolled), the complex multiply by the broadcast ``freqs_cis`` (8, strided),
#: ``type_as`` (6, vectorized); its backward the same three.
ROPE_COMPLEX = KernelMix("rope_complex", ((U, 6.0), (S, 8.0), (V, 6.0)),
                         source="torchtitan models/llama/model.py apply_rotary_emb; kinds as our H100 trace "
                                "ran casts and broadcast multiplies")

#: ibm-fms' ``RotaryEmbedding.adjusted_qk`` (``rope_impl: rotation``), per rotated element:
#: ``q.float()`` (6, unrolled), the multiply by the broadcast 2 x 2 matrices (12, strided), the
#: sum over the pair (12, reduce), ``type_as`` (6, vectorized); its backward the same four.
ROPE_ROTATION = KernelMix("rope_rotation", ((U, 6.0), (S, 12.0), (R, 12.0), (V, 6.0)),
                          source="ibm-fms fms/modules/positions.py RotaryEmbedding.adjusted_qk")

EAGER_ROPE = {"complex": ROPE_COMPLEX, "rotation": ROPE_ROTATION}

#: ``silu(gate) * up`` on the chunked halves of one gate/up projection (Megatron-LM without
#: --swiglu fusion: ``torch.chunk``): forward silu (2 passes) and the multiply (3) strided;
#: backward the up half's gradient (3, strided), the silu output's (3, vectorized: two contiguous
#: tensors) and ``silu_backward`` (3, strided) -- as our H100 trace ran them.
SWIGLU_CHUNKED = KernelMix("swiglu_chunked", ((S, 5.0),), ((S, 6.0), (V, 3.0)),
                           source="our H100 trace: silu, mul, silu_backward strided, one mul vectorized")

#: ``silu(gate) * up`` with gate and up from projections of their own (torchtitan's w1/w3,
#: Hugging Face's gate_proj/up_proj): every operand contiguous.
SWIGLU_SEPARATE = KernelMix("swiglu_separate", ((V, 1.0),),
                            source="contiguous operands of one type: vectorized")

#: Hugging Face's eager ``apply_rotary_pos_emb`` (``q * cos + rotate_half(q) * sin`` on the
#: transposed q and k, the tables broadcast over heads): our H100 trace's rotate is this code,
#: and ran its mul, neg and add strided, both ways.
HF_ROPE = KernelMix("hf_rope", ((S, 1.0),), source="our H100 trace: mul, neg, add of the rotary embedding strided")

#: A traced Hugging Face module's own kernels (``inventory.traced``, ``kernels: eager``) by the
#: end of its module type: the eager RMSNorm's, the rotary embedding's, the attention module's
#: layout copies of its transposed heads (strided), the decoder layer's residual adds, the
#: activation and the MLP's multiply on the contiguous outputs of separate projections.
TRACED_MODULES = (("RMSNorm", RMSNORM_EAGER), ("apply_rotary_pos_emb", HF_ROPE), ("Attention", STRIDED),
                  ("DecoderLayer", VECTORIZED), ("Activation", VECTORIZED), ("MLP", VECTORIZED))


def traced_module_mix(module_type: str) -> KernelMix | None:
    """The kernel mix of a traced module's own memory-bound kernels (``TRACED_MODULES``); None
    where its type is not listed (the GPU's generic memory curve)."""
    return next((mix for end, mix in TRACED_MODULES if module_type.endswith(end)), None)


#: Every mix, by name (names are unique: the cost model caches prices by them).
MIXES = {m.name: m for m in (VECTORIZED, UNROLLED, STRIDED, STRIDED_COPY, BIAS_ADD, RMSNORM_EAGER, ROPE_COMPLEX, ROPE_ROTATION,
                             SWIGLU_CHUNKED, SWIGLU_SEPARATE, HF_ROPE)}
#: The one-kind mix of each kind a trace's kernel is classed as (``calibrate.memory_kernels``).
SINGLE = {V: VECTORIZED, U: UNROLLED, S: STRIDED}
