"""What each activation-recompute policy re-runs and what it keeps, per layer.

The policies are the frameworks' own:

- ``none``: every operator keeps what its backward needs.
- ``selective`` (Megatron-LM ``--recompute-granularity selective``, Korthikanti et al. 2022):
  the attention core (softmax, its dropout, QK^T and PV) is recomputed; Q, K and V are kept.
- ``full`` (Megatron-LM ``--recompute-granularity full``) with ``recompute_method``:
  ``uniform`` keeps one layer input per group of ``recompute_num_layers`` layers and re-runs
  every layer (one group's activations live while it is recomputed); ``block`` re-runs only
  the first ``recompute_num_layers`` layers of a stage and keeps everything of the others.
- ``layer``: every ``recompute_every``-th layer is checkpointed whole, the others keep all
  (torchtitan ``activation_checkpoint.mode = "selective"`` with ``selective_ac_option = N``;
  IBM fms-fsdp's selective checkpointing of every n-th block).
- ``op``: torchtitan's per-op policy (``selective_ac_option = "op"``): the outputs of matmuls
  are saved except every second one, and attention's; everything else (norms, RoPE,
  activations, the other half of the matmuls) is recomputed from them in the backward pass.

``RecomputeCost`` is the one source for the recompute time (``prediction``), the activation
memory (``memory``) and the hardware FLOPs (``inventory.job``).
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.inventory.ops import Op, OpKind
from paraplan.inventory.shapes import LocalShape
from paraplan.specs import ParallelPlan, Recompute

_GEMMS = (OpKind.GEMM,)
_ATTENTION = (OpKind.ATTENTION, OpKind.BMM, OpKind.SOFTMAX)


@dataclass(frozen=True, slots=True)
class RecomputeCost:
    """One stage's recompute under a policy: ``op_weights[i]`` is how many times, per layer
    on average, the i-th layer operator's forward is run again; ``comm_weight`` the same for
    the layer's forward TP/CP communication; ``held_bytes`` what the stage's layers keep per
    micro-batch in flight; ``working_bytes`` what lives on top of it while the backward pass
    recomputes (the largest recomputed group)."""

    op_weights: tuple[float, ...]
    comm_weight: float
    held_bytes: float
    working_bytes: float


def _layer_input(x: LocalShape, plan: ParallelPlan) -> float:
    """The checkpointed layer input, [s/tp (with SP), b, h]; DeepSpeed's
    partition_activations keeps a 1/tp slice of it."""
    held = x.e * x.b * x.s_norm * x.h
    if plan.partition_activations and not plan.sequence_parallel:
        held /= plan.tp
    return held


def _gemm_output(op: Op, e: int) -> float:
    dims = dict(op.dims)
    return e * dims["m"] * dims["n"]


_CACHE: dict[tuple[int, int, int, int], tuple] = {}


def recompute_cost(plan: ParallelPlan, ops: tuple[Op, ...], x: LocalShape, layers: int) -> RecomputeCost:
    """The recompute of ``layers`` layers made of ``ops`` under ``plan``'s policy. Every stage
    of a prediction asks three times (time, memory, FLOPs): the answer is kept by the identity
    of its arguments (hashing the operators would cost more than computing it)."""
    key = (id(plan), id(ops), id(x), layers)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is plan and hit[1] is ops and hit[2] is x:
        return hit[3]
    if len(_CACHE) > 512:
        _CACHE.clear()
    cost = _recompute_cost(plan, ops, x, layers)
    _CACHE[key] = (plan, ops, x, cost)
    return cost


def _recompute_cost(plan: ParallelPlan, ops: tuple[Op, ...], x: LocalShape, layers: int) -> RecomputeCost:
    cost = _policy_cost(plan, ops, x, layers)
    if all(op.recomputable for op in ops):
        return cost
    weights = tuple(w if op.recomputable else 0.0 for op, w in zip(ops, cost.op_weights, strict=True))
    return RecomputeCost(weights, cost.comm_weight, cost.held_bytes, cost.working_bytes)


def _policy_cost(plan: ParallelPlan, ops: tuple[Op, ...], x: LocalShape, layers: int) -> RecomputeCost:
    policy = plan.recompute
    saved = sum(op.saved_bytes for op in ops)
    n = max(layers, 1)
    if policy is Recompute.NONE:
        return RecomputeCost((0.0,) * len(ops), 0.0, layers * saved, 0.0)
    if policy is Recompute.SELECTIVE:
        weights = tuple(1.0 if op.selective_recompute else 0.0 for op in ops)
        return RecomputeCost(weights, 0.0, layers * sum(op.kept_under_selective for op in ops), 0.0)
    layer_input = _layer_input(x, plan)
    if policy is Recompute.FULL:
        group = plan.recompute_num_layers or 1
        if plan.recompute_method == "block":
            # Megatron applies it per model chunk: vpp chunks per stage when interleaved
            again = min(group * plan.vpp, layers)
            held = again * layer_input + (layers - again) * saved
            return RecomputeCost((again / n,) * len(ops), again / n, held, saved if again else 0.0)
        groups = -(-layers // group)
        return RecomputeCost((1.0,) * len(ops), 1.0, groups * layer_input, min(group, n) * saved)
    if policy is Recompute.LAYER:
        again = layers / plan.checkpoint_every
        held = again * layer_input + (layers - again) * saved
        return RecomputeCost((again / n,) * len(ops), again / n, held, saved)
    # Recompute.OP: matmul outputs kept but every second one, attention's kept, rest re-run
    weights = tuple(0.5 if op.kind in _GEMMS else 0.0 if op.kind in _ATTENTION else 1.0 for op in ops)
    kept = layer_input + sum(
        0.5 * _gemm_output(op, x.e) if op.kind in _GEMMS else op.saved_bytes if op.kind in _ATTENTION else 0.0
        for op in ops
    )
    return RecomputeCost(weights, 0.0, layers * kept, saved - kept)
