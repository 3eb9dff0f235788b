"""The optimizer step's kernels: gradient clipping and Adam over the parameters a rank updates.

Two implementations of Adam differ by a factor of about three in the bytes they move
(``ParallelPlan.optimizer_impl``):

- ``fused`` (the default; Megatron-LM's and NeMo's Apex / Transformer Engine FusedAdam, torch's
  ``fused=True``): one pass reads the gradient and the fp32 state (moments, master weight) and
  writes the state back, and the weight in the compute dtype where the framework keeps a copy.
- ``foreach`` (torch.optim's own default, ``torch/optim/adamw.py`` of torch 2.2-2.4: ``adamw()``
  picks ``_multi_tensor_adamw`` when neither ``foreach`` nor ``fused`` is given): eight
  ``torch._foreach_*`` passes over the fp32 shard, each its own multi_tensor_apply kernels:
  ``_foreach_mul_(params, 1 - lr * wd)`` (read and write p), ``_foreach_lerp_(exp_avgs, grads)``
  (m, g; write m), ``_foreach_mul_(exp_avg_sqs, beta2)`` (v; write v),
  ``_foreach_addcmul_(exp_avg_sqs, grads, grads)`` (v, g -- its second read of g hits the cache;
  write v), ``_foreach_sqrt(exp_avg_sqs)`` (v; write a new list s), ``_foreach_div_(s, bc2)`` and
  ``_foreach_add_(s, eps)`` (read and write s each), ``_foreach_addcdiv_(params, exp_avgs, s)``
  (p, m, s; write p): 72 bytes per parameter plus two reads of the gradient, 80 with fp32
  gradients. The step counters are CPU tensors (not capturable): no GPU work.

``multi_tensor_apply`` (``aten/src/ATen/native/cuda/MultiTensorApply.cuh``) launches a kernel
each time 320 blocks of 65,536 elements (``depth_to_max_blocks``, ``kChunkSize``) or a list
depth's tensor limit (``depth_to_max_tensors`` 110, 64, 48, 36 for 1-4 lists) fill up.

Gradient clipping: the norm is one read of the gradients (every framework clips by default:
Megatron-LM ``--clip-grad 1.0``, torchtitan ``max_norm 1.0``, fms-fsdp ``grad_clip_thresh 1.0``);
torch's ``clip_grad_norm_`` and FSDP1's ``FullyShardedDataParallel.clip_grad_norm_`` then
multiply every gradient by ``clamp(max_norm / norm, max=1.0)`` every step, clipping or not ("it
avoids the host-device sync that would result from ``if clip_coef < 1``"), read and write
(``ParallelPlan.grad_clip_scale``); Megatron-LM scales only when the norm exceeds the limit.
FSDP1 runs the norm and the multiply as one kernel per flat gradient (a Python loop); the norm's
all-reduce is one scalar (a few microseconds of latency, not priced).

Memory: the fused step allocates nothing beyond the states. The foreach step (torch 2.2-2.5
``_multi_tensor_adam(w)``, ``capturable=False``) allocates one list:
``exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)``, a tensor of the moments' dtype
(the fp32 shard's) per parameter, alive at once for the whole device group until
``_foreach_addcdiv_``; the weight decay (``_foreach_mul_``), the moments' updates and the div
and add on the list are in place, the bias corrections and step sizes are Python floats (the
step counters are CPU tensors) and the gradients are read in their own dtype (grouped with
their parameters by ``_group_tensors_by_device_and_dtype``, never cast): 4 bytes per parameter
the rank updates (``STEP_TEMPORARY_BYTES``, ``step_temporary_bytes``).

FSDP1 (``inventory.fsdp1.runs_fsdp1``): the optimizer sees the flat fp32 parameter and its fp32
gradient (``_cast_grad_to_param_dtype`` casts the reduced shard back, priced with the reduction)
and writes no low-precision copy of the weight (the cast happens before each all-gather,
``fsdp1_shard_cast``).
"""

from __future__ import annotations

import math

from paraplan.inventory.ops import Op, OpKind

FP32 = 4.0
CHUNK = 65536  # kChunkSize: elements per block of a multi_tensor_apply kernel
MAX_BLOCKS = 320  # depth_to_max_blocks: blocks per launch, every depth
MAX_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36}  # depth_to_max_tensors: tensors per launch
# torch's _multi_tensor_adamw: the tensor lists each pass reads (its depth) and bytes per element
# as (reads of fp32 state or weights, reads of the gradient, writes)
FOREACH_ADAMW = (
    ("mul_ params", 1, (1, 0, 1)),
    ("lerp_ exp_avgs, grads", 2, (1, 1, 1)),
    ("mul_ exp_avg_sqs", 1, (1, 0, 1)),
    ("addcmul_ exp_avg_sqs, grads, grads", 3, (1, 1, 1)),
    ("sqrt exp_avg_sqs", 2, (1, 0, 1)),
    ("div_ sqrt", 1, (1, 0, 1)),
    ("add_ eps", 1, (1, 0, 1)),
    ("addcdiv_ params, exp_avgs, sqrt", 3, (3, 0, 1)),
)

#: Bytes per updated parameter the optimizer step allocates and frees within ``step()`` (module
#: docstring): torch foreach's ``_foreach_sqrt`` list of the fp32 second moments; none fused.
STEP_TEMPORARY_BYTES = {"fused": 0.0, "foreach": FP32}


def step_temporary_bytes(params_updated: float, impl: str | None) -> float:
    """Bytes the optimizer step over ``params_updated`` parameters allocates beside its states
    (``STEP_TEMPORARY_BYTES``; ``impl`` None is fused)."""
    return params_updated * STEP_TEMPORARY_BYTES[impl or "fused"]


def foreach_launches(elements: float, tensors: int, depth: int) -> int:
    """Kernels one ``torch._foreach_*`` call launches over ``tensors`` tensors of ``elements``
    elements together with ``depth`` tensor lists (``multi_tensor_apply``)."""
    tensors = max(1, int(tensors))
    chunks = math.ceil(elements / CHUNK) + tensors - 1  # each tensor's last chunk may be partial
    return max(math.ceil(chunks / MAX_BLOCKS), math.ceil(tensors / MAX_TENSORS[min(depth, 4)]), 1)


def foreach_adamw_bytes(grad_e: float) -> float:
    """Bytes per parameter of torch's ``_multi_tensor_adamw`` over fp32 weights and moments with
    gradients of ``grad_e`` bytes: 80 with fp32 gradients."""
    return sum(state * FP32 + grads * grad_e + writes * FP32 for _, _, (state, grads, writes) in FOREACH_ADAMW)


def optimizer_op(params_updated: float, grad_e: float, param_e: float, state_e: float, *, impl: str | None = None,
                 clip_scale: bool = False, fsdp1: bool = False, tensors: int = 1) -> Op:
    """The optimizer step over the ``params_updated`` parameters this rank owns (``tensors``
    tensors: FSDP1's flat parameters, or the weights), with the gradient norm before it.
    ``impl`` None or "fused": the fused arithmetic (read the gradient for the norm and again for
    Adam, read and write the fp32 state, write the weight in the compute dtype); "foreach": torch's
    eight passes (``FOREACH_ADAMW``). ``clip_scale``: the clip multiplies every gradient.
    ``fsdp1``: fp32 gradients and no low-precision weight copy (module docstring)."""
    if fsdp1:
        grad_e, param_e = FP32, 0.0
    tensors = max(1, int(tensors))
    if impl == "foreach":
        adam = foreach_adamw_bytes(grad_e)
        launches = sum(foreach_launches(params_updated, tensors, depth) for _, depth, _ in FOREACH_ADAMW)
        role = "gradient norm and Adam step (torch foreach: eight passes)"
    else:
        adam = grad_e + 2 * state_e + param_e
        launches = 1
        role = "gradient norm and Adam step (fused, mixed precision)"
    per_param = grad_e + adam  # the norm reads the gradients once
    norm_launches = tensors if fsdp1 else 0  # FSDP1: one vector_norm per flat gradient
    if clip_scale:
        per_param += 2.0 * grad_e
        role += "; clip multiplies every gradient"
        norm_launches += tensors if fsdp1 else foreach_launches(params_updated, tensors, 1)
    return Op(
        name="optimizer",
        kind=OpKind.OPTIMIZER,
        role=role,
        flops=12.0 * params_updated,
        bytes=params_updated * per_param,
        bwd_flops=0.0,
        bwd_bytes=0.0,
        dims=(("params", int(params_updated)),),
        launches=launches + norm_launches,
    )
