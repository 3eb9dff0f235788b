"""A whole training job: model + cluster + parallel plan + precision, checked for consistency."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator

from paraplan.specs._types import Count, Headroom
from paraplan.specs.enums import FP8Recipe, Framework, Precision, Schedule
from paraplan.specs.hardware import ClusterSpec, GpuSpec
from paraplan.specs.model import ModelSpec
from paraplan.specs.pipeline_layout import split_given, stage_grid
from paraplan.specs.plan import ParallelPlan, pp_layers_problem
from paraplan.specs.preset import PresetUse

# The share of each GPU's memory a plan leaves free by default: the run-to-run spread of the
# caching allocator's peak reserved memory around the average fragmentation the prediction
# models (GMLake, Guo et al., ASPLOS'24, arXiv 2401.08156: fragmentation 15 % on average and up
# to 33 % over eight LLM fine-tuning setups), the memory other processes on the GPU take (DCGM,
# profilers), and what differs between framework versions. 5 %, as serving frameworks leave
# (Huawei CANN's LLMConfig.mem_utilization defaults to 0.95; vLLM's gpu_memory_utilization to
# 0.9); ``--memory-headroom`` or ``memory_headroom:`` in the job file sets another.
DEFAULT_MEMORY_HEADROOM = 0.05


class Job(BaseModel):
    """Everything needed to predict one training iteration.

    Validation checks every divisibility rule Megatron-LM checks, and names the field.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "job"
    model: ModelSpec
    cluster: ClusterSpec
    parallel: ParallelPlan = ParallelPlan()
    precision: Precision = Precision.BF16
    train_tokens: Count | None = None
    memory_headroom: Headroom = DEFAULT_MEMORY_HEADROOM  # share of each GPU's memory left free
    # the framework preset the plan's unstated fields came from (parallel.framework: nemo-24.07)
    preset: PresetUse | None = None

    @model_validator(mode="before")
    @classmethod
    def _fp4_spelling(cls, data: object) -> object:
        """``precision: fp4`` (or ``nvfp4``, Megatron-LM's ``--fp4-format e2m1 --fp4-recipe
        nvfp4``) is FP8 training with the NVFP4 recipe: Transformer Engine runs NVFP4 inside
        its FP8 autocast (``NVFP4BlockScaling``), so it reads as ``precision: fp8`` with
        ``parallel.fp8_recipe: nvfp4``; a different recipe stated beside it is an error."""
        if not isinstance(data, dict):
            return data
        given = data.get("precision")
        key = given.value if isinstance(given, Precision) else str(given).strip().lower() if given is not None else None
        if key not in ("fp4", "nvfp4"):
            return data
        plan = data.get("parallel")
        if isinstance(plan, ParallelPlan):
            recipe = plan.fp8_recipe
            plan = plan.model_copy(update={"fp8_recipe": FP8Recipe.NVFP4})
        else:
            plan = dict(plan or {})
            recipe = plan.get("fp8_recipe")
            recipe = None if recipe is None else FP8Recipe(recipe)
            plan["fp8_recipe"] = FP8Recipe.NVFP4
        if recipe not in (None, FP8Recipe.NVFP4):
            raise ValueError(f"parallel.fp8_recipe: {recipe.value} contradicts precision: {key} "
                             "(NVFP4 training); leave fp8_recipe out or set nvfp4")
        return {**data, "precision": Precision.FP8, "parallel": plan}

    @model_validator(mode="after")
    def _consistent(self) -> Job:
        p, m, c = self.parallel, self.model, self.cluster
        model_parallel = p.tp * p.pp * p.cp
        derived = p.data_parallel_size is None  # dp is what the cluster leaves: say where it came from
        if derived:
            if c.num_gpus % model_parallel:
                raise ValueError(
                    f"parallel: tp*pp*cp = {model_parallel} does not divide the cluster's "
                    f"{c.num_gpus} GPU{'s' if c.num_gpus != 1 else ''} (cluster.num_nodes {c.num_nodes} x cluster.gpus_per_node {c.gpus_per_node})"
                )
            p = p.model_copy(update={"data_parallel_size": c.num_gpus // model_parallel})
        if model_parallel * p.dp != c.num_gpus:
            raise ValueError(
                f"parallel: tp*pp*dp*cp = {model_parallel * p.dp} but the cluster has "
                f"{c.num_gpus} GPUs"
            )
        if p.global_batch_size is None:
            p = p.model_copy(update={"global_batch_size": p.micro_batch_size * p.dp})
        if p.global_batch_size % (p.micro_batch_size * p.dp):
            raise ValueError(
                f"parallel.global_batch_size: {p.global_batch_size} is not divisible by "
                f"micro_batch_size*dp = {p.micro_batch_size}*{p.dp}"
                + (f" (dp = cluster.num_nodes {c.num_nodes} x cluster.gpus_per_node {c.gpus_per_node} / "
                   f"tp*pp*cp {model_parallel})" if derived else "")
            )
        shard = p.data_parallel_shard_degree
        if shard is not None and p.grad_group % shard:
            raise ValueError(
                f"parallel.data_parallel_shard_degree: {shard} does not divide the data-parallel "
                f"group of dp*cp = {p.grad_group} ranks"
            )
        _check_divisible("parallel.tp", "num_attention_heads", m.num_attention_heads, p.tp)
        _check_divisible("parallel.tp", "num_query_groups", m.num_query_groups, p.tp)
        _check_divisible("parallel.tp", "ffn_hidden_size", m.ffn_hidden_size, p.tp)
        _check_divisible("parallel.cp", "seq_length", m.seq_length, p.cp)
        if p.cp > 1 and p.cp_comm == "a2a":
            _check_heads_a2a(m, p.tp, p.cp)
        if m.padded_vocab_size is not None:
            _check_divisible("parallel.tp", "padded_vocab_size", m.padded_vocab_size, p.tp)
        _check_experts(m, p)
        if p.sequence_parallel:
            _check_divisible("parallel.sequence_parallel", "seq_length", m.seq_length, p.tp * p.cp)
        if p.layers_per_stage is not None:
            if sum(p.layers_per_stage) != m.num_layers:
                raise ValueError(
                    f"parallel.layers_per_stage: sums to {sum(p.layers_per_stage)} but the model "
                    f"has num_layers={m.num_layers}"
                )
        elif m.num_layers < p.pp:
            raise ValueError(
                f"parallel.pp: pp={p.pp} is larger than num_layers={m.num_layers}"
            )
        _check_split(m, p)
        problem = pp_layers_problem(m.num_layers, p.pp, p.framework, split_given(p))
        if problem is not None:
            raise ValueError(problem)
        _check_recompute_modules(m, p)
        if p.vpp > 1:
            if p.schedule is Schedule.INTERLEAVED and p.num_microbatches % p.pp:
                raise ValueError(
                    f"parallel.vpp: the interleaved schedule needs the number of micro-batches "
                    f"({p.num_microbatches}) to be a multiple of pp={p.pp}"
                )
        k = p.cpu_offloading_num_layers
        if k is not None and k >= m.num_layers:  # Megatron-Core: "only for layers less than num_layers"
            raise ValueError(
                f"parallel.cpu_offloading_num_layers: {k} must be less than num_layers={m.num_layers}"
            )
        if self.precision not in c.gpu.peak_flops:
            have = ", ".join(x.value for x in c.gpu.peak_flops)
            raise ValueError(
                f"precision: GPU {c.gpu.name} has no {self.precision.value} peak (it has: {have})"
            )
        _check_fp8_recipe(p.fp8_recipe, self.precision, c.gpu)
        if p.fp8_amax_reduce != "none" and self.precision is not Precision.FP8:
            raise ValueError(f"parallel.fp8_amax_reduce: {p.fp8_amax_reduce} reduces FP8 amaxes, but the job's "
                             f"precision is {self.precision.value} (set precision: fp8, or fp8_amax_reduce: none)")
        if p.te_fp8_bookkeeping != "none" and self.precision is not Precision.FP8:
            raise ValueError(f"parallel.te_fp8_bookkeeping: {p.te_fp8_bookkeeping} prices FP8 amax and scale "
                             f"updates, but the job's precision is {self.precision.value} (set precision: fp8, "
                             "or te_fp8_bookkeeping: none)")
        _check_cuda_graph_scope(p, m.is_moe)
        if p.tp_comm_overlap and p.tp_comm_overlap_cfg and not (m.qkv_fusion and m.gate_up_fusion):
            split = "qkv_fusion" if not m.qkv_fusion else "gate_up_fusion"
            raise ValueError(f"parallel.tp_comm_overlap_cfg: Transformer Engine's userbuffers overlap the fused QKV "
                             f"and fc1 GEMMs (linear_qkv, linear_fc1), but model.{split} is false (set it true, "
                             "or tp_comm_overlap_cfg: null)")
        if p is not self.parallel:
            object.__setattr__(self, "parallel", p)
        return self

    @property
    def tokens_per_iteration(self) -> int:
        return self.parallel.global_batch_size * self.model.seq_length


def _check_fp8_recipe(recipe: FP8Recipe | None, precision: Precision, gpu: GpuSpec) -> None:
    """An FP8 recipe belongs to an FP8 job, and a block-scaled one to a GPU whose tensor cores
    read that format's block scales in hardware (``GpuSpec.block_scaled_formats``, catalog data)."""
    if recipe is None:
        return
    if precision is not Precision.FP8:
        raise ValueError(f"parallel.fp8_recipe: {recipe.value} is an FP8 recipe, but the job's precision is "
                         f"{precision.value} (set precision: fp8, or leave fp8_recipe out)")
    formats = gpu.block_scaled_formats
    runs = " | ".join(["delayed", "current", "rowwise"] + [f for f in ("mxfp8", "nvfp4") if f in formats
                                                          and (f != "nvfp4" or Precision.FP4 in gpu.peak_flops)])
    reads = ", ".join(formats) if formats else "none"
    if recipe is FP8Recipe.NVFP4 and ("nvfp4" not in formats or Precision.FP4 not in gpu.peak_flops):
        lacks = "no fp4 peak" if "nvfp4" in formats else f"block-scaled formats in the catalog: {reads}"
        raise ValueError(f"parallel.fp8_recipe: nvfp4 needs FP4 tensor cores that read NVFP4 block scales; GPU "
                         f"{gpu.name} has {lacks} (block_scaled_formats), choose {runs}")
    if recipe is FP8Recipe.MXFP8 and "mxfp8" not in formats:
        raise ValueError(f"parallel.fp8_recipe: mxfp8 needs tensor cores that read MXFP8 block scales; GPU "
                         f"{gpu.name} has block-scaled formats in the catalog: {reads} (block_scaled_formats), "
                         f"choose {runs}")


def _check_experts(m: ModelSpec, p: ParallelPlan) -> None:
    """Megatron-Core's rules for mixture-of-experts parallelism (``initialize_model_parallel``
    and ``TransformerConfig``): experts split evenly over EP ranks, each expert's MLP over ETP
    ranks, and the ETP x EP expert group folds into a stage's tp x cp x dp ranks."""
    if not m.is_moe:
        given = {"expert_model_parallel_size": p.ep > 1, "expert_tensor_parallel_size": p.expert_tensor_parallel_size,
                 "expert_load_imbalance": p.expert_load_imbalance != 1.0,
                 "moe_shared_expert_overlap": p.moe_shared_expert_overlap,
                 "overlap_moe_expert_parallel_comm": p.overlap_moe_expert_parallel_comm,
                 "moe_token_dispatcher_type": p.moe_token_dispatcher_type}
        for name, value in given.items():
            if value:
                raise ValueError(f"parallel.{name}: the model is dense (it has no num_moe_experts)")
        return
    _check_divisible("parallel.ep", "num_moe_experts", m.num_moe_experts, p.ep)
    _check_divisible("parallel.etp", "moe_ffn_hidden_size", m.moe_ffn_hidden_size, p.etp)
    if m.moe_shared_expert_intermediate_size:
        _check_divisible("parallel.tp", "moe_shared_expert_intermediate_size",
                         m.moe_shared_expert_intermediate_size, p.tp)
    stage = p.tp * p.cp * p.dp
    if stage % (p.ep * p.etp):
        raise ValueError(
            f"parallel.ep: expert_model_parallel_size x expert_tensor_parallel_size = {p.ep} x {p.etp} "
            f"does not divide the tp x cp x dp = {stage} ranks of a pipeline stage it folds into"
        )
    if p.tp > 1 and not p.sequence_parallel:
        raise ValueError(
            "parallel.sequence_parallel: Megatron-Core's MoE layers need sequence parallelism "
            f"with tensor parallelism (tp={p.tp})"
        )
    if m.moe_expert_capacity_factor is not None and p.moe_token_dispatcher_type not in (None, "alltoall"):
        raise ValueError(
            "parallel.moe_token_dispatcher_type: Megatron-Core drops tokens by capacity "
            f"(moe_expert_capacity_factor) with the alltoall dispatcher only, not {p.moe_token_dispatcher_type!r}"
        )
    if p.moe_shared_expert_overlap and not m.moe_shared_expert_intermediate_size:
        raise ValueError(
            "parallel.moe_shared_expert_overlap: the model has no shared experts "
            "(moe_shared_expert_intermediate_size)"
        )


def _check_heads_a2a(m: ModelSpec, tp: int, cp: int) -> None:
    """Transformer Engine's all-to-all context parallelism splits each rank's query and K/V
    heads over the cp ranks ("The number of attention heads needs to be divisible by CP size")."""
    groups = m.num_query_groups or m.num_attention_heads
    for name, heads in (("num_attention_heads", m.num_attention_heads), ("num_query_groups", groups)):
        if (heads // tp) % cp:
            raise ValueError(f"parallel.cp_comm_type: a2a splits the heads over cp ranks, but {name} / tp = "
                             f"{heads // tp} is not divisible by cp = {cp}")


def _check_split(m: ModelSpec, p: ParallelPlan) -> None:
    """The decoder layers of every (virtual) stage (``specs.pipeline_layout``): each way of
    stating the split checked as Megatron-LM checks it, and every pipeline rank holding a layer."""
    grid = stage_grid(m.num_layers, p)
    empty = [i for i, row in enumerate(grid) if sum(row) < 1]
    if empty and split_given(p):
        field = "pipeline_model_parallel_layout" if p.pipeline_model_parallel_layout else "layers_per_stage"
        raise ValueError(f"parallel.{field}: pipeline rank {empty[0]} holds no decoder layer (paraplan needs "
                         "at least one per rank)")


# the recompute modules whose operators a traced layer names as the hand-written one does: the
# attention core, the routed experts (built by the hand-written code) and the shared experts
_TRACED_RECOMPUTE_MODULES = ("core_attn", "moe_act", "shared_experts")


def _check_recompute_modules(m: ModelSpec, p: ParallelPlan) -> None:
    """A recompute module the model has nothing of is refused (a typo or a model mix-up)."""
    needs = {"mla_up_proj": (m.multi_latent_attention, "no multi-latent attention"),
             "moe": (m.is_moe, "no mixture-of-experts layers"), "moe_act": (m.is_moe, "no mixture-of-experts layers"),
             "shared_experts": (bool(m.moe_shared_expert_intermediate_size), "no shared experts"),
             "mlp": (not all(m.moe_layers), "no dense MLP (every layer is a mixture of experts)")}
    for module in p.recompute_modules or ():
        if m.inventory == "traced" and module not in _TRACED_RECOMPUTE_MODULES:
            raise ValueError(f"parallel.recompute_modules: {module!r} is not applied to a traced inventory yet (its "
                             f"operators carry the model's module names; {', '.join(_TRACED_RECOMPUTE_MODULES)} are); "
                             f"leave it out or use model.inventory: hand")
        has, what = needs.get(module, (True, ""))
        if not has:
            raise ValueError(f"parallel.recompute_modules: {module!r} recomputes nothing in {m.name} (it has {what})")


def _check_divisible(field: str, what: str, value: int, by: int) -> None:
    if value % by:
        raise ValueError(f"{field}: {what}={value} is not divisible by {by}")


def _check_cuda_graph_scope(p, moe: bool) -> None:
    """Megatron-Core's partial CUDA graphs (``parallel.cuda_graph_scope``): Megatron only, the
    MoE scopes for a mixture of experts, and moe_preprocess only with moe_router (CudaGraphScope's
    own rule)."""
    scope = p.cuda_graph_scope or ()
    if scope and p.framework is not Framework.MEGATRON:
        raise ValueError(f"parallel.cuda_graph_scope: Megatron-Core's partial CUDA graphs, but the framework is "
                         f"{p.framework.value} (use framework: megatron, or leave it unset)")
    if not moe and any(s != "attn" for s in scope):
        raise ValueError("parallel.cuda_graph_scope: moe_router and moe_preprocess graph a mixture-of-experts "
                         "layer's router and dispatcher, and the model has no experts (use attn)")
    if "moe_preprocess" in scope and "moe_router" not in scope:
        raise ValueError("parallel.cuda_graph_scope: moe_preprocess needs moe_router (Megatron-Core captures the "
                         "dispatcher's preprocessing in the router's graph)")
