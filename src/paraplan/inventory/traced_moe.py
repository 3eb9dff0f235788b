"""A traced mixture of experts, parallel as Megatron-Core runs it (``inventory: traced``).

The trace (``inventory.hftrace``) records a MoE layer's routed experts as one grouped GEMM over
the tokens x top-k routed rows (``hfhooks``), with the model's own widths: the number of experts,
top-k, each expert's intermediate width and whether it is gated. What the experts cost on one
rank depends on how they are spread, which the model's code does not say: expert parallelism
(``parallel.ep``: E/ep local experts receive the token copies routed to them, times the load
imbalance), expert tensor parallelism (``etp``: 1/etp of each expert's width) and the grouped
GEMM. So the traced experts become the hand-written layer's routed-expert operators
(``moe.routed_expert_ops``: permute, up projection, activation, down projection, unpermute),
built at the traced widths and the job's ``LocalShape``, and the layer's expert-parallel
communication is the hand-written one (``moe.count_moe_collectives``, by the token dispatcher:
alltoall, allgather or flex). The rest of the layer (attention, norms, router, shared experts) is
costed as traced and split by the model's tensor-parallel plan (``tp_plan.shard_layer``), whose
expert styles (``moe_tp_experts``, the experts' own colwise/rowwise) are the ETP split above.

A model whose layers are dense and MoE (DeepSeek-V3's first three dense layers, Jamba's
alternating layers) has a traced kind of each; ``traced.traced_layers`` costs every kind on its
rank here and keys it by its label (``traced.is_moe_label`` tells the MoE ones).

Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses

from paraplan.inventory.hfrecords import TracedLayer
from paraplan.inventory.ops import Collective, Op, OpKind
from paraplan.inventory.shapes import LocalShape
from paraplan.specs import ConfigError, ModelSpec

_WHERE = "model.inventory"
_GATED_SILU = ("silu", "swish")

def layer_on_rank(model: ModelSpec, x: LocalShape, layer: TracedLayer, plan: dict[str, str] | None, act: str,
                  attention_chunk: int | None = None) -> tuple[tuple[Op, ...], tuple[Collective, ...]]:
    """One traced layer kind on one rank: costed (``traced.costed_layer_ops``), split by the
    model's tensor-parallel ``plan``, and, for a mixture of experts, its routed experts spread
    over ep / etp as the hand-written layer's (``routed_experts``)."""
    from paraplan.inventory.tp_plan import shard_layer
    from paraplan.inventory.traced import costed_layer_ops

    ops, modules = costed_layer_ops(layer, model.kernels, attention_chunk=attention_chunk)
    ops = _keep_every_parameter(layer, ops)
    sp = x.tp > 1 and x.s_norm != x.s
    grouped = next((o for o in layer.ops if o.aten == "grouped_mm" and o.phase == "fwd"), None)
    if plan is not None:
        _check_attention_planned(model, layer, plan)
    if grouped is None:
        return shard_layer(ops, modules, plan, x.tp, sp, x.e)
    where = grouped.module
    at = next(i for i, (op, m) in enumerate(zip(ops, modules, strict=True)) if m == where and op.kind is OpKind.GEMM)
    rest = ops[:at] + ops[at + 1:]
    rest_modules = modules[:at] + modules[at + 1:]
    if plan is not None:  # the experts' own styles are the ETP split of routed_expert_ops
        plan = {m: s for m, s in plan.items() if m != where and not m.startswith(where + ".")}
    sharded, coll = shard_layer(rest, rest_modules, plan, x.tp, sp, x.e)
    sharded = tuple(_shared(op) if "shared_expert" in module else op
                    for op, module in zip(sharded, rest_modules, strict=True))
    experts = routed_experts(model, x, layer, act)
    ops = _router_launching(model, x, sharded[:at] + experts + sharded[at:])
    return _attention_launching(model, x, ops), coll


def _router_launching(model: ModelSpec, x: LocalShape, ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """``ops`` with the traced router's GEMM launching what Megatron-Core's router does (its GEMM,
    top-k and aux loss: ``moe.megatron_kernels``) in place of the hand-written layer's three
    operators; the traced router's own softmax and top-k kernels launch theirs besides."""
    from paraplan.inventory.moe import megatron_kernels

    kernels = megatron_kernels(model, x)
    at = _router_at(ops)
    if kernels is None or at is None:
        return ops
    launches = sum(kernels[name].fwd for name in ("router", "router_topk", "moe_aux_loss"))
    return (*ops[:at], dataclasses.replace(ops[at], host_launches=launches), *ops[at + 1:])


def _attention_launching(model: ModelSpec, x: LocalShape, ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """``ops`` with the traced layer's operators before its router (the attention block and the
    pre-MLP norm) launching, together, what Megatron-Core launches for the hand-written ones
    (``moe.megatron_attention``: its norms, GEMMs with their sequence-parallel collectives, q/k
    norms, RoPE, fused attention, bias-dropout-add), all on the first: the host launch wait after
    the dispatcher's sync counts a layer's launches, not which operator holds them. Other
    frameworks' traced layers keep one launch per traced kernel."""
    from paraplan.inventory.layer import attention_block_ops
    from paraplan.inventory.moe import megatron_attention, megatron_kernel_config

    at = _router_at(ops)
    if at is None or at == 0 or megatron_kernel_config(model, x) is None:
        return ops
    hand = megatron_attention(model, x, attention_block_ops(model, x))
    launches = sum(op.forward_host_launches for op in hand) + 1  # and the pre-MLP norm's kernel
    first = dataclasses.replace(ops[0], host_launches=launches)
    return (first, *(dataclasses.replace(op, host_launches=0) for op in ops[1:at]), *ops[at:])


def _router_at(ops: tuple[Op, ...]) -> int | None:
    """The index of a traced MoE layer's router GEMM (its role names the router), or None."""
    return next((i for i, op in enumerate(ops) if op.kind is OpKind.GEMM and "router" in op.role.lower()), None)


def _keep_every_parameter(layer: TracedLayer, ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """Parameters no costed operator holds (gpt-oss's attention sinks, one per head, which the
    attention module adds itself) go to the attention core, so the layer holds all it has."""
    missing = layer.params - sum(op.params for op in ops)
    at = next((i for i, op in enumerate(ops) if op.kind is OpKind.ATTENTION), None)
    if missing <= 0 or at is None:
        return ops
    return _with_params(ops, at, missing)


def _with_params(ops: tuple[Op, ...], at: int, extra: float) -> tuple[Op, ...]:
    """``ops`` with ``extra`` parameters more on ``ops[at]``."""
    return (*ops[:at], dataclasses.replace(ops[at], params=ops[at].params + extra), *ops[at + 1:])


def _shared(op: Op) -> Op:
    """An operator of the shared experts (DeepSeek's ``mlp.shared_experts``, Qwen2-MoE's
    ``mlp.shared_expert``), marked as the hand-written ones are (``moe.is_shared_expert``: what
    --moe-shared-expert-overlap runs beside the all-to-alls and recompute module shared_experts
    re-runs)."""
    return dataclasses.replace(op, role=f"shared experts: {op.role}")


def expert_widths(layer: TracedLayer) -> tuple[int, int, int, bool]:
    """(experts, top-k, intermediate width, gated) of a traced layer's routed experts."""
    op = next(o for o in layer.ops if o.aten == "grouped_mm" and o.phase == "fwd")
    info = dict(op.extra)
    e, top_k, rows = int(info["experts"]), int(info["top_k"]), int(info["rows"])
    if "inter" in info:
        return e, top_k, int(info["inter"]), int(info["gate"]) == 2
    # a trace recorded before the widths were: FLOPs = 2 rows (up + down) / E + rows x inter
    h = int(op.shapes[0][-1])
    weights = float(dict(layer.param_breakdown).get(op.module, 0))
    inter = round((op.flops - 2.0 * rows * weights / e) / rows)
    return e, top_k, inter, round(weights / e / (h * inter)) == 3


def routed_experts(model: ModelSpec, x: LocalShape, layer: TracedLayer, act: str) -> tuple[Op, ...]:
    """The traced experts on one rank: ``moe.routed_expert_ops`` at the traced widths, E/ep of
    them, 1/etp of each one's width (``x``)."""
    from paraplan.inventory.moe import TE_GROUPED_GEMM_STREAMS, megatron_kernels, routed_expert_ops

    e, top_k, inter, gated = expert_widths(layer)
    if e != model.num_moe_experts or top_k != model.moe_router_topk:
        raise ConfigError(f"{_WHERE}: the traced layers route to {e} experts, top-{top_k}, but the config's fields "
                          f"read num_moe_experts {model.num_moe_experts}, moe_router_topk {model.moe_router_topk}; "
                          f"give num_moe_experts: {e} and moe_router_topk: {top_k} in the job's model")
    etp = max(1, (model.moe_ffn_hidden_size or inter) // max(1, x.moe_ffn))
    name = ("swiglu" if act.lower() in _GATED_SILU else "geglu") if gated else "gelu"
    # the grouped GEMM as the job's framework runs it (the trace gives the shapes, not the kernel)
    ops = tuple(routed_expert_ops(x, inter // etp, gated=gated, activation=name, grouped=bool(model.moe_grouped_gemm),
                                 streams=model.moe_grouped_gemm_streams or x.grouped_gemm_streams or TE_GROUPED_GEMM_STREAMS,
                                 kernels=megatron_kernels(model, x)))
    # the experts' biases (gpt-oss: each expert's up and down projections), held by the up projection
    module = next(o.module for o in layer.ops if o.aten == "grouped_mm" and o.phase == "fwd")
    traced = sum(n for m, n in layer.param_breakdown if m == module or m.startswith(module + "."))
    built = sum(op.params for op in ops if op.expert)
    extra = traced / e / etp * x.experts - built
    if extra > 0.5:
        ops = _with_params(ops, next(i for i, op in enumerate(ops) if op.expert), extra)
    return ops


def _check_attention_planned(model: ModelSpec, layer: TracedLayer, plan: dict[str, str]) -> None:
    """tp > 1 needs the plan to split the attention block: DeepSeek-V3's published plan splits
    its MLPs and experts only, not multi-head latent attention."""
    attention = next((o.module for o in layer.ops if o.aten == "attention"), None)
    if attention and not any(m.startswith(attention + ".") for m in plan):
        raise ConfigError(
            f"model.hf_config: base_model_tp_plan: {model.name}'s plan splits no module of its attention block "
            f"({attention}), so paraplan cannot split it over parallel.tp; use tp: 1 or model.inventory: hand")
