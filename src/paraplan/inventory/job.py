"""The whole job's inventory: per pipeline stage, the operators and collectives of one rank."""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from dataclasses import dataclass

from paraplan.inventory.ends import (
    chunked_loss,
    count_embedding_ops,
    count_end_collectives,
    count_head_ops,
    tied_weight,
)
from paraplan.inventory.fp8 import recipe_costs
from paraplan.inventory.fsdp1 import fsdp1_grad_flatten, fsdp1_side_kernels, runs_fsdp1
from paraplan.inventory.layer import (
    DUPLICATED_ACROSS_TP,
    count_layer_collectives,
    count_layer_ops,
    dtensor_gathered_inputs,
)
from paraplan.inventory.moe import count_moe_collectives, count_moe_layer_ops
from paraplan.inventory.mtp import count_mtp_ops
from paraplan.inventory.ops import Collective, CollectiveKind, Op, OpKind, ParallelDim
from paraplan.inventory.optimizer import optimizer_op, step_temporary_bytes
from paraplan.inventory.partition import (
    count_layers_per_stage,
    count_marked_layers_per_stage,
    count_moe_layers_per_stage,
)
from paraplan.inventory.recompute import recompute_cost
from paraplan.inventory.shapes import LocalShape, local_shape, shard_shape
from paraplan.inventory.sp_comm import traced_as_run
from paraplan.specs import FP8Recipe, Framework, Job, ModelSpec, ParallelPlan, Phase, Precision, Recompute


def adam_state_bytes(precision: Precision) -> float:
    """Bytes per parameter of Adam's state: fp32 first and second moments, plus an fp32
    master copy of the weights in mixed-precision training (fp32 training has none)."""
    return 8.0 if precision.full_width else 12.0


def param_bytes(precision: Precision) -> float:
    return 4.0 if precision.full_width else 2.0


def grad_bytes(job: Job) -> float:
    """Megatron-LM accumulates and reduces bf16 models' gradients in fp32 (it forces
    ``accumulate_allreduce_grads_in_fp32`` for bf16, and FP8 training runs with ``--bf16``);
    torchtitan's FSDP2 reduces in fp32 too (``mixed_precision_reduce = "float32"``); fp16
    models and DeepSpeed keep them in the model's dtype. ``grad_reduce_in_fp32`` overrides."""
    plan = job.parallel
    if plan.grad_reduce_in_fp32 is not None:
        return 4.0 if plan.grad_reduce_in_fp32 else param_bytes(job.precision)
    if job.precision in (Precision.BF16, Precision.FP8) and plan.framework is not Framework.DEEPSPEED:
        return 4.0
    return param_bytes(job.precision)


@dataclass(frozen=True, slots=True)
class LayerBlock:
    """``num_layers`` layers of one kind on a stage (dense, or mixture of experts), each
    running ``ops`` and ``collectives``."""

    num_layers: int
    ops: tuple[Op, ...]
    collectives: tuple[Collective, ...]
    moe: bool = False
    # a traced model's layer kind ("sliding_attention-dense@0"); "" for the hand-written kinds
    kind: str = ""

    @property
    def key(self) -> tuple[bool, str]:
        """What tells this block's kind of layer from a stage's other blocks'."""
        return self.moe, self.kind


@dataclass(frozen=True, slots=True)
class StageInventory:
    """One pipeline stage as one of its ranks sees it, for one micro-batch. ``params`` are
    the weights replicated over the data-parallel group, ``expert_params`` the experts' (this
    rank's share), replicated over the expert data-parallel group."""

    index: int
    blocks: tuple[LayerBlock, ...]
    end_ops: tuple[Op, ...]
    end_collectives: tuple[Collective, ...]
    params: float
    grad_sync: tuple[Collective, ...]
    per_microbatch_dp: tuple[Collective, ...]  # ZeRO-2/3 communication of every micro-batch
    optimizer: Op
    expert_params: float = 0.0
    # kernels on the data-parallel collectives' streams, in their chain (FSDP1's casts and
    # divides, ``inventory.fsdp1``): priced with ``per_microbatch_dp``
    side_kernels: tuple[Op, ...] = ()
    # bytes the optimizer step allocates on the GPU beside its states (torch foreach's
    # ``_foreach_sqrt`` list; ``inventory.optimizer.step_temporary_bytes``), none when it runs on the host
    step_temporaries: float = 0.0

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def num_layers(self) -> int:
        return sum(b.num_layers for b in self.blocks)

    @property
    def layer_ops(self) -> tuple[Op, ...]:
        """The operators of the stage's layer, when its layers are all of one kind."""
        return self._only().ops

    @property
    def layer_collectives(self) -> tuple[Collective, ...]:
        return self._only().collectives

    def _only(self) -> LayerBlock:
        if any(b.ops is not self.blocks[0].ops for b in self.blocks):
            raise ValueError("this stage mixes dense and mixture-of-experts layers: read its blocks")
        return self.blocks[0]

    def with_layers(self, n: int) -> StageInventory:
        """The stage with ``n`` layers of its one kind (parameters follow)."""
        block = self._only()
        per_layer, per_layer_experts = split_params(block.ops)
        delta = n - self.num_layers
        return dataclasses.replace(
            self,
            blocks=(dataclasses.replace(block, num_layers=n),),
            params=self.params + delta * per_layer,
            expert_params=self.expert_params + delta * per_layer_experts,
        )

    def ops(self) -> tuple[Op, ...]:
        """Every operator the stage runs for one micro-batch (layers repeated)."""
        out: tuple[Op, ...] = ()
        for b in self.blocks:
            out += b.ops * b.num_layers
        return out + self.end_ops


@dataclass(frozen=True, slots=True)
class JobInventory:
    job: Job
    shape: LocalShape
    stages: tuple[StageInventory, ...]
    p2p: Collective | None  # one activation forward, or its gradient backward
    p2p_mask: Collective | None  # what else each forward send carries (DeepSpeed: the mask)
    params_total: float
    model_flops_per_iteration: float
    hardware_flops_per_iteration: float
    params_active: float = 0.0  # those one token is computed with (MoE: its top-k experts)

    @property
    def executed_flops_per_iteration(self) -> float:
        """FLOPs the kernels of one iteration execute on all GPUs, activation recompute
        included, every operator (the hardware FLOPs count matrix multiplications only). No GPU
        runs them faster than its peak, so ``iteration_s`` is at least this over the GPUs'
        summed peak."""
        plan = self.job.parallel
        ranks = plan.tp * plan.dp * plan.cp
        phases = (Phase.FWD, Phase.BWD_INPUT, Phase.BWD_WEIGHT)

        def run(ops: tuple[Op, ...]) -> float:
            return sum(op.work(ph)[0] for op in ops for ph in phases)

        total = 0.0
        for st in self.stages:
            per_mb = run(st.end_ops)
            for b in st.blocks:
                weights = recompute_cost(plan, b.ops, self.shape, b.num_layers).op_weights
                again = sum(w * op.work(Phase.FWD)[0] for w, op in zip(weights, b.ops, strict=True))
                per_mb += b.num_layers * (run(b.ops) + again)
            total += ranks * (plan.num_microbatches * per_mb + st.optimizer.work(Phase.OPTIMIZER)[0])
        return total

    @property
    def param_bytes(self) -> float:
        return param_bytes(self.job.precision)

    @property
    def grad_bytes(self) -> float:
        return grad_bytes(self.job)


def _layer_params(ops: tuple[Op, ...]) -> float:
    return sum(op.params for op in ops)


_SPLIT: dict[int, tuple[tuple[Op, ...], tuple[float, float]]] = {}


def split_params(ops: tuple[Op, ...]) -> tuple[float, float]:
    """(weights replicated over the data-parallel group, the experts' weights) of ``ops``. A
    layer's operators are one tuple for every Job of a shape, and its inventory, memory and the
    plan screen each ask: the answer is kept by the tuple's identity (as ``recompute_cost``)."""
    hit = _SPLIT.get(id(ops))
    if hit is not None and hit[0] is ops:
        return hit[1]
    if len(_SPLIT) > 1024:
        _SPLIT.clear()
    experts = sum(op.params for op in ops if op.expert)
    split = (_layer_params(ops) - experts, experts)
    _SPLIT[id(ops)] = (ops, split)
    return split


def params_updated(job: Job, params: float, expert_params: float) -> float:
    """Parameters one GPU's optimizer steps: under ZeRO its shard of the stage's weights (the
    experts' over the expert data-parallel ranks), all of them without it."""
    plan = job.parallel
    if plan.zero_stage >= 1:
        # a dense stage's 0 / edp is 0.0: its group is not computed
        return params / plan.zero_shards + (expert_params / plan.edp if expert_params else 0.0)
    return params + expert_params


def _layers_of_kind(model: ModelSpec, x: LocalShape | None = None) -> dict[bool | str, int]:
    """How many of the model's layers are dense (False) and mixtures of experts (True); for a
    traced model, how many are of each traced kind."""
    if model.inventory == "traced" and x is not None:
        from paraplan.inventory.traced import traced_layer_indices

        return {kind: len(indices) for kind, indices in traced_layer_indices(model, x).items()}
    moe = sum(model.moe_layers)
    return {False: model.num_layers - moe, True: moe}


def kinds_per_stage(model: ModelSpec, plan: ParallelPlan, x: LocalShape) -> tuple[dict[bool | str, int], ...]:
    """Each stage's layers of each kind (``layer_kinds``' keys): dense and mixture-of-experts
    layers, or a traced model's kinds (Gemma-2's sliding and full attention, Nemotron-H's Mamba,
    attention and MLP layers), by the layers the stage holds."""
    split = count_layers_per_stage(model, plan)
    if model.inventory == "traced":
        from paraplan.inventory.traced import traced_layer_indices

        indices = traced_layer_indices(model, x)
        per_kind = {kind: count_marked_layers_per_stage(model, plan, [i in set(ix) for i in range(model.num_layers)])
                    for kind, ix in indices.items()}
        return tuple({kind: per_kind[kind][i] for kind in indices} for i in range(len(split)))
    moe = count_moe_layers_per_stage(model, plan)
    return tuple({False: n - m, True: m} for n, m in zip(split, moe, strict=True))


def _grad_sync(
    job: Job, params: float, grad_e: float, param_e: float, dim: ParallelDim = ParallelDim.DP
) -> tuple[Collective, ...]:
    """Once-per-iteration data-parallel communication (ZeRO-2/3 reduce per micro-batch:
    see ``_per_microbatch_dp``) over ``dim``: the data-parallel group, or for the experts'
    weights the expert data-parallel group. FSDP2 under a pipeline reduce-scatters ZeRO-2/3's
    gradients and gathers the weights once a step (``ParallelPlan.syncs_shards_once_per_step``),
    as ZeRO-1 does: the gather in the step's first forward, beside it."""
    if params <= 0:  # before the group: a dense stage's experts have none
        return ()
    zero, framework = job.parallel.zero_stage, job.parallel.framework
    group = job.parallel.grad_group if dim is ParallelDim.DP else job.parallel.edp
    if group == 1:
        return ()
    p = "dp" if dim is ParallelDim.DP else "edp"
    grads, weights = params * grad_e, params * param_e
    if zero == 0:
        return (Collective(f"{p}_allreduce", CollectiveKind.ALL_REDUCE, dim, grads, Phase.BWD_WEIGHT),)
    gather = Collective(f"{p}_allgather", CollectiveKind.ALL_GATHER, dim, weights, Phase.OPTIMIZER)
    replicas = _replicate_allreduce(job, grads) if dim is ParallelDim.DP else ()
    if zero == 1:
        if framework is Framework.DEEPSPEED:
            # DeepSpeed's pipeline engine all-reduces gradients, then ZeRO-1 all-gathers the
            # updated fp16 weights (the trace shows c10d::allreduce_ then all_gather).
            reduce = Collective(f"{p}_allreduce", CollectiveKind.ALL_REDUCE, dim, grads, Phase.BWD_WEIGHT)
        else:
            reduce = Collective(f"{p}_reducescatter", CollectiveKind.REDUCE_SCATTER, dim, grads, Phase.BWD_WEIGHT)
        return (reduce, *replicas, gather)
    if job.parallel.syncs_shards_once_per_step:
        reduce = Collective(f"{p}_reducescatter", CollectiveKind.REDUCE_SCATTER, dim, grads, Phase.BWD_WEIGHT)
        return (reduce, *replicas, gather)
    return (gather,) if zero == 2 else ()


def _duplicated_allreduce(job: Job, blocks: tuple[LayerBlock, ...], grad_e: float) -> tuple[Collective, ...]:
    """MLA's duplicated down projections and latent norms (``layer.DUPLICATED_ACROSS_TP``)
    under sequence parallelism: the tensor-parallel ranks all-reduce their gradients once per
    iteration (Megatron-Core's ``finalize_model_grads`` for sequence-parallel parameters)."""
    plan = job.parallel
    if plan.tp == 1 or not plan.sequence_parallel:
        return ()
    params = sum(b.num_layers * op.params for b in blocks for op in b.ops if op.name in DUPLICATED_ACROSS_TP)
    if params <= 0:
        return ()
    return (Collective("tp_allreduce_duplicated", CollectiveKind.ALL_REDUCE, ParallelDim.TP, params * grad_e,
                       Phase.BWD_WEIGHT),)


def _replicate_allreduce(job: Job, grads: float) -> tuple[Collective, ...]:
    """Hybrid sharding: after the reduce-scatter within its shard group, each rank all-reduces
    its gradient shard with the shard's replicas (FSDP HYBRID_SHARD)."""
    plan = job.parallel
    replicas = plan.grad_group // plan.zero_shards
    if replicas <= 1:
        return ()
    shard = grads / plan.zero_shards
    return (Collective("dp_replicate_allreduce", CollectiveKind.ALL_REDUCE, ParallelDim.DP_REPLICATE, shard, Phase.BWD_WEIGHT),)


def _per_microbatch_dp(
    job: Job, params: float, grad_e: float, param_e: float, dim: ParallelDim = ParallelDim.DP
) -> tuple[Collective, ...]:
    """ZeRO-2 and ZeRO-3 partition gradients, so every micro-batch's backward reduce-scatters
    them (DeepSpeed reduces "after every backward"); ZeRO-3 also all-gathers each layer's
    weights for the forward and again for the backward pass. Not FSDP2 under a pipeline,
    which does both once a step (``_grad_sync``)."""
    plan = job.parallel
    if plan.zero_stage < 2 or params <= 0 or plan.syncs_shards_once_per_step:
        return ()
    group = plan.grad_group if dim is ParallelDim.DP else plan.edp
    if group == 1:
        return ()
    p = "dp" if dim is ParallelDim.DP else "edp"
    out = [Collective(f"{p}_reducescatter", CollectiveKind.REDUCE_SCATTER, dim, params * grad_e, Phase.BWD_WEIGHT)]
    if dim is ParallelDim.DP:
        out += _replicate_allreduce(job, params * grad_e)
    if plan.zero_stage == 3:
        weights = params * param_e
        out += [
            Collective(f"{p}_allgather", CollectiveKind.ALL_GATHER, dim, weights, Phase.FWD),
            Collective(f"{p}_allgather", CollectiveKind.ALL_GATHER, dim, weights, Phase.BWD_INPUT),
        ]
    return tuple(out)


def _grad_accumulation(job: Job, layer_params: float) -> tuple[Op, ...]:
    """Adding each micro-batch's weight gradients to the accumulated ones, where the GEMMs do
    not (``ParallelPlan.fuses_gradient_accumulation``): read both, write the sum, for all but
    the first of the iteration's micro-batches (averaged over them, as every per-micro-batch
    time is)."""
    plan = job.parallel
    if plan.fuses_gradient_accumulation or plan.global_batch_size is None:
        return ()
    m = plan.num_microbatches
    traffic = 3.0 * grad_bytes(job) * layer_params * (m - 1) / m
    if traffic <= 0:
        return ()
    return (
        Op(
            name="grad_accumulate",
            kind=OpKind.ELEMENTWISE,
            role="add the micro-batch's weight gradients to .grad",
            flops=0.0,
            bytes=0.0,
            bwd_flops=layer_params * (m - 1) / m,
            bwd_bytes=traffic,
            bwd_weight_flops=layer_params * (m - 1) / m,
            bwd_weight_bytes=traffic,
            dims=(("params", int(layer_params)),),
            recomputable=False,
        ),
    )


def _copy_traffic(name: str, role: str, params: float, fwd_bytes: float, bwd_bytes: float) -> Op:
    """Bytes a framework moves around a layer's ``params`` weights (no arithmetic), which
    recomputing the layer does not move again."""
    return Op(
        name=name,
        kind=OpKind.ELEMENTWISE,
        role=role,
        flops=0.0,
        bytes=fwd_bytes,
        bwd_flops=0.0,
        bwd_bytes=bwd_bytes,
        dims=(("params", int(params)),),
        recomputable=False,
    )


def fp8_weight_params(layer_ops: tuple[Op, ...]) -> float:
    """Weights of one layer that FP8 GEMMs read (each has an FP8 copy and its transpose)."""
    return sum(op.params for op in layer_ops if op.fp8)


def _fp8_weight_casts(job: Job, layer_ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """Casting the FP8 layers' weights to FP8 and transposing them once per iteration (delayed
    scaling: read e bytes, write 1 + 1; the other recipes' kernels in ``inventory.fp8``):
    Transformer Engine keeps the FP8 weights for the iteration's later micro-batches
    (``is_first_microbatch``), so each micro-batch carries 1/m of it."""
    params = fp8_weight_params(layer_ops)
    if params <= 0 or job.parallel.global_batch_size is None:
        return ()
    e = param_bytes(job.precision)
    recipe = job.parallel.fp8_recipe
    if recipe is None or recipe is FP8Recipe.DELAYED:
        per_param = e + 2.0  # today's arithmetic, to the last bit
    else:
        costs = recipe_costs(recipe)
        per_param = costs.weight_reads * e + costs.weight_writes
        if not costs.weights_cached:  # cast again by every micro-batch
            per_param *= job.parallel.num_microbatches
    traffic = per_param * params / job.parallel.num_microbatches
    role = "FP8 copies of the weights and their transposes, once per iteration"
    return (_copy_traffic("fp8_weight_cast", role, params, traffic, 0.0),)


def _fsdp2_copies(job: Job, layer_params: float) -> tuple[Op, ...]:
    """FSDP2 (``fully_shard``) with ZeRO-3: each gathered layer is copied out of the all-gather
    buffer into its parameters (``split_with_sizes_copy``: read and write the unsharded
    weights), in the forward and again in the backward after resharding, and its gradients are
    copied into the reduce-scatter buffer in the reduce dtype (``_chunk_cat``: read them, write
    them in fp32 or bf16), every micro-batch. Under a pipeline each is done once a step
    (``ParallelPlan.syncs_shards_once_per_step``): the copy-out in the first forward, the
    copy-in at the last backward, each micro-batch carrying 1/m of them."""
    plan = job.parallel
    if plan.framework is not Framework.FSDP or (plan.fsdp_version or 2) != 2:
        return ()
    if plan.zero_stage < 3 or plan.zero_shards == 1:
        return ()
    e = param_bytes(job.precision)
    copy_out = 2.0 * e * layer_params
    copy_in = (e + grad_bytes(job)) * layer_params
    role = "FSDP2 copy-out of gathered weights, copy-in of gradients to reduce"
    if plan.syncs_shards_once_per_step and plan.global_batch_size is not None:
        m = plan.num_microbatches
        return (_copy_traffic("fsdp_copy", role + ", once per step", layer_params, copy_out / m, copy_in / m),)
    return (_copy_traffic("fsdp_copy", role, layer_params, copy_out, copy_out + copy_in),)


def _weight_tensors(job: Job, blocks: tuple[LayerBlock, ...], ends: bool) -> int:
    """Tensors in the optimizer's lists on a stage (what its per-tensor and multi-tensor kernels
    launch by): FSDP1's flat parameters, one per transformer block and one for the root's
    embedding, final norm and head; otherwise one per weighted operator of each layer and the ends."""
    if runs_fsdp1(job):
        return sum(b.num_layers for b in blocks) + (1 if ends else 0)
    return sum(b.num_layers * sum(1 for op in b.ops if op.params) for b in blocks) + (2 if ends else 0)


def _unsharded(job: Job) -> LocalShape:
    plan = job.parallel
    return shard_shape(job.model, 1, 1, False, plan.micro_batch_size, job.precision)


# Kinds whose FLOPs the usual model-FLOPs count holds: the matrix multiplications
# (Megatron-LM's and torchtitan's MFU formulas count nothing else).
_MATMUL_KINDS = (OpKind.GEMM, OpKind.BMM, OpKind.ATTENTION)
# the products of queries with keys and of scores with values (flash, or unfused as two BMMs)
_SCORE_KINDS = (OpKind.BMM, OpKind.ATTENTION)


def _model_flops(op: Op) -> float:
    """Forward FLOPs of ``op`` the model needs: a causal model's score products need only the
    unmasked half of the square (the models paraplan describes are causal decoders)."""
    return op.flops * (0.5 if op.kind in _SCORE_KINDS else 1.0)


def _executed_flops(op: Op, forward: float = 1.0, backward: float = 1.0) -> float:
    """FLOPs the kernel of ``op`` runs: flash attention skips the masked half
    (``exec_fraction``), an unfused kernel computes the whole square and masks it."""
    return (forward * op.flops + backward * op.bwd_flops) * op.exec_fraction


def _count_flops(job: Job, x: LocalShape, kinds: dict[bool, tuple[Op, ...]]) -> tuple[float, float]:
    """Model and hardware FLOPs of one iteration, summed over every layer of the whole model
    (``x`` is the unsharded shape).

    Model FLOPs follow the definition Megatron-LM prints MFU with (``num_floating_point_
    operations`` in ``megatron/training/training.py``, also NeMo's and MaxText's): the matrix
    multiplications only, three times their forward FLOPs (the backward pass computes two
    gradients per forward product), causal attention's unmasked half of the square:
    72 B s l h^2 (1 + s/12h + V/12lh) for GPT. Narayanan et al. 2021 and torchtitan count the
    whole square (s/6h), which lets MFU pass 100 % at long sequences. Hardware FLOPs (HFU) are
    the matrix-multiplication FLOPs the kernels execute: half the square for flash attention,
    all of it for unfused attention, FlashAttention's backward recomputation of the scores
    (``bwd_flops`` of the attention core) and the forward passes activation recompute repeats.
    So MFU <= HFU <= 1 on every valid job."""
    model, plan = job.model, job.parallel
    per_mb_model, per_mb_executed = _whole_model(model, x)[2:]
    recomputed = 0.0  # per micro-batch, over every stage's layers
    if plan.recompute is not Recompute.NONE:
        split = (tuple(sorted(c.items(), key=repr)) for c in kinds_per_stage(model, plan, x))
        for counts, stages in Counter(split).items():
            for moe, layer in kinds.items():
                k = dict(counts).get(moe, 0)
                if k == 0:
                    continue
                weights = recompute_cost(plan, layer, x, k).op_weights
                recomputed += stages * k * sum(
                    _executed_flops(op, w, 0.0) for w, op in zip(weights, layer, strict=True) if op.kind in _MATMUL_KINDS
                )
    micro_batches = plan.global_batch_size // plan.micro_batch_size
    return per_mb_model * micro_batches, (per_mb_executed + recomputed) * micro_batches


@functools.lru_cache(maxsize=256)
def _whole_model(model: ModelSpec, x: LocalShape) -> tuple[float, float, float, float]:
    """What a job's plan does not change, for the unsharded shape ``x`` (one micro-batch of
    the whole model): (parameters, active parameters, model FLOPs and executed matrix FLOPs
    of one micro-batch without recompute). Every job of a plan search with the same model and
    micro-batch shares it."""
    kinds = layer_kinds(model, x)
    ends = count_embedding_ops(model, x) + count_head_ops(model, x) + count_mtp_ops(model, x)
    ends_mm = tuple(op for op in ends if op.kind in _MATMUL_KINDS)
    per_mb_model = 3.0 * sum(map(_model_flops, ends_mm))
    per_mb_executed = sum(map(_executed_flops, ends_mm))
    counts = _layers_of_kind(model, x)
    for moe, layer in kinds.items():
        n = counts[moe]
        layer_mm = tuple(op for op in layer if op.kind in _MATMUL_KINDS)
        per_mb_model += 3.0 * n * sum(map(_model_flops, layer_mm))
        per_mb_executed += n * sum(map(_executed_flops, layer_mm))
    return (_params(model, x, kinds=kinds), _params(model, x, active=True, kinds=kinds), per_mb_model,
            per_mb_executed)


def _is_moe(key: bool | str) -> bool:
    """Whether a ``layer_kinds`` key is a mixture-of-experts layer: True for the hand-written
    MoE kind, a traced kind whose label says so (``traced.is_moe_label``)."""
    if isinstance(key, str):
        from paraplan.inventory.traced import is_moe_label

        return is_moe_label(key)
    return key is True


def layer_kinds(model: ModelSpec, x: LocalShape) -> dict[bool, tuple[Op, ...]]:
    """The operators of each kind of layer the model has, keyed by whether it is a mixture
    of experts (a dense model: one kind; DeepSeek-V3, first dense layers then MoE: two)."""
    if model.inventory == "traced":
        from paraplan.inventory.traced import traced_layers

        return {kind: ops for kind, (ops, _) in traced_layers(model, x).items()}
    moe = model.moe_layers
    kinds = {}
    if not all(moe):
        kinds[False] = count_layer_ops(model, x)
    if any(moe):
        kinds[True] = count_moe_layer_ops(model, x)
    return kinds


def _params(
    model: ModelSpec, x: LocalShape, *, active: bool = False, kinds: dict[bool, tuple[Op, ...]] | None = None
) -> float:
    """Parameters of the whole model held at shape ``x`` (tied embedding counted once);
    ``active``: those one token passes through (of the routed experts, its top-k)."""
    counts = _layers_of_kind(model, x)
    total = 0.0
    for moe, layer in (kinds or layer_kinds(model, x)).items():
        dense, experts = split_params(layer)
        if active and experts:
            experts *= model.moe_router_topk / model.num_moe_experts
        total += counts[moe] * (dense + experts)
    dense, experts = split_params(count_mtp_ops(model, x))  # the multi-token-prediction modules
    total += dense + (experts * model.moe_router_topk / model.num_moe_experts if active and experts else experts)
    embedding, head = _layer_params(count_embedding_ops(model, x)), _layer_params(count_head_ops(model, x))
    if active and model.active_params_count_embedding is False:
        # the authors count a token's active parameters without the input embedding's table
        # (gpt-oss: the unembedding only); a tied head's weight is the table, counted once
        return total + embedding - tied_weight(model, x) + head
    total += embedding + head
    if not model.untie_embeddings_and_output_weights:
        total -= tied_weight(model, x)
    return total


def count_params(job: Job) -> float:
    """Total parameters of the model (a tied LM head shares the embedding's weight)."""
    return _params(job.model, _unsharded(job))


def count_active_params(job: Job) -> float:
    """Parameters one token is computed with: all of a dense model's, a mixture of experts'
    without the routed experts it is not sent to (Mixtral 8x7B: 12.9B of 46.7B), in its authors'
    convention: with the input embedding (Mistral, Qwen, DeepSeek: the default) or without it
    (``active_params_count_embedding: false``; gpt-oss-120b's 5.13B)."""
    return _params(job.model, _unsharded(job), active=True)


def count_end_ops(job: Job, x: LocalShape, *, first: bool, last: bool) -> tuple[Op, ...]:
    """The operators a stage runs besides its layers: the embedding on the first stage, the
    LM head and loss on the last, each with its gradient accumulation."""
    out: tuple[Op, ...] = ()
    for has, count in ((first, count_embedding_ops), (last, count_head_ops), (last, count_mtp_ops)):
        if has:
            ops = count(job.model, x)
            if count is count_head_ops:
                ops = chunked_loss(job.parallel, x, dtensor_gathered_inputs(job.parallel, x, ops))
            out += ops + _grad_accumulation(job, _layer_params(ops))
    return out


def count_job(job: Job) -> JobInventory:
    """The inventory every estimate reads: FLOPs, bytes, params, activations, collectives."""
    model, plan = job.model, job.parallel
    x = local_shape(model, plan, job.precision)
    kinds: dict[bool, tuple[tuple[Op, ...], tuple[Collective, ...], float, float]] = {}
    param_e, grad_e = param_bytes(job.precision), grad_bytes(job)
    for moe, ops in layer_kinds(model, x).items():
        coll = count_moe_collectives(model, plan, x) if _is_moe(moe) else count_layer_collectives(model, plan, x)
        if model.inventory == "traced":
            from paraplan.inventory.traced import traced_layers

            coll = traced_as_run(plan, x, traced_layers(model, x)[moe][1]) + tuple(
                c for c in coll if c.dim is not ParallelDim.TP or c.name == "tp_allgather_checkpoint")
        dense_p, expert_p = split_params(ops)
        ops = dtensor_gathered_inputs(plan, x, ops)
        ops += _grad_accumulation(job, dense_p + expert_p) + _fp8_weight_casts(job, ops)
        ops += _fsdp2_copies(job, dense_p + expert_p) + fsdp1_grad_flatten(job, dense_p + expert_p, param_e)
        kinds[moe] = (ops, coll, dense_p, expert_p)
    emb_ops, head_ops = count_embedding_ops(model, x), count_head_ops(model, x)
    split = count_layers_per_stage(model, plan)
    per_stage = kinds_per_stage(model, plan, x)
    last = plan.pp - 1
    stages = []
    # a stage is fixed by its layers of each kind and whether it holds an end: the stages
    # alike (most of a deep pipeline's middle) are counted once
    alike: dict[tuple, StageInventory] = {}
    for i, _n_layers in enumerate(split):
        counts = per_stage[i]
        same = (tuple(sorted(counts.items(), key=repr)), i == 0, i == last)
        seen = alike.get(same)
        if seen is not None:
            stages.append(dataclasses.replace(seen, index=i))
            continue
        blocks = tuple(
            LayerBlock(counts.get(moe, 0), ops, coll, _is_moe(moe), moe if isinstance(moe, str) else "")
            for moe, (ops, coll, _, _) in kinds.items() if counts.get(moe, 0)
        )
        params = sum(counts.get(moe, 0) * k[2] for moe, k in kinds.items())
        expert_params = sum(counts.get(moe, 0) * k[3] for moe, k in kinds.items())
        end_ops = count_end_ops(job, x, first=i == 0, last=i == last)
        if i == 0:
            params += _layer_params(emb_ops)
        if i == last:
            params += _layer_params(head_ops)
            if plan.pp == 1 and not model.untie_embeddings_and_output_weights:
                params -= tied_weight(model, x)  # the LM head reuses the embedding's weight
            mtp_dense, mtp_experts = split_params(count_mtp_ops(model, x))
            params += mtp_dense
            expert_params += mtp_experts
            if mtp_dense and plan.pp > 1 and model.untie_embeddings_and_output_weights:
                params += tied_weight(model, x)  # the MTP modules' own copy of the embedding table
        grad_sync = _grad_sync(job, params, grad_e, param_e)
        grad_sync += _grad_sync(job, expert_params, grad_e, param_e, ParallelDim.EDP)
        grad_sync += _duplicated_allreduce(job, blocks, grad_e)
        if (not model.untie_embeddings_and_output_weights or model.mtp_num_layers) and plan.pp > 1 and i in (0, last):
            grad_sync += (
                Collective("embedding_allreduce", CollectiveKind.ALL_REDUCE, ParallelDim.PP, tied_weight(model, x) * grad_e, Phase.BWD_WEIGHT),
            )
        updated = params_updated(job, params, expert_params)
        stages.append(
            StageInventory(
                index=i,
                blocks=blocks,
                end_ops=end_ops,
                end_collectives=count_end_collectives(model, plan, x, first=i == 0, last=i == last),
                params=params,
                grad_sync=grad_sync,
                per_microbatch_dp=_per_microbatch_dp(job, params, grad_e, param_e)
                + _per_microbatch_dp(job, expert_params, grad_e, param_e, ParallelDim.EDP),
                optimizer=optimizer_op(updated, grad_e, param_e, adam_state_bytes(job.precision),
                                       impl=plan.optimizer_impl, clip_scale=plan.grad_clip_scale,
                                       fsdp1=runs_fsdp1(job), tensors=_weight_tensors(job, blocks, i in (0, last))),
                expert_params=expert_params,
                side_kernels=fsdp1_side_kernels(job, params, sum(counts.values()), param_e, grad_e),
                step_temporaries=0.0 if plan.offload_optimizer != "none" else step_temporary_bytes(
                    updated, plan.optimizer_impl),
            )
        )
        alike[same] = stages[-1]
    p2p = mask = None
    if plan.pp > 1:
        # The [s/cp, b, h] activation, or one 1/tp slice of it that the receiving stage
        # all-gathers (sequence parallelism, DeepSpeed, Megatron-LM's 2021 scatter-gather).
        message = x.e * x.tokens * x.h / (plan.tp if plan.scatters_p2p else 1)
        p2p = Collective("pp_p2p", CollectiveKind.SEND_RECV, ParallelDim.PP, message, Phase.FWD)
        if plan.sends_pipeline_mask:
            # [1, 1, s, s] cast to fp16 whatever the training precision (``.half()``)
            mask_bytes = 2.0 * job.model.seq_length**2
            mask = Collective("pp_p2p_mask", CollectiveKind.SEND_RECV, ParallelDim.PP, mask_bytes, Phase.FWD)
    full = _unsharded(job)
    full_kinds = layer_kinds(model, full) if plan.recompute is not Recompute.NONE else {}
    model_flops, hardware_flops = _count_flops(job, full, full_kinds)
    params_total, params_active = _whole_model(model, full)[:2]
    return JobInventory(
        job=job,
        shape=x,
        stages=tuple(stages),
        p2p=p2p,
        p2p_mask=mask,
        params_total=params_total,
        params_active=params_active,
        model_flops_per_iteration=model_flops,
        hardware_flops_per_iteration=hardware_flops,
    )
