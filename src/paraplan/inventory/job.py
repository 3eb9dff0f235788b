"""The whole job's inventory: per pipeline stage, the operators and collectives of one rank."""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.inventory.ends import count_embedding_ops, count_end_collectives, count_head_ops
from paraplan.inventory.layer import count_layer_collectives, count_layer_ops
from paraplan.inventory.ops import Collective, CollectiveKind, Op, OpKind, ParallelDim
from paraplan.inventory.partition import count_layers_per_stage
from paraplan.inventory.shapes import LocalShape, local_shape, shard_shape
from paraplan.specs import Framework, Job, Phase, Precision, Recompute

# Bytes per parameter of the fp32 Adam state kept by mixed-precision training:
# master weights, first and second moments.
ADAM_STATE_BYTES = 12.0


@dataclass(frozen=True, slots=True)
class StageInventory:
    """One pipeline stage as one of its ranks sees it, for one micro-batch."""

    index: int
    num_layers: int
    layer_ops: tuple[Op, ...]
    layer_collectives: tuple[Collective, ...]
    end_ops: tuple[Op, ...]
    end_collectives: tuple[Collective, ...]
    params: float
    grad_sync: tuple[Collective, ...]
    zero3_collectives: tuple[Collective, ...]
    optimizer: Op

    @property
    def first(self) -> bool:
        return self.index == 0

    def ops(self) -> tuple[Op, ...]:
        """Every operator the stage runs for one micro-batch (layers repeated)."""
        return self.layer_ops * self.num_layers + self.end_ops


@dataclass(frozen=True, slots=True)
class JobInventory:
    job: Job
    shape: LocalShape
    stages: tuple[StageInventory, ...]
    p2p: Collective | None
    params_total: float
    model_flops_per_iteration: float
    hardware_flops_per_iteration: float

    @property
    def param_bytes(self) -> float:
        return 4.0 if self.job.precision is Precision.FP32 else 2.0

    @property
    def grad_bytes(self) -> float:
        """Megatron-LM accumulates and reduces gradients in fp32; DeepSpeed in the model dtype."""
        if self.job.parallel.framework is Framework.MEGATRON:
            return 4.0
        return self.param_bytes


def _layer_params(ops: tuple[Op, ...]) -> float:
    return sum(op.params for op in ops)


def _grad_sync(job: Job, params: float, grad_e: float, param_e: float) -> tuple[Collective, ...]:
    zero, framework = job.parallel.zero_stage, job.parallel.framework
    if job.parallel.dp == 1:
        return ()
    grads, weights = params * grad_e, params * param_e
    if zero == 0:
        return (Collective("dp_allreduce", CollectiveKind.ALL_REDUCE, ParallelDim.DP, grads, Phase.BWD_WEIGHT),)
    if zero == 1 and framework is Framework.DEEPSPEED:
        # DeepSpeed's pipeline engine all-reduces gradients, then ZeRO-1 all-gathers the
        # updated fp16 weights (the trace shows c10d::allreduce_ then all_gather).
        reduce = Collective("dp_allreduce", CollectiveKind.ALL_REDUCE, ParallelDim.DP, grads, Phase.BWD_WEIGHT)
    else:
        reduce = Collective("dp_reducescatter", CollectiveKind.REDUCE_SCATTER, ParallelDim.DP, grads, Phase.BWD_WEIGHT)
    if zero == 3:
        return (reduce,)
    return (reduce, Collective("dp_allgather", CollectiveKind.ALL_GATHER, ParallelDim.DP, weights, Phase.OPTIMIZER))


def _optimizer_op(params_updated: float, grad_e: float, param_e: float) -> Op:
    """Adam step over the parameters this rank owns: reads the gradient, reads and writes the
    fp32 master weight and both moments, writes the model-dtype weight."""
    traffic = params_updated * (grad_e + 2 * ADAM_STATE_BYTES + param_e)
    return Op(
        name="optimizer",
        kind=OpKind.OPTIMIZER,
        role="Adam step (fused, mixed precision)",
        flops=12.0 * params_updated,
        bytes=traffic,
        bwd_flops=0.0,
        bwd_bytes=0.0,
        dims=(("params", int(params_updated)),),
    )


def _unsharded(job: Job) -> LocalShape:
    plan = job.parallel
    return shard_shape(job.model, 1, 1, False, plan.micro_batch_size, job.precision)


def _count_flops(job: Job, x: LocalShape) -> tuple[float, float]:
    """Model and hardware FLOPs of one iteration, summed over every layer of the whole model
    (``x`` is the unsharded shape), counting attention as the full square as the literature
    does. Hardware FLOPs add the recomputed forward passes."""
    model, plan = job.model, job.parallel
    layer = count_layer_ops(model, x)
    ends = count_embedding_ops(model, x) + count_head_ops(model, x)
    per_mb_model = sum(op.flops + op.bwd_flops for op in layer) * model.num_layers
    per_mb_model += sum(op.flops + op.bwd_flops for op in ends if op.kind is not OpKind.EMBEDDING)
    if plan.recompute is Recompute.FULL:
        recomputed = sum(op.flops for op in layer)
    elif plan.recompute is Recompute.SELECTIVE:
        recomputed = sum(op.flops for op in layer if op.selective_recompute)
    else:
        recomputed = 0.0
    micro_batches = plan.global_batch_size // plan.micro_batch_size
    hardware = (per_mb_model + recomputed * model.num_layers) * micro_batches
    return per_mb_model * micro_batches, hardware


def _params(model, x: LocalShape) -> float:
    """Parameters of the whole model held at shape ``x`` (tied embedding counted once)."""
    total = _layer_params(count_layer_ops(model, x)) * model.num_layers
    total += _layer_params(count_embedding_ops(model, x)) + _layer_params(count_head_ops(model, x))
    if not model.untie_embeddings_and_output_weights:
        total -= x.vocab * x.h
    return total


def count_params(job: Job) -> float:
    """Total parameters of the model (a tied LM head shares the embedding's weight)."""
    return _params(job.model, _unsharded(job))


def count_job(job: Job) -> JobInventory:
    """The inventory every estimate reads: FLOPs, bytes, params, activations, collectives."""
    model, plan = job.model, job.parallel
    x = local_shape(model, plan, job.precision)
    layer_ops = count_layer_ops(model, x)
    layer_coll = count_layer_collectives(model, plan, x)
    layer_params = _layer_params(layer_ops)
    emb_ops, head_ops = count_embedding_ops(model, x), count_head_ops(model, x)
    param_e = 4.0 if job.precision is Precision.FP32 else 2.0
    grad_e = 4.0 if plan.framework is Framework.MEGATRON else param_e
    split = count_layers_per_stage(model, plan)
    last = plan.pp - 1
    stages = []
    for i, n_layers in enumerate(split):
        end_ops: tuple[Op, ...] = ()
        params = layer_params * n_layers
        if i == 0:
            end_ops += emb_ops
            params += _layer_params(emb_ops)
        if i == last:
            end_ops += head_ops
            params += _layer_params(head_ops)
            if plan.pp == 1 and not model.untie_embeddings_and_output_weights:
                params -= x.vocab * x.h  # the LM head reuses the embedding's weight
        grad_sync = _grad_sync(job, params, grad_e, param_e)
        if not model.untie_embeddings_and_output_weights and plan.pp > 1 and i in (0, last):
            grad_sync += (
                Collective("embedding_allreduce", CollectiveKind.ALL_REDUCE, ParallelDim.PP, x.vocab * x.h * grad_e, Phase.BWD_WEIGHT),
            )
        zero3: tuple[Collective, ...] = ()
        if plan.zero_stage == 3 and plan.dp > 1:
            weights = params * param_e
            zero3 = (
                Collective("dp_allgather", CollectiveKind.ALL_GATHER, ParallelDim.DP, weights, Phase.FWD),
                Collective("dp_allgather", CollectiveKind.ALL_GATHER, ParallelDim.DP, weights, Phase.BWD_INPUT),
            )
        updated = params / plan.dp if plan.zero_stage >= 1 else params
        stages.append(
            StageInventory(
                index=i,
                num_layers=n_layers,
                layer_ops=layer_ops,
                layer_collectives=layer_coll,
                end_ops=end_ops,
                end_collectives=count_end_collectives(model, plan, x, first=i == 0, last=i == last),
                params=params,
                grad_sync=grad_sync,
                zero3_collectives=zero3,
                optimizer=_optimizer_op(updated, grad_e, param_e),
            )
        )
    p2p = None
    if plan.pp > 1:
        # Megatron-LM (scatter-gather) and DeepSpeed (partitioned activations) both send one
        # 1/tp slice of the [s, b, h] activation and all-gather it inside the receiving stage.
        message = x.e * x.tokens * x.h / plan.tp
        p2p = Collective("pp_p2p", CollectiveKind.SEND_RECV, ParallelDim.PP, message, Phase.FWD)
    full = _unsharded(job)
    model_flops, hardware_flops = _count_flops(job, full)
    return JobInventory(
        job=job,
        shape=x,
        stages=tuple(stages),
        p2p=p2p,
        params_total=_params(model, full),
        model_flops_per_iteration=model_flops,
        hardware_flops_per_iteration=hardware_flops,
    )
