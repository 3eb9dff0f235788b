"""Sequence-parallel tensor-parallel communication as the frameworks' code runs it, beyond the
four collectives of Korthikanti et al. 2022's f/g operators (``inventory.layer``
``count_layer_collectives`` counts those):

- **the backward re-gather of a column-parallel linear's input.** Megatron-LM keeps the rank's
  sequence shard of the input, not the gathered input, and gathers it again in the backward pass
  for the weight gradient (``megatron/core/tensor_parallel/layers.py``
  ``LinearWithGradAccumulationAndAsyncCommunication.backward``, Megatron-LM core_r0.x to main:
  ``dist_all_gather_func(..., async_op=True)`` issued before ``grad_output.matmul(weight)``,
  "we rely on CUDA_DEVICE_MAX_CONNECTIONS=1 to ensure that the gather is scheduled before the
  input gradient computation", then the grad_input reduce-scatter issued before the weight
  gradient GEMM; Korthikanti et al. 2022 section 4.2.2). Transformer Engine's
  ``LayerNormLinear`` / ``LayerNormMLP`` / ``Linear`` backward does the same with the saved
  ``ln_out`` (``gather_along_first_dim(ln_out, tp_group, async_op=True)`` unless
  ``ub_bulk_dgrad``, in 0.8 through 2.x). Megatron-DeepSpeed's ``mpu`` layers are Megatron's.
  torchtitan's DTensor TP saves the gathered input instead (``inventory.layer``
  ``dtensor_gathered_inputs`` counts it in memory): no re-gather. Multi-latent attention gathers
  its latents outside the linears (``MLASelfAttention``), which then keep the gathered latent:
  only the MLP's first linear re-gathers there.
- **the bytes an FP8 job gathers.** Transformer Engine writes the norm's output in FP8 and
  gathers that (0.8 ``layernorm_linear.py`` ``_LayerNormLinear.forward``: ``layernorm_fwd_fp8``
  then ``gather_along_first_dim(ln_out, ...)``; 1.x ``_apply_normalization(..., fp8_out=fp8 and
  not return_layernorm_output)`` then the gather; 2.x ``gather_along_first_dim(ln_out, tp_group,
  quantizer=input_quantizer)``, a ``Float8Tensor`` gathered as its data), the saved FP8 ``ln_out``
  is what the backward re-gathers, and the row-parallel output gradient is cast before its
  gather (``TransformerEngineBaseModule.grad_output_preprocess``: ``cast_to_fp8`` then
  ``gather_along_first_dim(grad_output_c, ...)``; 2.x the grad-output quantizer with
  ``amax_reduction_group = tp_group`` under current scaling). One byte an element for per-tensor
  delayed and current scaling. Block-scaled recipes (MXFP8, NVFP4) stay at the activation
  precision here, an overestimate: TE 2.x hands them the quantizer too (the backward re-gather
  with ``set_usage(rowwise=False, columnwise=True)``), but their data-plus-scales layout per
  TE version is not read. torchao's float8 tensor parallelism
  (``Float8ColwiseParallel`` / ``PrepareFloat8ModuleInput``, torchtitan's
  ``enable_float8_tensorwise_tp``: tensorwise scaling only) casts the input to float8 before
  ``redistribute`` to ``Replicate()``: the forward gathers one byte; rowwise float8 keeps plain
  ``ColwiseParallel`` (bf16 gathers). Reduce-scatters carry the GEMMs' 16-bit outputs.
"""

from __future__ import annotations

import dataclasses

from paraplan.inventory.ops import Collective, CollectiveKind, ParallelDim
from paraplan.inventory.shapes import LocalShape
from paraplan.specs import FP8Recipe, Framework, ModelSpec, ParallelPlan, Phase

#: the name of a column-parallel linear's backward re-gather of its saved input shard
SAVED_REGATHER = "tp_allgather_saved"
# the per-tensor recipes whose tensor-parallel gathers Transformer Engine runs in FP8
# (``LocalShape.fp8_recipe`` is None for delayed scaling)
_TE_FP8_GATHER = frozenset({None, FP8Recipe.DELAYED, FP8Recipe.CURRENT})


def saves_shard(plan: ParallelPlan) -> bool:
    """Whether the plan's column-parallel linears keep their input's sequence shard and gather it
    again in the backward pass (Megatron-LM's and Megatron-DeepSpeed's layers, Transformer
    Engine's), rather than the gathered input (PyTorch DTensor, torchtitan)."""
    return plan.tp > 1 and plan.sequence_parallel and plan.framework is not Framework.FSDP


def saved_shard_regathers(model: ModelSpec, plan: ParallelPlan, x: LocalShape, halves: int,
                          gathered_bytes: float) -> tuple[Collective, ...]:
    """The backward re-gathers of one layer's column-parallel inputs (QKV's and, with a dense MLP,
    the MLP's first linear's: ``halves``), each the size of its forward all-gather
    ``gathered_bytes``; none where the framework saves the gathered input."""
    count = halves - 1 if model.multi_latent_attention else halves
    if not saves_shard(plan) or count < 1:
        return ()
    return (Collective(SAVED_REGATHER, CollectiveKind.ALL_GATHER, ParallelDim.TP, gathered_bytes, Phase.BWD_INPUT,
                       count),)


def traced_as_run(plan: ParallelPlan, x: LocalShape, traced: tuple[Collective, ...]) -> tuple[Collective, ...]:
    """A traced layer's TP collectives (``inventory.tp_plan.shard_layer``, at the activation
    precision) as the framework runs them, as ``count_layer_collectives`` counts a hand-written
    layer's: the sequence-parallel all-gathers in the bytes ``gather_bytes`` says, and the
    backward re-gathers of the forward ones (one per column-parallel group) where the framework
    keeps the input shard."""
    whole = x.e * x.tokens * x.h

    def sent(c: Collective) -> Collective:
        if c.name != "tp_allgather" or c.kind is not CollectiveKind.ALL_GATHER or not whole:
            return c
        return dataclasses.replace(c, bytes=c.bytes * gather_bytes(plan, x, backward=c.phase is not Phase.FWD) / whole)

    out = tuple(sent(c) for c in traced)
    if not saves_shard(plan):
        return out
    return out + tuple(Collective(SAVED_REGATHER, CollectiveKind.ALL_GATHER, ParallelDim.TP, c.bytes, Phase.BWD_INPUT,
                                  c.count)
                       for c in out if c.name == "tp_allgather" and c.phase is Phase.FWD and c.dim is ParallelDim.TP)


def gather_bytes(plan: ParallelPlan, x: LocalShape, *, backward: bool) -> float:
    """Bytes of one sequence-parallel all-gather of the [s, b, h] activation (or its gradient,
    ``backward``) as the framework sends it: one byte an element where it gathers the FP8 copy
    (module docstring), else the activation precision."""
    elements = x.tokens * x.h
    if not x.fp8_linears:
        return x.e * elements
    if plan.framework is Framework.MEGATRON and x.fp8_recipe in _TE_FP8_GATHER:
        return 1.0 * elements
    if plan.framework is Framework.FSDP and x.fp8_recipe is FP8Recipe.CURRENT and not backward:
        return 1.0 * elements
    return x.e * elements


__all__ = ["SAVED_REGATHER", "gather_bytes", "saved_shard_regathers", "saves_shard", "traced_as_run"]
