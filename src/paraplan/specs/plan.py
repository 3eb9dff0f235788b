"""How a job is parallelised: degrees, batch sizes, ZeRO stage, recompute, schedule."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from paraplan.specs._types import Bool, Float, Int
from paraplan.specs.enums import AttentionKernel, FP8Recipe, Framework, Recompute, Schedule
from paraplan.specs.errors import short_repr
from paraplan.specs.pipeline_layout import SPLIT_FIELDS, check_layout

# Megatron-Core's --recompute-modules (TransformerConfig.recompute_modules): core_attn (the
# default), mlp, moe, shared_experts re-run under normal checkpointing; moe_act, layernorm and
# mla_up_proj discard their outputs and re-run them in the backward pass
RecomputeModule = Literal["core_attn", "mlp", "moe", "moe_act", "layernorm", "mla_up_proj", "shared_experts"]

# The recompute policies each framework offers (its own names in ``inventory.recompute``).
RECOMPUTE_CHOICES = {
    Framework.MEGATRON: (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL),
    Framework.DEEPSPEED: (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL),
    Framework.FSDP: (Recompute.NONE, Recompute.FULL, Recompute.LAYER, Recompute.OP),
}


# Which frameworks run the zero-bubble schedules (a missing one is refused with its reason).
# torchtitan: ``parallelism.pipeline_parallel_schedule`` ZBVZeroBubble / InterleavedZeroBubble
# (torch.distributed.pipelining); Megatron-LM mainline and DeepSpeed's pipeline engine have none.
ZERO_BUBBLE_FRAMEWORKS = {
    Framework.MEGATRON: "Megatron-LM has no zero-bubble schedule (Sea AI Lab's fork "
    "sail-sg/zero-bubble-pipeline-parallelism adds them)",
    Framework.DEEPSPEED: "DeepSpeed's pipeline engine runs its lock-step 1F1B TrainSchedule "
    "(Megatron-DeepSpeed's --enable-zbh1-pipeline is not modelled)",
}


# The one rule on how layers split over pipeline stages, read by the Job validator and by the
# search. Megatron-LM's validate_args (megatron/training/arguments.py) asserts "Number of layers
# should be divisible by the pipeline-model-parallel size" unless --decoder-first-pipeline-num-layers
# / --decoder-last-pipeline-num-layers (or --pipeline-model-parallel-layout) give the split: a
# Megatron-LM job with pp not dividing num_layers states its split (parallel.layers_per_stage,
# which the export writes as those flags). DeepSpeed's PipelineModule (ds_utils.partition_uniform)
# and torchtitan's pipeline split (generate_llm_fqn_per_model_part) give the first stages one more
# layer by themselves.
PP_LAYERS_REASON = "pp does not divide the layers and Megatron-LM needs the split given (--uneven-layers)"


def pp_layers_problem(num_layers: int, pp: int, framework: Framework, split_given: bool = False) -> str | None:
    """Why ``num_layers`` cannot be split over ``pp`` stages under ``framework``; None when it can."""
    if split_given or pp == 1 or num_layers % pp == 0 or framework is not Framework.MEGATRON:
        return None
    base, extra = divmod(num_layers, pp)
    example = [base + 1] * extra + [base] * (pp - extra)
    return (
        f"parallel.pp: Megatron-LM needs num_layers={num_layers} divisible by pp={pp} unless the split is "
        f"given: set parallel.layers_per_stage (e.g. {example}; exported as --decoder-first/last-pipeline-"
        "num-layers or --pipeline-model-parallel-layout), or framework deepspeed | fsdp, which split unevenly"
    )


def _check_zero_bubble(plan: ParallelPlan) -> None:
    """The zero-bubble schedules need a pipeline and a framework that runs them."""
    if not plan.schedule.splits_backward:
        return
    name = plan.schedule.value
    if plan.pp < 2:
        raise ValueError(f"parallel.schedule: {name!r} is a pipeline schedule; it needs pipeline_model_parallel_size >= 2")
    reason = ZERO_BUBBLE_FRAMEWORKS.get(plan.framework)
    if reason is not None:
        raise ValueError(f"parallel.schedule: {name!r} needs framework 'fsdp' (torchtitan); {reason}")


def _check_dispatcher(plan: ParallelPlan) -> None:
    """Megatron-Core's dispatcher rules (TransformerConfig.__post_init__): a flex backend only
    with the flex dispatcher; the shared-expert overlap not with allgather (alltoall, and flex
    in recent versions: "only works with alltoall or flex token dispatcher")."""
    if plan.moe_flex_dispatcher_backend is not None and plan.moe_token_dispatcher_type != "flex":
        raise ValueError(
            f"parallel.moe_flex_dispatcher_backend: {plan.moe_flex_dispatcher_backend!r} is a backend of the "
            f"flex dispatcher; set moe_token_dispatcher_type: flex (not {plan.moe_token_dispatcher_type or 'unset'})"
        )
    if plan.moe_shared_expert_overlap and plan.moe_token_dispatcher_type == "allgather":
        raise ValueError(
            "parallel.moe_shared_expert_overlap: Megatron-Core overlaps the shared experts with the "
            "alltoall or flex dispatcher, not 'allgather'"
        )


class ParallelPlan(BaseModel):
    """Megatron-LM argument names, with the short aliases tp, pp, dp, cp and vpp."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    tensor_model_parallel_size: Int = Field(
        default=1, ge=1, validation_alias=AliasChoices("tensor_model_parallel_size", "tp")
    )
    pipeline_model_parallel_size: Int = Field(
        default=1, ge=1, validation_alias=AliasChoices("pipeline_model_parallel_size", "pp")
    )
    data_parallel_size: Int | None = Field(
        default=None, ge=1, validation_alias=AliasChoices("data_parallel_size", "dp")
    )
    context_parallel_size: Int = Field(
        default=1, ge=1, validation_alias=AliasChoices("context_parallel_size", "cp")
    )
    sequence_parallel: Bool = False
    virtual_pipeline_model_parallel_size: Int | None = Field(
        default=None,
        ge=1,
        validation_alias=AliasChoices("virtual_pipeline_model_parallel_size", "vpp"),
    )
    zero_stage: Int = Field(default=0, ge=0, le=3)
    micro_batch_size: Int = Field(default=1, ge=1)
    global_batch_size: Int | None = Field(default=None, ge=1)
    recompute: Recompute = Recompute.NONE
    # Megatron-LM's --recompute-method and --recompute-num-layers (with recompute: full)
    recompute_method: Literal["uniform", "block"] | None = None
    recompute_num_layers: Int | None = Field(default=None, ge=1)
    # torchtitan's selective_ac_option N / fms-fsdp's every n-th block (with recompute: layer)
    recompute_every: Int | None = Field(default=None, ge=1)
    schedule: Schedule = Schedule.ONE_F_ONE_B
    layers_per_stage: tuple[Int, ...] | None = None
    framework: Framework = Framework.MEGATRON
    overlap_grad_reduce: Bool | None = None
    scatter_gather_p2p: Bool | None = None
    pipeline_mask: Bool | None = None
    # DeepSpeed activation checkpointing's partition_activations (Megatron-DeepSpeed
    # --partition-activations): each TP rank keeps 1/tp of a checkpointed layer input and the
    # backward pass all-gathers it before recomputing the layer.
    partition_activations: Bool = False
    gradient_accumulation_fusion: Bool | None = None
    # Megatron-Core's fused vocab-parallel cross entropy (--cross-entropy-loss-fusion,
    # TransformerConfig.cross_entropy_loss_fusion with cross_entropy_fusion_impl 'native'; off
    # in Megatron-LM, on in Megatron-Bridge's GPTModelProvider): its torch.compile'd kernels
    # hold one more fp32 copy of the logits (``prediction.framework_memory.loss_logits_bytes``)
    cross_entropy_loss_fusion: Bool | None = None
    # torchtitan's torch.compile of the loss (framework fsdp: compile.enable with "loss" in
    # compile.components, their default since torchtitan PR #1608, August 2025; with
    # training.compile from PR #1033, April 2025): Inductor's cross entropy keeps no fp32 copy
    # of the logits (``prediction.framework_memory.loss_logits_bytes``)
    compile_loss: Bool | None = None
    # whether torch.distributed.pipelining keeps every micro-batch's stage output, the last
    # stage's logits included, until the step ends (framework fsdp with pp > 1, torchtitan;
    # ``prediction.framework_memory.torch_pipeline_buffers``): the torch of 2024-25 did
    # (PyTorch issue #128910); newer torch keeps them only with ``step(return_outputs=True)``
    # (``forward_one_chunk(..., save_forward_output=return_outputs)``) and today's torchtitan
    # trainer calls ``step(..., return_outputs=False)``. None: the framework's default, False
    pipeline_keeps_outputs: Bool | None = None
    # whether the trainer frees the gradients between steps (``optimizer.zero_grad()`` with
    # ``set_to_none=True``, torch.optim's default since PyTorch 2.0, pytorch/pytorch#92731):
    # they are allocated again in each backward pass and do not exist at a single micro-batch's
    # forward/loss peak (``prediction.memory.step_peak_bytes``). Megatron's DDP keeps a contiguous
    # gradient buffer (``zero_grad_buffer`` zeroes it in place) and cannot. None: the engine's
    # default (``ParallelPlan.frees_gradients``: fsdp True, megatron and deepspeed False)
    grads_set_to_none: Bool | None = None
    # torchtitan's ChunkedLossWrapper (framework fsdp; torchtitan 0.3.0 components/loss.py, the
    # loss of its llama3 recipes (models/llama3/config_registry.py) and of the recipe paraplan
    # exports, num_chunks 8 by default): the LM head and the loss run on 1/n of the
    # tokens at a time, each chunk's backward at once, so one chunk's logits and loss copies
    # are alive, beside an fp32 gradient accumulator and the hidden states' chunk copies
    # (``inventory.ends.chunked_loss``, ``prediction.framework_memory.loss_logits_bytes``).
    # None or 1: the whole logits (torchtitan 0.1 and the published runs)
    loss_chunks: Int | None = Field(default=None, ge=1)
    deepspeed_train_schedule: Bool | None = None
    # gradients accumulated and reduced in fp32 (Megatron-LM's
    # --accumulate-allreduce-grads-in-fp32, FSDP's reduce_dtype=float32); default: megatron
    # and fsdp (torchtitan) yes for bf16 and fp8 training, deepspeed no
    grad_reduce_in_fp32: Bool | None = None
    # how an FP8 job scales its tensors (Megatron-LM --fp8-recipe, torchtitan float8.recipe_name):
    # delayed | current (tensorwise) | rowwise | mxfp8 | nvfp4; None: delayed (Transformer
    # Engine's DelayedScaling, Megatron-LM's default); only with precision fp8
    fp8_recipe: FP8Recipe | None = None
    # Transformer Engine DelayedScaling's amax reduction (``reduce_amax``, on by default) as the
    # framework's fp8_autocast runs it: at the exit of every autocast region (one per model
    # chunk per micro-batch: Megatron-Core's and NeMo's transformer forward) the region's amaxes
    # are max-all-reduced over ``fp8_group`` (Megatron/apex ``get_amax_reduction_group``: the
    # stage's tp x cp x dp ranks), and again at the end of its backward; the compute stream
    # waits for each (``async_op=False``). "tp_dp": that one all-reduce each time (TE 1.x);
    # "tp_dp_then_tp": a second one over the tp group under sequence parallelism (TE 0.x's
    # ``global_amax_reduction(..., reduce_amax_across_tp_group=sequence_parallel)``); "none":
    # not reduced (or not priced). Only with the delayed recipe (``inventory.fp8.amax_reductions``)
    fp8_amax_reduce: Literal["none", "tp_dp", "tp_dp_then_tp"] = "none"
    # Transformer Engine's per-module FP8 bookkeeping kernels as the framework's TE version runs
    # them (``inventory.fp8.te0_meta_update``): "te0": TE 0.x (release_v0.8, NeMo MLPerf v3.0),
    # whose every FP8 module updates its amax history and scales in its forward and backward of
    # every micro-batch (small kernels on the compute stream); "none": not priced (TE >= 1.x
    # updates every history of an autocast region at its reduction, FP8GlobalStateManager.
    # reduce_and_update_fp8_tensors: torch.cat, the all-reduce, then one multi-tensor
    # tex.fused_amax_and_scale_update_after_reduction: two kernels per region, not timed). Only
    # with the delayed recipe
    te_fp8_bookkeeping: Literal["none", "te0"] = "none"
    # Each kernel on the compute stream also waits the GPU's idle gap between back-to-back
    # queued kernels (``efficiency.queued_gap``: 1.41 us median on our H100 trace, 1.15 us on
    # an A100 one). Off: every trace that shows it ran under CUPTI, whose per-kernel timestamps
    # may make part of it, and none was timed without a profiler (docs/validation.md)
    queued_kernel_gap: Bool = False
    # Megatron-LM --tp-comm-overlap (Transformer Engine userbuffers, NeMo tp_comm_overlap):
    # the sequence-parallel all-gathers / reduce-scatters pipelined with the layer's GEMMs
    tp_comm_overlap: Bool = False
    # which GEMM overlaps which collective by which method under tp_comm_overlap: a Transformer
    # Engine userbuffers configuration of the catalog (``catalog/userbuffers``, Megatron-LM's
    # --tp-comm-overlap-cfg, NeMo's ub_tp_comm_overlap_cfg), priced from its methods and SMs
    # (``prediction.userbuffers``); None: the chunked overlap with the GPU's measured fused-kernel
    # floor (``prediction.stages.tp_overlapped``); unused without tp_comm_overlap
    tp_comm_overlap_cfg: str | None = None
    # PyTorch's asynchronous tensor parallelism (torchtitan's enable_async_tensor_parallel, under
    # torch.compile; framework fsdp): inductor's micro-pipeline pass fuses the sequence-parallel
    # all-gathers feeding matmuls and the reduce-scatters of a matmul's output with them
    # (torch.ops.symm_mem.fused_all_gather_matmul, fused_matmul_reduce_scatter), which run in tp
    # steps of 1/tp of the rows beside peer-to-peer copies over NVLink; the backward's
    # reduce-scatter of summed input gradients stays NCCL's (``prediction.async_tp``); no effect
    # with tp 1 or without sequence parallelism (nothing to fuse)
    async_tp: Bool = False
    # PyTorch FSDP's version (framework fsdp): FSDP2 (fully_shard, torchtitan; the default) copies
    # each gathered unit out of the all-gather buffer and its gradients into the reduce-scatter
    # buffer; FSDP1's flat parameters (fms-fsdp, MosaicML) are views of those buffers
    fsdp_version: Int | None = Field(default=None, ge=1, le=2)
    # The optimizer step's Adam (framework fsdp: torch.optim.AdamW over the fp32 sharded
    # parameters): fused (one kernel; torch's fused=True, Apex / Transformer Engine FusedAdam) or
    # foreach (torch.optim's default when a script passes neither foreach nor fused: eight
    # _foreach passes over the shard, about three times the bytes; ``inventory.optimizer``).
    # Unset: fused. Framework presets set it (fms-fsdp, torchtitan 0.1: foreach).
    optimizer_impl: Literal["fused", "foreach"] | None = None
    # The gradient clipping multiplies every gradient by min(1, max_norm / norm) every step,
    # clipping or not (torch's clip_grad_norm_ and FSDP1's FullyShardedDataParallel.clip_grad_norm_,
    # which avoid a host sync on the coefficient): one more read and write of the gradients.
    # False: the norm alone (Megatron-LM scales only when the norm exceeds --clip-grad).
    grad_clip_scale: Bool = False
    # the fused attention kernel (FlashAttention-2/-3, cuDNN, Triton, PyTorch SDPA's flash
    # backend): its own curve on the GPU where the catalog has one; unset, the GPU's attention
    # curve (FlashAttention-2 where calibrated). Framework presets set it.
    attention_kernel: AttentionKernel | None = None
    # Hybrid sharding (FSDP HYBRID_SHARD, torchtitan's data_parallel_shard_degree, Megatron's
    # --num-distributed-optimizer-instances): ZeRO shards over groups of this many data-
    # parallel ranks, and the shards' replicas all-reduce their gradients
    data_parallel_shard_degree: Int | None = Field(
        default=None, ge=1, validation_alias=AliasChoices("data_parallel_shard_degree", "dp_shard")
    )
    # Megatron-LM overlap_p2p_comm (on by default with the interleaved schedule; off with
    # --no-overlap-p2p-communication; NeMo overlap_p2p_comm): pipeline sends run
    # asynchronously beside the next task instead of holding the sending stage
    overlap_p2p_comm: Bool = False
    # How context parallelism (cp > 1) moves K and V: Megatron-Core's --cp-comm-type (Transformer
    # Engine's cp_comm_type) p2p (a ring: each step's attention runs beside the next chunk's
    # send), a2a (DeepSpeed-Ulysses all-to-alls of heads) or allgather (K and V gathered whole);
    # all_gather is TE's spelling of allgather;
    # torchtitan's context_parallel_rotate_method allgather or alltoall (its alltoall shifts the
    # ring one rank per step, a p2p ring). Unset: the engine's default (``cp_comm``).
    cp_comm_type: Literal["p2p", "a2a", "allgather", "all_gather", "alltoall", "a2a+p2p"] | None = None
    # Mixture of experts (Megatron-Core's names): experts split over expert_model_parallel_size
    # ranks, each expert's weights over expert_tensor_parallel_size ranks (default: tp); the
    # expert groups fold into the tp x cp x dp ranks of a pipeline stage (MoE parallel folding)
    expert_model_parallel_size: Int = Field(
        default=1, ge=1, validation_alias=AliasChoices("expert_model_parallel_size", "ep")
    )
    expert_tensor_parallel_size: Int | None = Field(
        default=None, ge=1, validation_alias=AliasChoices("expert_tensor_parallel_size", "etp")
    )
    # the busiest expert-parallel rank's routed tokens over the mean (1.0: the router balances
    # perfectly, as its auxiliary loss aims to); it sets the MoE layer's time, which every rank
    # waits for at the all-to-all
    expert_load_imbalance: Float = Field(default=1.0, ge=1.0, le=64.0)
    # --moe-shared-expert-overlap: the shared experts compute while the dispatch and combine
    # all-to-alls run; --overlap-moe-expert-parallel-comm (Megatron-Core, DeepSeek's DualPipe
    # idea): one micro-batch's all-to-all runs beside another's computation, in the schedule's
    # paired steady-state steps only (pp = 1 or interleaved; ``schedule.closed_form.paired_share``)
    moe_shared_expert_overlap: Bool = False
    overlap_moe_expert_parallel_comm: Bool = False
    # The token dispatcher brings the routing's counts to the host once per MoE layer forward
    # and the host waits for them: Megatron-Core's alltoall dispatcher synchronizes at its
    # cuda_sync_point ("before_ep_alltoall" for the all-to-all's split sizes, "before_finish"
    # for the grouped GEMM's without EP; megatron/core/transformer/moe/token_dispatcher.py at
    # NVIDIA/Megatron-LM 0014f137), DeepEP's dispatch returns num_recv_tokens_per_expert_list
    # ("the CPU will wait for GPU's signal to arrive", moe/fused_a2a.py at 02ad939b). After it
    # the GPU waits while the host launches the next kernels (``prediction.host_sync``). False
    # for the sync-free paths: --moe-pad-expert-input-to-capacity (cuda_sync_point "no_sync"),
    # HybridEP given num_permuted_tokens ("we do not need to use sync"), full-iteration CUDA graphs.
    moe_host_sync: Bool = True
    # Megatron-Core's partial CUDA graphs (--cuda-graph-impl transformer_engine --cuda-graph-scope
    # ...; megatron/core/transformer/enums.py CudaGraphScope, transformer_layer.py and
    # moe/moe_utils.py MoECudaGraphPartialCaptureSignal at NVIDIA/Megatron-LM dev): each layer's
    # attention ("attn"), its pre-MLP norm, router and (without --moe-shared-expert-overlap) shared
    # experts ("moe_router"), and the token dispatcher's dispatch_preprocess ("moe_preprocess",
    # needs moe_router) replay as one graph, which the host launches once instead of each kernel
    # (``prediction.host_sync``; the kernels' GPU time is unchanged). Unset: no graphs.
    cuda_graph_scope: tuple[Literal["attn", "moe_router", "moe_preprocess"], ...] | None = None
    # --- the token dispatcher (issue 28; Megatron-Core's --moe-token-dispatcher-type and
    # --moe-flex-dispatcher-backend) ---
    # alltoall: each top-k copy of a token sent to its expert's rank (NCCL all-to-all); allgather:
    # every rank gathers the EP group's tokens and keeps its experts' (the combine a reduce-
    # scatter); flex: DeepEP's normal kernels (deepep) or NVIDIA's HybridEP (hybridep) send a
    # token once to each node and each rank its experts sit on (NVLink forwarding within the
    # node). Unset: alltoall, paraplan's default (Megatron-LM's own default is allgather).
    moe_token_dispatcher_type: Literal["allgather", "alltoall", "flex"] | None = None
    moe_flex_dispatcher_backend: Literal["deepep", "hybridep"] | None = None  # flex only; default deepep
    # --- offload (issue 18) ---
    # DeepSpeed's zero_optimization.offload_optimizer / offload_param device: the optimizer
    # state and its step on the CPU (ZeRO-Offload), parameters on the host (ZeRO-3 only), or
    # either on NVMe (ZeRO-Infinity, ZeRO-3 only)
    offload_optimizer: Literal["none", "cpu", "nvme"] = "none"
    offload_param: Literal["none", "cpu", "nvme"] = "none"
    # Megatron-Core's TransformerConfig.cpu_offloading / cpu_offloading_num_layers: the saved
    # activations of that many transformer layers go to host memory in the forward pass and
    # come back for the backward pass
    cpu_offloading: Bool = False
    cpu_offloading_num_layers: Int | None = Field(default=None, ge=1)
    # --- Megatron-LM's pipeline layouts and recompute modules (issue 28; ``specs.pipeline_layout``) ---
    # --pipeline-model-parallel-layout: each virtual stage's layers ("Et*3|(tt|)*29,m|L"); it
    # sets vpp (its stages / pp)
    pipeline_model_parallel_layout: str | None = Field(
        default=None, validation_alias=AliasChoices("pipeline_model_parallel_layout", "pp_layout")
    )
    # --decoder-first/last-pipeline-num-layers (TransformerConfig num_layers_in_first/last_
    # pipeline_stage): the first / last rank's decoder layers, the others even
    decoder_first_pipeline_num_layers: Int | None = Field(
        default=None, ge=1,
        validation_alias=AliasChoices("decoder_first_pipeline_num_layers", "num_layers_in_first_pipeline_stage"),
    )
    decoder_last_pipeline_num_layers: Int | None = Field(
        default=None, ge=1,
        validation_alias=AliasChoices("decoder_last_pipeline_num_layers", "num_layers_in_last_pipeline_stage"),
    )
    # --account-for-embedding/loss-in-pipeline-split: the embedding / loss counts as a layer
    account_for_embedding_in_pipeline_split: Bool = False
    account_for_loss_in_pipeline_split: Bool = False
    # --recompute-modules with recompute selective (Megatron-Core TransformerConfig.recompute_
    # modules; unset: core_attn): ``inventory.recompute`` says what each re-runs and frees
    recompute_modules: tuple[RecomputeModule, ...] | None = None

    @model_validator(mode="after")
    def _megatron_split(self) -> ParallelPlan:
        check_megatron_split(self)
        return self

    @model_validator(mode="after")
    def _offload_supported(self) -> ParallelPlan:
        check_offload(self)
        return self

    @model_validator(mode="after")
    def _loss_of_the_framework(self) -> ParallelPlan:
        if self.cross_entropy_loss_fusion and self.framework is not Framework.MEGATRON:
            raise ValueError("parallel.cross_entropy_loss_fusion: Megatron-Core's fused cross entropy needs "
                             f"framework megatron, not {self.framework.value!r}")
        if self.compile_loss and self.framework is not Framework.FSDP:
            raise ValueError("parallel.compile_loss: torchtitan's compiled loss needs framework fsdp, not "
                             f"{self.framework.value!r} (Megatron's fused loss: cross_entropy_loss_fusion)")
        if (self.loss_chunks or 1) > 1 and self.framework is not Framework.FSDP:
            raise ValueError("parallel.loss_chunks: torchtitan's ChunkedLossWrapper needs framework fsdp, not "
                             f"{self.framework.value!r}")
        if self.grads_set_to_none and self.framework is Framework.MEGATRON:
            raise ValueError("parallel.grads_set_to_none: Megatron's DDP accumulates into a contiguous gradient "
                             "buffer kept for the whole run (zero_grad_buffer zeroes it in place); it frees none")
        if self.grads_set_to_none and self.framework is Framework.DEEPSPEED:
            raise ValueError("parallel.grads_set_to_none: DeepSpeed's ZeRO optimizer frees its gradient partitions "
                             "itself (no setting of it), which paraplan's DeepSpeed memory does not model")
        if self.pipeline_keeps_outputs is not None and self.framework is not Framework.FSDP:
            raise ValueError("parallel.pipeline_keeps_outputs: torch.distributed.pipelining's kept outputs need "
                             f"framework fsdp, not {self.framework.value!r}")
        return self

    @property
    def offloads(self) -> bool:
        """Whether anything of the plan lives off the GPU."""
        return self.offload_optimizer != "none" or self.offload_param != "none" or self.cpu_offloading

    @model_validator(mode="after")
    def _schedule_matches_vpp(self) -> ParallelPlan:
        vpp = self.virtual_pipeline_model_parallel_size
        if vpp is not None and vpp > 1:
            if self.pp < 2:
                raise ValueError("parallel.vpp: interleaving needs pipeline_model_parallel_size >= 2")
            if self.schedule is Schedule.ZB_V and vpp != 2:
                raise ValueError(
                    f"parallel.schedule: 'zb-v' runs exactly 2 chunks per stage; leave "
                    f"virtual_pipeline_model_parallel_size out or set it to 2, not {vpp}"
                )
            if "schedule" in self.model_fields_set and self.schedule not in (Schedule.INTERLEAVED, Schedule.ZB_V):
                raise ValueError(
                    f"parallel.schedule: {self.schedule.value!r} does not interleave; "
                    f"vpp={vpp} needs schedule 'interleaved' (or leave schedule out)"
                )
            if self.schedule is not Schedule.ZB_V:
                object.__setattr__(self, "schedule", Schedule.INTERLEAVED)
        if self.schedule is Schedule.INTERLEAVED and (vpp is None or vpp < 2):
            raise ValueError(
                "parallel.schedule: 'interleaved' needs virtual_pipeline_model_parallel_size >= 2"
            )
        _check_zero_bubble(self)
        if self.framework is Framework.DEEPSPEED and self.pp > 1 and self.zero_stage > 1:
            raise ValueError(
                f"parallel.zero_stage: DeepSpeed's pipeline engine supports ZeRO stage 0 or 1, "
                f"not {self.zero_stage}, with pp={self.pp}"
            )
        if self.deepspeed_train_schedule and self.schedule is not Schedule.ONE_F_ONE_B:
            raise ValueError(
                "parallel.deepspeed_train_schedule: DeepSpeed's TrainSchedule is a 1F1B schedule, "
                f"not {self.schedule.value!r}"
            )
        if self.tp_comm_overlap and not (self.sequence_parallel and self.tp > 1):
            raise ValueError(
                "parallel.tp_comm_overlap: overlaps the sequence-parallel collectives, so it needs "
                "tensor_model_parallel_size > 1 and sequence_parallel: true"
            )
        if self.fp8_amax_reduce != "none" and self.fp8_recipe not in (None, FP8Recipe.DELAYED):
            raise ValueError(
                f"parallel.fp8_amax_reduce: {self.fp8_amax_reduce!r} reduces Transformer Engine DelayedScaling's "
                f"amax histories; fp8_recipe {self.fp8_recipe.value} keeps none (set fp8_amax_reduce: none)"
            )
        if self.te_fp8_bookkeeping != "none" and self.fp8_recipe not in (None, FP8Recipe.DELAYED):
            raise ValueError(
                f"parallel.te_fp8_bookkeeping: {self.te_fp8_bookkeeping!r} updates Transformer Engine "
                f"DelayedScaling's amax histories; fp8_recipe {self.fp8_recipe.value} keeps none "
                "(set te_fp8_bookkeeping: none)"
            )
        if self.async_tp and self.framework is not Framework.FSDP:
            raise ValueError(
                "parallel.async_tp: PyTorch's asynchronous tensor parallelism (torchtitan, framework fsdp); "
                f"framework {self.framework.value} overlaps its TP collectives with tp_comm_overlap"
            )
        if self.async_tp and self.tp_comm_overlap:
            raise ValueError(
                "parallel.async_tp: PyTorch's asynchronous TP and tp_comm_overlap (Transformer Engine's "
                "userbuffers) are two implementations of the same overlap; set one"
            )
        if (self.overlap_moe_expert_parallel_comm and self.pipeline_model_parallel_size > 1
                and self.schedule is not Schedule.INTERLEAVED):
            raise ValueError(
                "parallel.overlap_moe_expert_parallel_comm: Megatron-Core pairs one micro-batch's "
                "all-to-alls with another's compute with pp 1 or the interleaved schedule (vpp >= 2; "
                f"its config asserts it), not pp {self.pipeline_model_parallel_size} with {self.schedule.value!r}"
            )
        if self.overlap_p2p_comm and self.schedule is not Schedule.INTERLEAVED:
            raise ValueError(
                "parallel.overlap_p2p_comm: Megatron-LM overlaps p2p communication only in the "
                f"interleaved schedule (vpp >= 2), not {self.schedule.value!r}"
            )
        if self.overlap_p2p_comm and self.framework is Framework.DEEPSPEED:
            raise ValueError(
                "parallel.overlap_p2p_comm: DeepSpeed's pipeline engine sends in lock-step; "
                "asynchronous sends are Megatron-LM's overlap_p2p_comm (its interleaved schedule's default)"
            )
        _check_cp_comm(self)
        _check_dispatcher(self)
        if self.data_parallel_shard_degree is not None and self.zero_stage < 1:
            raise ValueError(
                "parallel.data_parallel_shard_degree: hybrid sharding shards ZeRO state, so it needs "
                "zero_stage >= 1"
            )
        if self.fsdp_version is not None and self.framework is not Framework.FSDP:
            raise ValueError(
                f"parallel.fsdp_version: only with framework 'fsdp', not {self.framework.value!r}"
            )
        if self.optimizer_impl == "foreach" and self.framework is not Framework.FSDP:
            raise ValueError(
                "parallel.optimizer_impl: foreach is torch.optim's AdamW over PyTorch FSDP's fp32 shards "
                f"(framework 'fsdp'), not {self.framework.value!r}, whose optimizer is fused"
            )
        choices = RECOMPUTE_CHOICES[self.framework]
        if self.recompute not in choices:
            raise ValueError(
                f"parallel.recompute: {self.framework.value} has no {self.recompute.value!r} recompute "
                f"(it has: {', '.join(c.value for c in choices)})"
            )
        if (self.recompute_method or self.recompute_num_layers) and self.recompute is not Recompute.FULL:
            raise ValueError(
                "parallel.recompute_method: Megatron-LM's --recompute-method and "
                f"--recompute-num-layers go with recompute 'full', not {self.recompute.value!r}"
            )
        if self.recompute_every is not None and self.recompute is not Recompute.LAYER:
            raise ValueError(
                "parallel.recompute_every: checkpointing every n-th layer is recompute 'layer', "
                f"not {self.recompute.value!r}"
            )
        if self.partition_activations and self.recompute is not Recompute.FULL:
            raise ValueError(
                "parallel.partition_activations: partitions checkpointed layer inputs, so it "
                f"needs recompute 'full', not {self.recompute.value!r}"
            )
        if self.layers_per_stage is not None:
            if len(self.layers_per_stage) != self.pipeline_model_parallel_size:
                raise ValueError(
                    f"parallel.layers_per_stage: {len(self.layers_per_stage)} stages given but "
                    f"pp={self.pipeline_model_parallel_size}"
                )
            if min(self.layers_per_stage) < 1:
                raise ValueError(
                    "parallel.layers_per_stage: every stage needs >= 1 layer "
                    f"(got {short_repr(list(self.layers_per_stage))})"
                )
        return self

    # Short names used throughout the code.
    @property
    def tp(self) -> int:
        return self.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.pipeline_model_parallel_size

    @property
    def dp(self) -> int:
        if self.data_parallel_size is None:
            raise ValueError("parallel.data_parallel_size is not resolved yet")
        return self.data_parallel_size

    @property
    def cp(self) -> int:
        return self.context_parallel_size

    @property
    def cp_comm(self) -> str:
        """How context parallelism communicates: 'p2p' (a ring of K/V chunks), 'a2a' (Ulysses) or
        'allgather'. Unset, the engine's default: Megatron-Core's --cp-comm-type defaults to p2p
        (megatron/training/arguments.py), torchtitan's context_parallel_rotate_method to
        allgather (torchtitan/config/job_config.py); torchtitan's alltoall is a ring shift."""
        if self.cp_comm_type == "alltoall":
            return "p2p"
        if self.cp_comm_type == "all_gather":  # Transformer Engine's spelling
            return "allgather"
        if self.cp_comm_type is not None:
            return self.cp_comm_type
        return "allgather" if self.framework is Framework.FSDP else "p2p"

    @property
    def vpp(self) -> int:
        return self.virtual_pipeline_model_parallel_size or 1

    @property
    def ep(self) -> int:
        return self.expert_model_parallel_size

    @property
    def dispatcher(self) -> str:
        """How tokens reach their experts: 'alltoall' (also the default), 'allgather', 'deepep' or
        'hybridep' (the flex dispatcher's backend, deepep when unset as in Megatron-Core)."""
        if self.moe_token_dispatcher_type == "flex":
            return self.moe_flex_dispatcher_backend or "deepep"
        return self.moe_token_dispatcher_type or "alltoall"

    @property
    def etp(self) -> int:
        return self.expert_tensor_parallel_size or self.tensor_model_parallel_size

    @property
    def edp(self) -> int:
        """Expert data parallelism: the ranks that hold the same experts (Megatron-Core's
        expert_data_parallel group, tp*cp*dp / (etp*ep) of a stage), over which the experts'
        gradients are reduced and the distributed optimizer shards their states."""
        return max(1, self.tp * self.cp * self.dp // (self.etp * self.ep))

    @property
    def grad_group(self) -> int:
        """Ranks that hold the same weights: gradients are reduced and ZeRO shards over them."""
        return self.dp * self.cp

    @property
    def scatters_p2p(self) -> bool:
        """Whether pipeline sends carry 1/tp of the activation: with sequence parallelism the
        activation is already split; DeepSpeed's pipeline engine partitions it over the
        model-parallel ranks; Megatron-LM 2021 did it with ``scatter_gather_tensors_in_pipeline``."""
        if self.scatter_gather_p2p is not None:
            return self.scatter_gather_p2p
        return self.sequence_parallel or self.framework is Framework.DEEPSPEED

    @property
    def sends_pipeline_mask(self) -> bool:
        """Whether each forward pipeline send also carries the [1, 1, s, s] causal mask.

        DeepSpeed's PipelineEngine sends every tensor of a stage's output tuple, and GPT-NeoX's
        pipeline layers pass ``(hidden_states, attention_mask)``; the boolean mask travels cast
        to fp16 because NCCL has no bool type (``_exec_send_activations``), and no gradient
        comes back for it. Megatron-LM sends the activation alone."""
        if self.pipeline_mask is not None:
            return self.pipeline_mask
        return self.framework is Framework.DEEPSPEED

    @property
    def fuses_gradient_accumulation(self) -> bool:
        """Whether weight-gradient GEMMs accumulate into the gradient buffer themselves
        (Megatron-LM's --gradient-accumulation-fusion, on by default). Otherwise every
        micro-batch after the first adds its fresh gradients to ``.grad`` (autograd's
        AccumulateGrad; DeepSpeed ZeRO-0/1 reduces only at the accumulation boundary)."""
        if self.gradient_accumulation_fusion is not None:
            return self.gradient_accumulation_fusion
        return self.framework is Framework.MEGATRON

    @property
    def syncs_shards_once_per_step(self) -> bool:
        """Whether ZeRO-2/3's data-parallel traffic runs once a step rather than every
        micro-batch: FSDP2 (``fully_shard``, torchtitan) under a pipeline. torchtitan does not
        reshard after the forward pass with pp > 1 (torchtitan 0.3.0 ``distributed/fsdp.py``
        ``get_fsdp_reshard_after_forward_policy``: "default" is ``not pp_enabled``), and torch's
        pipeline stage (torch 2.13 ``distributed/pipelining/stage.py``) calls
        ``set_reshard_after_backward(False)`` and ``set_requires_gradient_sync(False)`` before
        every backward (``backward_maybe_with_nosync``) and reduces once after the last one
        (``perform_reduce_grad``, scheduled after all micro-batches): each weight is gathered
        in the step's first forward and kept, each gradient accumulated unsharded and
        reduce-scattered once. The memory model holds the same (``prediction.memory``)."""
        return self.framework is Framework.FSDP and self.pp > 1 and (self.fsdp_version or 2) == 2

    @property
    def frees_gradients(self) -> bool:
        """Whether the gradients are freed between steps (``grads_set_to_none``; by default
        True under PyTorch FSDP, whose trainers call torch.optim's ``zero_grad()``, set_to_none
        by default since PyTorch 2.0; False under Megatron, whose DDP keeps a contiguous
        gradient buffer, and DeepSpeed, whose ZeRO gradient partitions are not read here: both
        refuse ``grads_set_to_none=True``)."""
        if self.grads_set_to_none is not None:
            return bool(self.grads_set_to_none)
        return self.framework is Framework.FSDP

    @property
    def keeps_pipeline_outputs(self) -> bool:
        """Whether torch.distributed.pipelining keeps every micro-batch's stage output until
        the step ends (``pipeline_keeps_outputs``; default False: today's torchtitan trainer
        calls ``pp_schedule.step(..., return_outputs=False)``, and torch's schedules then run
        ``forward_one_chunk(..., save_forward_output=return_outputs)``). Only torchtitan's
        pipelines (framework fsdp, pp > 1) read it."""
        return bool(self.pipeline_keeps_outputs)

    @property
    def runs_deepspeed_train_schedule(self) -> bool:
        """Whether the pipeline follows DeepSpeed's TrainSchedule (``schedule.deepspeed``):
        DeepSpeed's pipeline engine runs 1F1B in lock-step, each output sent at the start of
        the stage's next step, every transfer a rendezvous of both stages. Megatron-LM's 1F1B
        sends right after the compute. ``deepspeed_train_schedule`` overrides the framework's
        default (e.g. to see what the lock-step costs)."""
        if self.schedule is not Schedule.ONE_F_ONE_B:
            return False
        if self.deepspeed_train_schedule is not None:
            return self.deepspeed_train_schedule
        return self.framework is Framework.DEEPSPEED

    @property
    def checkpoint_every(self) -> int:
        """With recompute 'layer': every how many layers one is checkpointed (torchtitan's
        default selective_ac_option is 2)."""
        return self.recompute_every or 2

    @property
    def zero_shards(self) -> int:
        """Ranks ZeRO partitions weights, gradients and optimizer states over: the gradient
        group, or its shard groups under hybrid sharding."""
        if self.data_parallel_shard_degree is not None and self.zero_stage >= 1:
            return self.data_parallel_shard_degree
        return self.grad_group

    @property
    def num_microbatches(self) -> int:
        assert self.global_batch_size is not None
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def overlaps_grad_reduce(self) -> bool:
        """Whether DP gradient reduction overlaps the last micro-batch's backward pass.

        Megatron-LM's distributed optimizer / DDP with ``--overlap-grad-reduce`` does;
        DeepSpeed's pipeline engine reduces gradients after the whole pipeline has drained.
        """
        if self.overlap_grad_reduce is not None:
            return self.overlap_grad_reduce
        return self.framework is not Framework.DEEPSPEED

    @property
    def deepspeed_overlap_comm(self) -> bool:
        """DeepSpeed ZeRO's ``overlap_comm`` for this plan (what the DeepSpeed export writes and
        the memory model counts buckets for). ZeRO-3 (never with a pipeline here): on,
        DeepSpeed's default, unless the plan turns the overlap off. ZeRO-1/2: what the prediction
        assumed; never with pp > 1 (DeepSpeed's pipeline engine reduces gradients after the
        pipeline drains, and ``engine._configure_zero_optimizer`` turns ``overlap_comm`` off for
        a ``PipelineModule``)."""
        if self.zero_stage == 3:
            return self.overlap_grad_reduce is not False
        return self.overlaps_grad_reduce and self.pp == 1


def check_megatron_split(plan: ParallelPlan) -> None:
    """Megatron-LM's pipeline-split fields (one way at a time, Megatron-LM only) and its
    recompute modules (with selective recompute); a layout sets vpp to its stages / pp."""
    given = [name for name in SPLIT_FIELDS if getattr(plan, name)]
    if plan.recompute_modules is not None:
        if plan.recompute is not Recompute.SELECTIVE:
            raise ValueError("parallel.recompute_modules: Megatron-Core's --recompute-modules go with recompute "
                             f"'selective', not {plan.recompute.value!r}")
        if plan.framework is not Framework.MEGATRON:
            given.append("recompute_modules")
        if len(set(plan.recompute_modules)) != len(plan.recompute_modules):
            raise ValueError("parallel.recompute_modules: a module is named twice "
                             f"({', '.join(plan.recompute_modules)})")
    if not given:
        return
    if plan.framework is not Framework.MEGATRON:
        raise ValueError(f"parallel.{given[0]}: a Megatron-LM setting; {plan.framework.value} has none "
                         "(its uneven split is parallel.layers_per_stage)")
    if plan.layers_per_stage is not None and given[0] != "recompute_modules":
        raise ValueError(f"parallel.{given[0]}: give the split one way, not with layers_per_stage too")
    first_last = plan.decoder_first_pipeline_num_layers or plan.decoder_last_pipeline_num_layers
    accounted = plan.account_for_embedding_in_pipeline_split or plan.account_for_loss_in_pipeline_split
    layout = plan.pipeline_model_parallel_layout
    if layout is not None and (first_last or accounted):
        raise ValueError("parallel.pipeline_model_parallel_layout: Megatron-LM takes a layout alone, without "
                         "decoder_first/last_pipeline_num_layers or account_for_embedding/loss_in_pipeline_split")
    if first_last and accounted:
        raise ValueError(f"parallel.{given[-1]}: Megatron-LM does not combine it with "
                         "decoder_first/last_pipeline_num_layers")
    if layout is None:
        return
    vpp = check_layout(layout, plan.pp)
    if plan.virtual_pipeline_model_parallel_size is not None and plan.virtual_pipeline_model_parallel_size != vpp:
        raise ValueError(f"parallel.pipeline_model_parallel_layout: has {vpp * plan.pp} virtual stages = pp "
                         f"{plan.pp} x vpp {vpp}, but vpp={plan.virtual_pipeline_model_parallel_size}; leave vpp out")
    if vpp > 1 and plan.virtual_pipeline_model_parallel_size is None:
        object.__setattr__(plan, "virtual_pipeline_model_parallel_size", vpp)


def _check_cp_comm(plan: ParallelPlan) -> None:
    """The context-parallel communication each framework runs: Megatron-Core p2p | a2a |
    allgather (a2a+p2p, hierarchical, is not modelled); torchtitan (PyTorch's
    context_parallel) rotates by allgather | alltoall (a ring, which p2p also names) and has no
    Ulysses all-to-all."""
    kind = plan.cp_comm_type
    if kind is None:
        return
    if kind == "a2a+p2p":
        raise ValueError("parallel.cp_comm_type: 'a2a+p2p' (hierarchical context parallelism) is not modelled; "
                         "use p2p, a2a or allgather")
    if plan.framework is Framework.FSDP and kind == "a2a":
        raise ValueError("parallel.cp_comm_type: torchtitan rotates K/V by 'allgather' or 'alltoall' "
                         "(context_parallel_rotate_method); the Ulysses all-to-all 'a2a' is Megatron-Core's")
    if plan.framework is not Framework.FSDP and kind == "alltoall":
        raise ValueError("parallel.cp_comm_type: 'alltoall' is torchtitan's ring rotation; Megatron-Core's "
                         "names are p2p, a2a (Ulysses all-to-all) and allgather")


def check_offload(plan: ParallelPlan) -> None:
    """The offload rules of DeepSpeed (its config docs: offload_param "available only with ZeRO
    stage 3"; offload_optimizer to the CPU with stages 1-3, to NVMe with stage 3), Megatron-LM
    (--optimizer-cpu-offload with the distributed optimizer; Megatron-Core's cpu_offloading
    refuses pipeline parallelism and activation recomputation) and FSDP2 (CPUOffloadPolicy
    moves parameters, gradients and optimizer state together, to the CPU only)."""
    opt, par, fw = plan.offload_optimizer, plan.offload_param, plan.framework
    if par != "none" and plan.zero_stage != 3:
        raise ValueError(f"parallel.offload_param: parameters are offloaded only with zero_stage 3, not {plan.zero_stage}")
    if opt != "none" and plan.zero_stage < 1:
        raise ValueError("parallel.offload_optimizer: offloads the ZeRO-partitioned optimizer, so it needs zero_stage >= 1")
    if opt == "nvme" and plan.zero_stage != 3:
        raise ValueError(f"parallel.offload_optimizer: NVMe offload (ZeRO-Infinity) needs zero_stage 3, not {plan.zero_stage}")
    if fw is Framework.MEGATRON:
        if par != "none":
            raise ValueError("parallel.offload_param: Megatron-LM offloads no parameters (its "
                             "--optimizer-cpu-offload moves the optimizer only); use framework deepspeed or fsdp")
        if opt == "nvme" or (opt == "cpu" and plan.zero_stage != 1):
            raise ValueError("parallel.offload_optimizer: Megatron-LM's --optimizer-cpu-offload goes to the CPU "
                             f"with the distributed optimizer (zero_stage 1), not {opt!r} with zero_stage {plan.zero_stage}")
    if fw is Framework.FSDP and (opt != par or "nvme" in (opt, par)):
        raise ValueError("parallel.offload_optimizer: FSDP2's CPUOffloadPolicy offloads parameters, gradients and "
                         "optimizer state together to the CPU: set offload_optimizer and offload_param both to "
                         f"'cpu' (got {opt!r} and {par!r})")
    if plan.cpu_offloading_num_layers is not None and not plan.cpu_offloading:
        raise ValueError("parallel.cpu_offloading_num_layers: goes with cpu_offloading: true")
    if plan.cpu_offloading:
        if fw is not Framework.MEGATRON:
            raise ValueError(f"parallel.cpu_offloading: activation offload is Megatron-Core's; {fw.value} has none")
        if plan.pp > 1:
            raise ValueError("parallel.cpu_offloading: Megatron-Core has no pipeline parallelism with CPU "
                             f"offloading (pp={plan.pp})")
        if plan.recompute is not Recompute.NONE:
            raise ValueError("parallel.cpu_offloading: Megatron-Core's CPU offloading does not work with "
                             f"activation recomputation ({plan.recompute.value!r})")
        if plan.cpu_offloading_num_layers is None:
            raise ValueError("parallel.cpu_offloading_num_layers: say how many layers' activations to offload")


# A job file's short names of the plan's fields (tp: tensor_model_parallel_size), read from the
# plan's own aliases: the one table job files, overrides and the command line's flags share.
PLAN_ALIASES: dict[str, str] = {
    choice: name
    for name, spec in ParallelPlan.model_fields.items()
    for choice in getattr(spec.validation_alias, "choices", ())
    if choice != name
}
