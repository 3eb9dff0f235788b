"""FSDP1 (``torch.distributed.fsdp.FullyShardedDataParallel``, flat parameters) as torch runs it:
the kernels it adds around each FSDP unit's all-gather and reduce-scatter, on the stream each runs on.

Read from torch 2.1-2.2's ``torch/distributed/fsdp`` (the fms-fsdp and Composer stacks of 2023-24):

- ``_flat_param.py`` ``FlatParamHandle.pre_unshard`` / ``_use_low_precision_shard``: with
  ``MixedPrecision(param_dtype=bf16)`` every unshard first casts the fp32 flat shard into the bf16
  ``_mp_shard`` (read 4 B, write 2 B per shard element) on the ``pre_unshard`` stream, and the
  ``unshard`` stream waits for it before ``all_gather_into_tensor`` writes the padded unsharded flat
  parameter (the weights are views of it: no copy-out, unlike FSDP2). FULL_SHARD and HYBRID_SHARD
  reshard after forward, so the backward's unshard casts again.
- ``_flat_param.py`` ``_get_unflat_views``: the weights are ``torch.split`` views of the flat
  parameter, so autograd's ``SplitWithSizesBackward`` concatenates the unit's weight gradients into
  one flat gradient (``CatArrayBatchedCopy``: read and write the unsharded gradient) on the
  computation stream before the post-backward hook fires.
- ``_runtime_utils.py`` ``_post_backward_hook`` on the ``post_backward`` stream (which waits for the
  computation stream): a cast of the unsharded gradient to ``reduce_dtype`` when it differs from
  ``param_dtype``; ``default_hooks.reduce_scatter_hook``: ``_div_if_needed`` by the predivide factor
  (``DefaultState._get_gradient_predivide_factor``) over
  the unsharded gradient, ``reduce_scatter_tensor``, the postdivide (N / f) over the shard;
  HYBRID_SHARD: ``default_hooks.allreduce_hook`` over the replicas (its own pre/post divides on the
  shard); ``_cast_grad_to_param_dtype``: the reduced shard cast to the fp32 parameter's dtype.
- ``_runtime_utils.py`` ``_unshard`` with ``limit_all_gathers`` (``_limiter_utils._FreeEventQueue``,
  capacity 2): the CPU blocks on the free event of the unit two back before it issues an all-gather,
  so at most two unsharded units exist and each all-gather runs ahead of the computation by one
  unit (forward: no ``forward_prefetch``; backward: ``BackwardPrefetch.BACKWARD_PRE`` issues the
  next unit's all-gather before this unit's gradient kernels). ``schedule.overlap.sharded_pass_s``
  is that one-unit-ahead overlap; ``_post_backward_final_callback`` makes the computation stream
  wait for the ``post_backward`` stream, the last unit's reduction exposed.

The side-stream kernels (casts and divides) are in the gather's and the reduction's chain: the
all-gather (or reduce-scatter) of a unit cannot start before them, so they are priced with the
unit's collectives (``prediction.stages.per_microbatch_dp_s``), one launch per unit.
"""

from __future__ import annotations

from paraplan.inventory.kernel_mixes import VECTORIZED
from paraplan.inventory.ops import Op, OpKind
from paraplan.specs import Framework, Job

FP32 = 4.0


def runs_fsdp1(job: Job) -> bool:
    """Whether the job runs FSDP1's flat parameters sharded over more than one rank (ZeRO-3)."""
    plan = job.parallel
    return (plan.framework is Framework.FSDP and plan.fsdp_version == 1 and plan.zero_stage >= 3
            and plan.zero_shards > 1)


def predivide_factor(world_size: int) -> int:
    """``DefaultState._get_gradient_predivide_factor``: a power of two f doubled while it divides N
    and N / f > f (8 ranks: 4, then 2 after the reduction; 2 ranks: 2, then 1; 96 ranks: 16, then 6)."""
    factor = 1
    while world_size % factor == 0 and world_size / factor > factor:
        factor *= 2
    return factor


def _divides(world_size: int) -> tuple[bool, bool]:
    """Whether the hook divides before the reduction and after it (``_div_if_needed``: only a
    factor above 1 launches a kernel)."""
    pre = predivide_factor(world_size)
    return pre > 1, world_size / pre > 1


def fsdp1_grad_flatten(job: Job, layer_params: float, param_e: float) -> tuple[Op, ...]:
    """The backward's concatenation of one unit's weight gradients into its flat gradient
    (``SplitWithSizesBackward``), on the computation stream: read and write ``param_e`` bytes per
    weight, every micro-batch."""
    if not runs_fsdp1(job) or layer_params <= 0:
        return ()
    traffic = 2.0 * param_e * layer_params
    return (Op(name="fsdp1_grad_flatten", kind=OpKind.ELEMENTWISE,
               role="FSDP1: weight gradients concatenated into the flat gradient (split's backward)",
               flops=0.0, bytes=0.0, bwd_flops=0.0, bwd_bytes=traffic, dims=(("params", int(layer_params)),),
               recomputable=False),)


def fsdp1_side_kernels(job: Job, params: float, units: int, param_e: float, grad_e: float) -> tuple[Op, ...]:
    """The kernels FSDP1 runs on its side streams for ``units`` FSDP units holding ``params``
    weights together (one launch per unit), every micro-batch: the cast of the fp32 shard before
    each all-gather (forward bytes, and backward bytes again after resharding), and the post-backward
    stream's casts and divides around the reduce-scatter and HYBRID_SHARD's all-reduce (backward)."""
    if not runs_fsdp1(job) or params <= 0:
        return ()
    plan = job.parallel
    n = plan.zero_shards
    shard = params / n
    units = max(1, int(units))
    out = []
    if param_e < FP32:  # MixedPrecision(param_dtype): the low-precision shard, before every all-gather
        cast = shard * (FP32 + param_e)
        out.append(Op(name="fsdp1_shard_cast", kind=OpKind.ELEMENTWISE,
                      role="FSDP1: fp32 shard cast to the compute dtype before each all-gather",
                      flops=0.0, bytes=cast, bwd_flops=0.0, bwd_bytes=cast, dims=(("params", int(shard)),),
                      recomputable=False, launches=units, memory_kernels=VECTORIZED))
    kernels: list[float] = []  # bytes of each kernel of one unit's reduction chain, over all units
    if grad_e != param_e:  # flat_param.grad.to(reduce_dtype)
        kernels.append(params * (param_e + grad_e))
    pre, post = _divides(n)
    kernels += [params * 2.0 * grad_e] * pre + [shard * 2.0 * grad_e] * post
    replicas = plan.grad_group // n
    if replicas > 1:  # HYBRID_SHARD: allreduce_hook over the replicas, its divides on the shard
        kernels += [shard * 2.0 * grad_e] * sum(_divides(replicas))
    if grad_e != FP32:  # _cast_grad_to_param_dtype: the reduced shard to the fp32 parameter's dtype
        kernels.append(shard * (grad_e + FP32))
    if kernels:
        out.append(Op(name="fsdp1_reduce_kernels", kind=OpKind.ELEMENTWISE,
                      role="FSDP1: gradient casts and pre/post divides around the reduce-scatter",
                      flops=0.0, bytes=0.0, bwd_flops=0.0, bwd_bytes=sum(kernels), dims=(("params", int(params)),),
                      recomputable=False, launches=units * len(kernels)))
    return tuple(out)
