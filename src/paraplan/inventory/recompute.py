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
- ``op``: torchtitan's per-op policy (``selective_ac_option = "op"``; 0.3.0 ``SelectiveAC``):
  of each block's matmuls in forward order the 1st, 3rd, ... keep their outputs and the 2nd,
  4th, ... are re-run, attention keeps its output and logsumexp; everything else (norms, RoPE,
  activations, FP8 casts) is re-run in the backward pass. See :func:`op_policy_weights`.

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
    weights = op_policy_weights(ops)
    kept = layer_input + _op_policy_kept(ops, weights, x.e)
    if plan.tp > 1 and plan.sequence_parallel:
        # the reduce-scatters after the row-parallel output and down projections are saved
        # (``_c10d_functional.reduce_scatter_tensor`` in the save set): [b, s/tp, h] each
        kept += sum(op.name in _ROW_PARALLEL for op in ops) * x.e * x.b * x.s_norm * x.h
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


# the row-parallel GEMMs whose output tensor parallelism reduce-scatters (sequence parallel)
_ROW_PARALLEL = frozenset({"linear2", "linear4"})


def op_policy_weights(ops: tuple[Op, ...]) -> tuple[float, ...]:
    """torchtitan's per-op policy (``Recompute.OP``) for one layer's ``ops`` (in forward order):
    1.0 for each operator the backward pass re-runs, 0.0 for each whose output it keeps.

    torchtitan's policy counts the ``aten.mm`` calls of one block's forward and re-runs the
    even ones (0.3.0 torchtitan/distributed/activation_checkpoint.py ``SelectiveAC._wrap_block``:
    ``meta = {"forward_mm_count": 0, ...}`` made afresh by ``_get_custom_policy()`` each time
    the block's ``context_fn`` runs, ``PREFER_RECOMPUTE`` when ``meta[...] % 2 == 0``; 2024's
    train/parallelize_llama.py the same with ``meta = defaultdict(int)`` per
    ``selective_checkpointing_context_fn``). The count starts again in every block. So the GEMMs
    re-run are the 2nd, 4th, ... of a layer in the order its forward calls them, which is the
    inventory's order: torchtitan 0.1's ``wq wk wv wo w1 w3 w2`` (``self.w2(F.silu(self.w1(x)) *
    self.w3(x))`` calls w1 first) re-runs K, the output projection and w3 (the up projection);
    0.3.0's ``wqkv wo w1 w3 w2`` re-runs the output projection and w3; one QKV and one gate/up
    GEMM re-run the output and down projections. A torchao float8 linear counts as a matmul
    (its ``torch.mm`` on float8 tensor subclasses reaches the policy's dispatch mode as
    ``aten.mm`` before the subclass runs ``torch._scaled_mm``, which the policy never sees).

    Saved besides (0.3.0 ``_get_default_save_ops``; 2024 ``_save_list``): the attention kernels
    (SDPA flash / efficient / cuDNN, FlexAttention), the tensor-parallel reduce-scatters,
    ``aten.max`` (an FP8 amax, a scalar; 2025 on), the all-to-alls (0.3.0). Re-run: every other
    operator, norms, RoPE, the activation, the residual adds, the FP8 casts, and the
    tensor-parallel all-gathers (``all_gather_into_tensor`` is in neither list; timed through
    ``RecomputeCost.gather_weight``, ``_op_regathers``). A mixture-of-experts layer (0.3.0
    ``models/common/moe.py``)
    re-runs its router GEMM without counting it (``force_recompute_mm_shapes_by_fqns =
    ["moe.router.gate"]``) and its routed experts' GEMMs (``torch._grouped_mm``, outside the
    save set and the count); its shared experts' ``w1 w3 w2`` are counted after the attention's."""
    weights, count = [], 0
    for op in ops:
        if op.kind in _ATTENTION:
            weights.append(0.0)
        elif op.kind not in _GEMMS or op.expert or op.name == "router":
            weights.append(1.0)
        else:
            count += 1
            weights.append(1.0 if count % 2 == 0 else 0.0)
    return tuple(weights)


def _op_policy_kept(ops: tuple[Op, ...], weights: tuple[float, ...], e: int) -> float:
    """What one layer keeps under the per-op policy besides its input: the output of each GEMM
    it does not re-run and the attention kernel's outputs (its output and logsumexp: FlashAttention's
    ``saved_bytes`` less the q, k, v it saves for its own backward, ``selective_kept_bytes``;
    q and k come again from the re-run RoPE, v is the kept V projection's output). The
    attention's output is the output projection's input (``linear2``)."""
    kept = sum(_gemm_output(op, e) for op, w in zip(ops, weights, strict=True) if op.kind in _GEMMS and w == 0.0)
    for op in ops:
        if op.kind is OpKind.ATTENTION:
            kept += op.saved_bytes - op.selective_kept_bytes
        elif op.kind in _ATTENTION:
            kept += op.saved_bytes
    attention_out = next((op for op in ops if op.name == "linear2" and op.kind in _GEMMS), None)
    if attention_out is not None and any(op.kind is OpKind.ATTENTION for op in ops):
        dims = dict(attention_out.dims)
        kept += e * dims["m"] * dims["k"]
    return kept


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
            return op.name in ("q_up", "kv_up") or (op.name.startswith("RoPE") and "(MLA)" in op.role)
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
