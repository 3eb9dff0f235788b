"""What each FP8 recipe (``parallel.fp8_recipe``) costs around an FP8 GEMM, from the bytes its
cast, amax and transpose kernels move: one table, read by the layer's casts
(``inventory.layer.fp8_casts``), the weights' casts (``inventory.job``), the GEMMs' operands and
the memory's FP8 copies (``prediction.memory``).

Per element of a GEMM input or output gradient (``e`` bytes in 16 bits), after the kernels of
each recipe as its implementation runs them:

- ``delayed`` (Transformer Engine ``DelayedScaling``): the scale comes from an amax history of
  past iterations, so one ``cast_transpose`` reads the tensor and writes its FP8 copy and the
  transposed FP8 copy the weight gradient reads, taking the amax on the way (e + 2). A norm
  that feeds the GEMM writes the FP8 input itself (TE's LayerNormLinear), leaving the transpose
  (1 + 1). Each FP8 tensor keeps an amax history of ``amax_history_len`` = 1024 fp32 values
  (TE's default; NeMo's ``fp8_amax_history_len`` 1024); the history update after each step is
  one multi-tensor kernel over these KiB (``nvte_delayed_scaling_recipe_amax_and_scale_update_
  after_reduction``) and is not timed.
- ``current`` (TE ``Float8CurrentScaling``, Megatron-LM ``--fp8-recipe tensorwise``, torchao's
  ``tensorwise``): the tensor's own amax is reduced before the cast can scale it, a read of its
  own (torchao ``roofline_utils``, tensorwise: kernel 1 reads the tensor for max_abs, kernel 3
  reads it again and writes it twice in FP8), so 2e + 2, and no norm writes the FP8 input for
  it (the amax is not known until the norm's output is complete).
- ``rowwise`` (torchao ``rowwise``): one scale per row for the forward operand and per column
  for the weight gradient's, which a transposed FP8 copy cannot give: kernel 1 reads the tensor
  and writes its row-scaled FP8 copy and a 16-bit transpose, kernel 2 reads the transpose and
  writes the column-scaled FP8 copy (3e + 2, torchao ``roofline_utils``). torchao keeps the
  16-bit input for the backward.
- ``mxfp8`` (TE ``MXFP8BlockScaling``; TE user guide, MXFP8: one E8M0 scale per 32 consecutive
  values, rowwise and columnwise blocks): one kernel reads the tensor and writes both block-
  scaled copies with their scales (e + 2 + 2/32; torchao ``roofline_utils``' mxfp8 input
  kernel), the amax of each block taken in the same kernel; the GEMM reads one scale byte per
  32 operand elements besides them (torchao ``get_individual_gemm_time_sympy``: ``num_reads +
  num_reads // block_size``).

- ``nvfp4`` (TE ``NVFP4BlockScaling``, TE 2.8+; NVIDIA, "Pretraining Large Language Models with
  NVFP4", arXiv 2509.25149): E2M1 values (half a byte) with one E4M3 scale byte per 16 values
  and one FP32 scale per tensor, so each copy is 0.5 + 1/16 bytes per value. All three GEMMs
  (fprop, dgrad, wgrad) read NVFP4 operands (the paper's Figure 5: Fprop, Dgrad and Wgrad
  "consume FP4 tensors as inputs") on the FP4 tensor cores (``Op.fp4``). TE's
  ``NVFP4Quantizer::quantize`` runs three kernels on an activation or output gradient: the
  per-tensor amaxes (``nvte_hadamard_transform_amax``: the tensor's and its Hadamard
  transform's, one read), the rowwise 1x16 cast (``nvte_quantize_v2``: read e, write 0.5 +
  1/16) and the columnwise cast of the weight gradient's operand through a random 16x16
  Hadamard transform (``nvte_hadamard_transform_cast_fusion_columnwise``: read e, write 0.5 +
  1/16), so 3e + 1.125, no norm writing it (the amax comes first). The transform is applied
  to the weight-gradient GEMM's inputs only (paper section 4.2; TE ``fp4_quant_fwd_inp`` and
  ``fp4_quant_bwd_grad`` with ``random_hadamard_transform``), as a 16x16 matrix product per
  16 values on the tensor cores (TE ``hadamard_transform.cu``, WMMA bf16 fragments): 2 x 16
  FLOPs per element of those copies, inside the memory-bound cast. Gradients are cast with
  stochastic rounding (``fp4_quant_bwd_grad`` ``stochastic_rounding``; Philox state per cast),
  which draws its random bits in the cast kernel and moves no bytes of its own. Weights use
  2D 16x16 blocks (``fp4_quant_fwd_weight`` ``fp4_2d_quantization``), no transform and no
  stochastic rounding: an amax read, then one cast writing both copies (2e + 1.125); the GEMM
  reads its 1x16 scale layout either way. The saved input of the weight gradient is its
  NVFP4 copy (0.5 + 1/16 bytes per element). The paper keeps some linear layers (about 15 %,
  mostly the last blocks) in BF16; paraplan's layers are uniform, so every linear layer of an
  nvfp4 job runs NVFP4 here (the BF16 layers are not modelled).

The weights are cast once per iteration (TE keeps them for the later micro-batches,
``is_first_microbatch``; torchao's rowwise casts them again in every micro-batch): delayed e + 2 per parameter, current 2e + 2 (the amax, then the cast
and transpose), rowwise 4e + 2 (torchao's weight: cast rows e + 1, transpose 2e, cast columns
e + 1), mxfp8 e + 2 + 2/32, nvfp4 2e + 1.125. The FP8 copies kept for the iteration take 2 bytes per parameter
(copy and transpose), mxfp8 2 + 2/32 with the scales, nvfp4 1.125 (two NVFP4 copies with their
E4M3 scales); torchao's rowwise casts the weight per use
and keeps none.

Sources: Transformer Engine user guide (API ``transformer_engine.common.recipe``: DelayedScaling
amax_history_len=1024, Float8CurrentScaling, MXFP8BlockScaling; low-precision training: MXFP8),
pytorch/ao ``torchao/testing/float8/roofline_utils.py`` (``get_tensor_memory_traffic_ovhd_s``:
the kernels of tensorwise, rowwise and mxfp8 casts, per tensor role). GEMM throughput: every
recipe's GEMMs take the GPU's FP8 curve; no public table times rowwise- or block-scaled GEMMs
(XLA's sm_100 table has per-tensor FP8 rows only), so their kernels are assumed as fast as the
per-tensor ones at the same FP8 datasheet peak, uncalibrated. NVFP4 GEMMs take the GPU's
``peak_flops.fp4`` and its ``precisions.fp4`` curve: no public table times FP4 GEMMs (XLA's
matmul table has no FP4 rows), so that curve is the B200's FP8 curve as a fraction of the FP4
peak, marked transferred (every nvfp4 prediction says so).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from paraplan.inventory.ops import Collective, CollectiveKind, Op, OpKind, ParallelDim
from paraplan.specs import FP8Recipe, ModelSpec, ParallelPlan, Phase

# one E8M0 scale byte per block of 32 elements (MXFP8), per copy
_MX_SCALE = 1.0 / 32.0
# one NVFP4 copy: an E2M1 value (half a byte) and one E4M3 scale byte per 16 values
NVFP4_COPY = 0.5 + 1.0 / 16.0
# FLOPs per element of a random Hadamard transform on 16-value blocks (a 16x16 matrix product)
RHT_FLOPS = 2.0 * 16.0
AMAX_HISTORY_LEN = 1024  # Transformer Engine DelayedScaling's default amax_history_len
# amax histories per FP8 GEMM: TE's forward meta keeps input, weight and output, the backward's
# grad_output and grad_input (fp8_meta["scaling_fwd"] 3 per GEMM, ["scaling_bwd"] 2)
_HISTORIES_PER_GEMM = 5


@dataclass(frozen=True, slots=True)
class RecipeCosts:
    """Per element, in units of ``e`` (16-bit bytes read) plus bytes written: a cast of a GEMM
    input or output gradient moves ``act_reads * e + act_writes``; a norm-fed input moves
    ``norm_fed`` bytes (None: as any other input); a weight moves ``weight_reads * e +
    weight_writes`` once per iteration."""

    act_reads: float
    act_writes: float
    norm_fed: float | None
    weight_reads: float
    weight_writes: float
    operand_bytes: float  # bytes a GEMM reads per FP8 operand element (with its block scales)
    copy_bytes: float  # bytes per parameter of the FP8 weight copies kept through the iteration
    saves_fp8_input: bool  # the weight gradient's input is kept in FP8 (else in 16 bits)
    amax_history: int  # fp32 amax values kept per FP8 tensor
    weights_cached: bool = True  # the weights are cast once per iteration (else by every micro-batch)
    fp4_gemms: bool = False  # the GEMMs read NVFP4 operands on the FP4 tensor cores
    saved_per_element: float = 1.0  # bytes per element of a saved FP8/FP4 input
    rht_flops: float = 0.0  # FLOPs per element of the weight gradient's operands (Hadamard transform)


RECIPES: dict[FP8Recipe, RecipeCosts] = {
    FP8Recipe.DELAYED: RecipeCosts(1.0, 2.0, 2.0, 1.0, 2.0, 1.0, 2.0, True, AMAX_HISTORY_LEN),
    FP8Recipe.CURRENT: RecipeCosts(2.0, 2.0, None, 2.0, 2.0, 1.0, 2.0, True, 0),
    FP8Recipe.ROWWISE: RecipeCosts(3.0, 2.0, None, 4.0, 2.0, 1.0, 0.0, False, 0, weights_cached=False),
    FP8Recipe.MXFP8: RecipeCosts(1.0, 2.0 + 2 * _MX_SCALE, None, 1.0, 2.0 + 2 * _MX_SCALE, 1.0 + _MX_SCALE,
                                 2.0 + 2 * _MX_SCALE, True, 0),
    FP8Recipe.NVFP4: RecipeCosts(3.0, 2 * NVFP4_COPY, None, 2.0, 2 * NVFP4_COPY, NVFP4_COPY, 2 * NVFP4_COPY, True, 0,
                                 fp4_gemms=True, saved_per_element=NVFP4_COPY, rht_flops=RHT_FLOPS),
}


def recipe_costs(recipe: FP8Recipe | None) -> RecipeCosts:
    """The costs of ``recipe`` (None: delayed, the default); a ValueError for one not modelled."""
    key = recipe or FP8Recipe.DELAYED
    try:
        return RECIPES[key]
    except KeyError:
        raise ValueError(f"parallel.fp8_recipe: {key.value} is not modelled yet") from None


def amax_history_bytes(fp8_gemms: int, recipe: FP8Recipe | None) -> float:
    """Bytes of the amax histories of ``fp8_gemms`` FP8 GEMMs (delayed scaling only)."""
    return 4.0 * recipe_costs(recipe).amax_history * _HISTORIES_PER_GEMM * fp8_gemms


# the linear GEMMs of a dense transformer layer Transformer Engine runs in FP8 (QKV, output
# projection, the MLP's two), whose amaxes an autocast region's reduction carries; a MoE layer's
# experts carry more, which leaves the call's time alone (a few hundred bytes: latency-bound)
_FP8_GEMMS_PER_LAYER = 4
# fp32 amaxes per FP8 GEMM in the forward's reduction (input, weight, output) and the backward's
# (output gradient, input gradient): TE's fp8_meta["scaling_fwd"] and ["scaling_bwd"]
_AMAXES_FWD, _AMAXES_BWD = 3, 2
#: the name of the amax all-reduces (``amax_reductions``; the TE 0.x one over tp adds "_tp")
AMAX_REDUCTION = "fp8_amax_allreduce"


def is_amax_reduction(coll: Collective) -> bool:
    """Whether ``coll`` is one of ``amax_reductions``' all-reduces (the plan screen times them
    per model chunk, apart from a stage's other end collectives)."""
    return coll.name.startswith(AMAX_REDUCTION)


def amax_reductions(model: ModelSpec, plan: ParallelPlan, recipe: FP8Recipe | None) -> tuple[Collective, ...]:
    """The all-reduces of DelayedScaling's amaxes one stage makes per micro-batch
    (``parallel.fp8_amax_reduce``), from Transformer Engine's code as Megatron and NeMo call it.

    Megatron-Core's TransformerBlock.forward and NeMo's ParallelTransformer.forward (2023) wrap
    their layers in one ``fp8_autocast(fp8_group=parallel_state.get_amax_reduction_group())``,
    so a stage runs one autocast region per model chunk (vpp of them) per micro-batch. At the
    region's exit TE concatenates the amaxes of its modules into one buffer and max-all-reduces
    it over ``fp8_group`` (TE 0.x ``fp8_autocast``'s finally: ``_amax_forward_global_reduce_
    func()`` -> ``global_amax_reduction``; TE 1.x ``FP8GlobalStateManager.fp8_autocast_exit``
    -> ``reduce_and_update_fp8_tensors(forward=True)``); the region's backward does the same at
    the end of its first module's backward (TE 0.x ``post_backward`` / ``_prepare_backward``'s
    exit when ``fp8_meta["first_module"]``). The call is ``torch.distributed.all_reduce(...,
    async_op=False)``: the compute stream waits for it, so it is exposed. The group is the
    stage's tp x cp x dp ranks (Megatron-LM / apex ``parallel_state``: ``amax_group_size =
    tensor_model_parallel_size * data_parallel_size`` consecutive ranks). TE 0.x reduces the
    buffer a second time over the tp group under sequence parallelism (``global_amax_reduction
    (fp8_meta, reduce_amax_across_tp_group=self.sequence_parallel, tp_group)``):
    ``tp_dp_then_tp``. A buffer of a few hundred bytes (3 fp32 amaxes per FP8 GEMM forward, 2
    backward): the cost model prices it as a small call (``estimate_collective_s``). Not counted:
    the cat/split and amax-and-scale update kernels around it, a recomputed forward's region
    (TE skips the reduction in its recompute phase), the ranks' skew the all-reduce waits out."""
    if plan.fp8_amax_reduce == "none" or (recipe or FP8Recipe.DELAYED) is not FP8Recipe.DELAYED:
        return ()
    regions = plan.vpp
    layers = -(-model.num_layers // (plan.pp * regions))
    gemms = _FP8_GEMMS_PER_LAYER * layers
    out = [Collective(AMAX_REDUCTION, CollectiveKind.ALL_REDUCE, ParallelDim.TP_DP, 4.0 * _AMAXES_FWD * gemms,
                      Phase.FWD, regions),
           Collective(AMAX_REDUCTION, CollectiveKind.ALL_REDUCE, ParallelDim.TP_DP, 4.0 * _AMAXES_BWD * gemms,
                      Phase.BWD_INPUT, regions)]
    if plan.fp8_amax_reduce == "tp_dp_then_tp" and plan.sequence_parallel and plan.tp > 1:
        out += [dataclasses.replace(c, name=f"{AMAX_REDUCTION}_tp", dim=ParallelDim.TP) for c in out]
    return tuple(out)


# Transformer Engine 0.x's FP8 modules in one transformer layer as NeMo 1.17 (MLPerf v3.0 GPT-3,
# transformer_engine: True) builds it: AutocastTransformerLayer is TE's TransformerLayer, whose
# LayerNormLinear (QKV), Linear (projection) and LayerNormMLP (fc1 and fc2) keep each their own
# fp8_meta; DotProductAttention keeps none
TE0_MODULES_PER_LAYER = 3
# fp32 amax-history columns per FP8 GEMM in TE 0.x's set_meta_tensor: forward input and weight
# ("num_gemms * 2"), backward output gradient ("num_gemms")
_TE0_TENSORS_FWD, _TE0_TENSORS_BWD = 2, 1
# amax_and_scale_update's kernels per module and direction, the default recipe (amax_compute_algo
# "max", no scaling_factor_compute_algo): torch.max over the history's rows, torch.roll of the
# whole history, the fill_ of its new row, and _default_sf_compute's elementwise chain (one
# TorchScript-fused kernel)
_TE0_UPDATE_KERNELS = 4


def te0_meta_kernels(plan: ParallelPlan) -> int:
    """Kernels one Transformer Engine 0.x FP8 module runs per micro-batch in its forward and,
    as many, in its backward to update its DelayedScaling state (``parallel.te_fp8_bookkeeping:
    te0``); 0 when not priced.

    From TE's code before FP8GlobalStateManager (transformer_engine/pytorch/fp8.py and the
    module base's pre_forward / pre_backward, the structure release_v0.8 ships; the nearest
    commit read: module.py 008f399): each module's forward (``pre_forward``, after the
    previous iteration set ``update_amax_and_scale_fwd``) and backward (``pre_backward``) run
    ``copy_amax_from_global_buffer`` (``amax_history[0] = reduced buffer slice``: one copy
    kernel, only when ``reduce_amax``) and ``amax_and_scale_update`` -> the TorchScript
    ``fused_amax_and_scale_update``: ``_default_get_amax`` (``torch.max(amax_history,
    dim=0)``, ``update_amax_history``: ``torch.roll(amax_history, -1, 0)`` and
    ``amax_history[0].fill_(0.0)``) and ``_default_sf_compute`` (floor, log2, pow, round and
    three wheres, fused). ``add_amax_to_global_buffer`` appends a view (no kernel); the
    region's ``torch.cat`` before its all-reduce and the split after it (views) are per model
    chunk, not per layer, and not timed here (one kernel per region and direction)."""
    if plan.te_fp8_bookkeeping != "te0" or (plan.fp8_recipe or FP8Recipe.DELAYED) is not FP8Recipe.DELAYED:
        return 0
    return _TE0_UPDATE_KERNELS + (plan.fp8_amax_reduce != "none")


def te0_meta_update(kernels: int, history: int = AMAX_HISTORY_LEN, gemms: int = _FP8_GEMMS_PER_LAYER) -> Op:
    """The FP8 bookkeeping of one transformer layer's Transformer Engine 0.x modules per
    micro-batch (``te0_meta_kernels``: ``kernels`` per module and direction), as small memory-
    bound kernels on the compute stream: each of ``TE0_MODULES_PER_LAYER`` modules' forward
    and backward launches ``kernels``, each kernel priced by the cost model's launch floor (the
    memory curve's ``half_work`` plus the GPU's ``kernel_overhead_s``) and its bytes. Bytes of
    a module's history of ``n`` columns and ``history`` rows (fp32): the max reads it (L n),
    the roll reads and writes it (2 L n), the fill writes a row (n), the scale update reads
    amax and scale and writes the scale (3 n), the copy reads and writes a row (2 n). TE's
    recompute phase swaps stashed tensors instead (``get_old_fp8_meta_tensors_for_recompute``):
    not recomputable. ``history``: ``amax_history_len`` (MLPerf GPT-3's FP8_AMAX_HISTORY=1024,
    mlcommons/training_results_v3.1 NVIDIA gpt3 config_fp8.sh; v3.0's own copy is not stored)."""
    copy = kernels > _TE0_UPDATE_KERNELS

    def traffic(columns: int) -> float:
        return 4.0 * columns * (3 * history + 4 + (2 if copy else 0))

    return Op(
        name="fp8_meta_update",
        kind=OpKind.ELEMENTWISE,
        role="Transformer Engine 0.x amax history and scale updates of the layer's FP8 modules",
        flops=0.0,
        bytes=traffic(_TE0_TENSORS_FWD * gemms),
        bwd_flops=0.0,
        bwd_bytes=traffic(_TE0_TENSORS_BWD * gemms),
        recomputable=False,
        launches=TE0_MODULES_PER_LAYER * kernels,
        dims=(("modules", TE0_MODULES_PER_LAYER), ("history", history)),
    )


def current_amax_reductions(halves: int) -> tuple[Collective, ...]:
    """The per-tensor amax all-reduces a sequence-parallel layer makes under Transformer Engine
    2.x's current scaling (``current``, Megatron-LM ``--fp8-recipe tensorwise``) and NVFP4: a
    column-parallel linear's input is quantized before its all-gather, so its amax is first
    max-all-reduced over the tp group (``Linear._customize_quantizers_float8_current_scaling``
    and ``_customize_quantizers_nvfp4``: ``sequence_parallel and parallel_mode == "column"`` ->
    the input quantizer's ``with_amax_reduction = True``, ``amax_reduction_group = tp_group``),
    and a row-parallel linear's output gradient likewise in the backward (``parallel_mode ==
    "row"`` -> the grad-output quantizer's). One fp32 each, inside the quantization (the amax
    kernel, the all-reduce, then the cast), on the compute stream. ``halves``: the layer's
    column-parallel inputs (QKV and the MLP's first linear; 1 for a MoE layer's attention
    alone), the same number of row-parallel outputs."""
    return (Collective(f"{AMAX_REDUCTION}_current", CollectiveKind.ALL_REDUCE, ParallelDim.TP, 4.0, Phase.FWD, halves),
            Collective(f"{AMAX_REDUCTION}_current", CollectiveKind.ALL_REDUCE, ParallelDim.TP, 4.0, Phase.BWD_INPUT,
                       halves))


__all__ = ["AMAX_HISTORY_LEN", "AMAX_REDUCTION", "NVFP4_COPY", "RECIPES", "RHT_FLOPS", "TE0_MODULES_PER_LAYER",
           "RecipeCosts", "amax_history_bytes", "amax_reductions", "current_amax_reductions",
           "is_amax_reduction", "recipe_costs", "te0_meta_kernels", "te0_meta_update"]
