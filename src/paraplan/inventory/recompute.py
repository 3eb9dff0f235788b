"""What each activation-recompute policy re-runs and what it keeps, per layer.

The policies are the frameworks' own:

- ``none``: every operator keeps what its backward needs.
- ``selective`` (Megatron-LM ``--recompute-granularity selective``, Korthikanti et al. 2022):
  the attention core (softmax, its dropout, QK^T and PV) is recomputed; Q, K and V are kept.
  Megatron-Core's ``--recompute-modules`` (``recompute_modules``, default core_attn) choose
  what is recomputed instead: see :data:`MODULES`.
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
from paraplan.specs import Framework, ParallelPlan, Recompute

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
    # the same as ``comm_weight`` for the layer's expert-parallel collectives (None: comm_weight);
    # Megatron-Core's "moe" recompute module re-runs the dispatch and combine
    ep_comm_weight: float | None = None
    # how often the layer's forward TP all-gathers alone re-run (beyond ``comm_weight``):
    # torchtitan's per-op policy recomputes the sequence-parallel gathers it does not save
    gather_weight: float = 0.0


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
    return RecomputeCost(weights, cost.comm_weight, cost.held_bytes, cost.working_bytes, cost.ep_comm_weight,
                         cost.gather_weight)


def _policy_cost(plan: ParallelPlan, ops: tuple[Op, ...], x: LocalShape, layers: int) -> RecomputeCost:
    policy = plan.recompute
    saved = sum(op.saved_bytes for op in ops)
    n = max(layers, 1)
    if policy is Recompute.NONE:
        return RecomputeCost((0.0,) * len(ops), 0.0, layers * saved, 0.0)
    if policy is Recompute.SELECTIVE:
        return _modules_cost(plan.recompute_modules or ("core_attn",), ops, layers)
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
    return RecomputeCost(weights, 0.0, layers * kept, saved - kept, gather_weight=_op_regathers(plan))


def _op_regathers(plan: ParallelPlan) -> float:
    """1 where torchtitan's per-op policy gathers the sequence-parallel inputs again: its save
    list (torchtitan ``activation_checkpoint.py`` ``_save_list``, 0.1 through 0.3: ``aten.mm``,
    the SDPA kernels, ``_c10d_functional.reduce_scatter_tensor``, ``aten.max``) keeps the
    reduce-scatters' outputs but not ``all_gather_into_tensor``'s, so the backward pass
    recomputes the gathered input the linears need (``kept`` above holds none of it either).
    With async TP too: the policy tags the joint graph's ``all_gather_into_tensor`` before
    inductor's micro-pipelining pass runs; a recomputed gather it then fuses with a recomputed
    matmul would hide partly, which is not priced (the re-gather counts as the plain one)."""
    dtensor = plan.framework is Framework.FSDP
    return 1.0 if dtensor and plan.tp > 1 and plan.sequence_parallel else 0.0


# Megatron-Core's recompute modules (TransformerConfig.recompute_modules; transformer_layer.py,
# mlp.py, moe_layer.py, multi_latent_attention.py), each as the layer operators it covers, by
# the operators' roles and names (``inventory.layer``, ``inventory.moe``):
# - normal checkpointing (core_attn, mlp, moe, shared_experts): the module keeps its input and
#   frees every activation inside; the backward pass re-runs its forward (moe: with the token
#   dispatch and combine all-to-alls);
# - output-discarding checkpointing (layernorm, moe_act, mla_up_proj): the module's output,
#   which the next operator saved, is freed and re-computed from the module's input before
#   that operator's backward (layernorm: the two layer norms' outputs, the QKV and MLP inputs;
#   moe_act: the routed experts' activation, the experts' down-projection input; mla_up_proj:
#   MLA's query and key-value up projections and RoPE, the attention core's Q, K and V).
MODULES = ("core_attn", "mlp", "moe", "moe_act", "layernorm", "mla_up_proj", "shared_experts")
_NORM_ROLES = ("input norm", "pre-MLP norm")
_MOE_NAMES = frozenset({"router", "router_topk", "moe_aux_loss", "moe_permute", "expert_fc1", "expert_fc2",
                        "moe_unpermute"})


def module_ops(module: str, ops: tuple[Op, ...]) -> tuple[int, ...]:
    """The positions in ``ops`` (one layer) of the operators ``module`` recomputes."""
    def member(op: Op) -> bool:
        if module == "core_attn":
            return op.selective_recompute
        if module == "mlp":
            return op.role.startswith("MLP ")
        if module == "moe":
            return op.name in _MOE_NAMES or op.role.startswith(("experts'", "shared experts"))
        if module == "shared_experts":
            return op.role.startswith("shared experts")
        if module == "moe_act":
            return op.role.startswith("experts' activation")
        if module == "layernorm":
            return op.role in _NORM_ROLES
        if module == "mla_up_proj":
            return op.name in ("q_up", "kv_up") or (op.name == "RoPE" and "(MLA)" in op.role)
        raise ValueError(f"parallel.recompute_modules: {module!r} is not one of {', '.join(MODULES)}")
    return tuple(i for i, op in enumerate(ops) if member(op) and op.recomputable)


def _modules_cost(modules: tuple[str, ...], ops: tuple[Op, ...], layers: int) -> RecomputeCost:
    """Selective recompute of Megatron-Core's ``modules`` (see :data:`MODULES`)."""
    weights = [0.0] * len(ops)
    kept = [op.saved_bytes for op in ops]
    working = 0.0
    where = {m: module_ops(m, ops) for m in MODULES if m in modules}
    for i in where.get("core_attn", ()):
        weights[i], kept[i] = 1.0, ops[i].selective_kept_bytes
    for m in ("mlp", "moe", "shared_experts"):  # normal checkpointing: the first operator's input kept
        inside = where.get(m, ())
        for i in inside:
            weights[i] = 1.0
        freed = sum(kept[i] for i in inside[1:])
        for i in inside[1:]:
            kept[i] = 0.0
        working = max(working, freed)
    for m in ("layernorm", "moe_act", "mla_up_proj"):  # output-discarding: the consumers' saved input freed
        for i in where.get(m, ()):
            weights[i] = 1.0
            if m != "mla_up_proj" and i + 1 < len(ops):
                kept[i + 1] = 0.0
        if m == "mla_up_proj" and where.get(m):
            for i, op in enumerate(ops):
                if op.selective_recompute:  # the attention core's Q, K and V come from the up projections
                    kept[i] = max(0.0, kept[i] - op.selective_kept_bytes)
    ep = 1.0 if where.get("moe") else None
    return RecomputeCost(tuple(weights), 0.0, layers * sum(kept), working, ep)
