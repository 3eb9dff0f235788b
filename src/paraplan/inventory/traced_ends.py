"""The ends of a traced model (``inventory: traced``): the input embedding on the first stage,
the final norm, LM head, logit soft cap and loss on the last, from the model's own code.

The trace (``hftrace``) records every operator outside the decoder layers with the end it ran
at (before the layers forward: the first; after them: the last), the parameters of each module
there (a tied head's weight once, at the embedding) and the model's plans for them.

``kernels: fused`` (the default) costs them as training frameworks run them, as the
hand-written ends do (``inventory.ends``), at the traced widths: one lookup of the embedding
table (and of a learned position table, added), the scaled embedding's multiply (Gemma) as one
elementwise kernel, the final norm as one fused norm, the LM head as one GEMM, Gemma-2's
soft cap (``tanh(logits / c) c``) as one elementwise kernel over the logits, and the loss as
the vocab-parallel fused cross entropy (Megatron-Core's, torchtitan's ``loss_parallel``): the
embedding and head split over the vocabulary on tp ranks whatever the model's plan says, with
the hand-written ends' collectives. ``kernels: eager`` costs Hugging Face's own code aten op
by aten op (``traced.layer_ops_from_trace``) and splits it by the model's published plan:
``embed_tokens: rowwise`` (or ``embedding_rowwise``) splits the table over the vocabulary and
reduces its output; an embedding the plan does not name is whole on every rank; ``lm_head:
colwise_gather_output`` (transformers' default) computes 1/tp of the logits and all-gathers
them, and every rank then runs the whole soft cap and loss.

Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import functools

from paraplan.inventory.hfrecords import TracedLayer, TracedModel
from paraplan.inventory.layer import elementwise, gemm
from paraplan.inventory.ops import Collective, CollectiveKind, Op, OpKind, ParallelDim
from paraplan.inventory.shapes import LocalShape
from paraplan.specs import ModelSpec, Phase

_VOCAB_PARALLEL = frozenset({"rowwise", "embedding_rowwise", "vocab_parallel"})


def _trace(model: ModelSpec, x: LocalShape) -> TracedModel:
    from paraplan.inventory.traced import _trace as trace

    return trace(model, x)


def _planned(trace: TracedModel, path: str) -> str | None:
    """The end the model's pipeline plan puts ``path`` on: "first" for the modules it lists
    before the decoder layers (the embedding), "last" after them (norm, head); None when the
    plan does not name it (or there is no plan)."""
    plan = trace.pp_plan
    layers = next((i for i, key in enumerate(plan) if key.endswith("layers") or key.endswith(".h")), None)
    if layers is None:
        return None
    for i, key in enumerate(plan):
        if i != layers and (path == key or path.startswith(key + ".")):
            return "first" if i < layers else "last"
    return None


def _stages(trace: TracedModel) -> tuple[str, ...]:
    """Each end operator's stage: where the model's pipeline plan puts its module, else where it
    ran (before the layers forward: the first stage; after them: the last)."""
    return tuple(_planned(trace, op.module) or st for op, st in zip(trace.ends, trace.end_stage, strict=True))


def _params_at(trace: TracedModel, stage: str) -> dict[str, int]:
    """Each end module's own parameters, on the end that runs it (a module that ran nothing,
    e.g. a tied head, on the end its path says: the head's on the last)."""
    ran = {op.module: st for op, st in zip(trace.ends, _stages(trace), strict=True) if op.phase == "fwd"}
    out = {}
    for path, n in trace.end_params:
        where = _planned(trace, path) or ran.get(path, "last" if path == trace.head_path else "first")
        if where == stage:
            out[path] = n
    return out


def pipeline_placement(model: ModelSpec, x: LocalShape) -> str:
    """How a traced model's ends and layers are placed on pipeline stages, in words."""
    trace = _trace(model, x)
    if not trace.pp_plan:
        return "no base_model_pp_plan: the layer list split, the embedding first, the norm and head last"
    first = [k for k in trace.pp_plan if _planned(trace, k) == "first"]
    last = [k for k in trace.pp_plan if _planned(trace, k) == "last"]
    layers = [k for k in trace.pp_plan if k not in first and k not in last]
    return (f"by base_model_pp_plan: {' and '.join(first)} first, {' and '.join(layers)} split, "
            f"{' and '.join(last)} last")


def _widths(trace: TracedModel) -> tuple[int, int]:
    """(vocabulary rows, hidden width) of the traced embedding table."""
    for op in trace.ends:
        if op.aten == "embedding" and op.module == trace.embedding_path and op.phase == "fwd":
            vocab, hidden = op.shapes[0]
            return int(vocab), int(hidden)
    raise ValueError("the trace ran no input embedding")


def tied_table(model: ModelSpec, x: LocalShape) -> float:
    """The weight a tied LM head shares with the embedding on one rank (vocabulary x hidden,
    unpadded; 1/tp of it where the table is split over the vocabulary)."""
    trace = _trace(model, x)
    vocab, hidden = _widths(trace)
    split = model.kernels != "eager" or dict(trace.tp_plan).get(trace.embedding_path, "") in _VOCAB_PARALLEL
    return float(vocab * hidden) / (x.tp if split else 1)


def _module_type(trace: TracedModel, path: str) -> str:
    return next((op.module_type for op in trace.ends if op.module == path), "")


def traced_embedding_ops(model: ModelSpec, x: LocalShape) -> tuple[Op, ...]:
    """The first stage's operators besides its layers, on one rank."""
    return _end_ops(model, x, "first")


def traced_head_ops(model: ModelSpec, x: LocalShape) -> tuple[Op, ...]:
    """The last stage's operators besides its layers (final norm, head, soft cap, loss), on one rank."""
    return _end_ops(model, x, "last")


@functools.lru_cache(maxsize=256)
def _end_ops(model: ModelSpec, x: LocalShape, stage: str) -> tuple[Op, ...]:
    trace = _trace(model, x)
    if model.kernels == "eager":
        return _eager(trace, x, stage)[0]
    return (_fused_first if stage == "first" else _fused_last)(trace, x)


def _fused_first(trace: TracedModel, x: LocalShape) -> tuple[Op, ...]:
    vocab, h = _widths(trace)
    e, tp = x.e, x.tp
    hidden = x.b * x.s * h
    table = vocab * h / tp
    ops = [Op(
        name="embedding", kind=OpKind.EMBEDDING,
        role=f"traced {_module_type(trace, trace.embedding_path)} lookup (vocab-parallel, as frameworks run it)",
        flops=hidden, bytes=e * 2 * hidden, bwd_flops=hidden, bwd_bytes=e * (2 * hidden + table), params=table,
        dims=(("tokens", x.b * x.s), ("vocab", vocab // tp), ("dim", h)),
    )]
    first = [op for op, st in zip(trace.ends, _stages(trace), strict=True) if st == "first" and op.phase == "fwd"]
    if any(op.module == trace.embedding_path and op.aten.startswith("mul") for op in first):
        ops.append(elementwise("embedding_scale", OpKind.ELEMENTWISE, "traced: the embedding scaled (one kernel)",
                               hidden, e, dims=(("b", x.b), ("l", x.s), ("dim", h))))
    others = {m: n for m, n in _params_at(trace, "first").items() if m != trace.embedding_path}
    for module, n in others.items():
        ops.append(elementwise("res_add", OpKind.ELEMENTWISE, f"traced {module}: looked up and added", hidden, e,
                               reads=2.0, params=n))
    drops = {op.module for op in first if "dropout" in _module_type(trace, op.module).lower() and op.bytes > 0}
    for module in sorted(drops):
        ops.append(elementwise("dropout", OpKind.ELEMENTWISE, f"traced {module}: embedding dropout", hidden / x.tp
                               if x.s_norm != x.s else hidden, e, saved=hidden))
    return tuple(ops)


def _fused_last(trace: TracedModel, x: LocalShape) -> tuple[Op, ...]:
    vocab, h = _widths(trace)
    e, tp = x.e, x.tp
    last = [(op, st) for op, st in zip(trace.ends, _stages(trace), strict=True) if st == "last"]
    params = _params_at(trace, "last")
    ops: list[Op] = []
    n = x.b * x.s_norm * h
    for module in dict.fromkeys(op.module for op, _ in last if op.phase == "fwd"):
        mtype = _module_type(trace, module)
        if "norm" in mtype.lower():
            rms = "rms" in mtype.lower()
            ops.append(elementwise(
                "RMSlayernorm" if rms else "layernorm", OpKind.NORM, f"traced {mtype}: final norm", n, e,
                flops_per_element=4.0 if rms else 5.0, saved=e * n, params=params.get(module, 0),
                dims=(("b", x.b), ("l", x.s_norm), ("dim", h))))
    ops.append(gemm("linear_final", "traced LM head (output projection, vocab-parallel)", x.tokens, h, vocab // tp,
                    e, bias=False, saved=e * x.b * x.s_norm * h))
    logits = x.b * x.s * vocab / tp
    top = [op for op, _ in last if op.module == "" and op.phase == "fwd"]
    if any(op.aten == "tanh" for op in top):
        ops.append(elementwise("logit_softcap", OpKind.ELEMENTWISE, "traced: logits soft-capped, tanh(z / c) c "
                               "(one kernel)", logits, e, flops_per_element=3.0, saved=e * logits,
                               dims=(("b", x.b), ("l", x.s), ("vocab", vocab // tp))))
    ops.append(Op(
        name="cross_entropy", kind=OpKind.LOSS, role="vocab-parallel cross entropy (fp32; fused, as frameworks run it)",
        flops=5.0 * logits, bytes=(e + 4.0 * 2) * logits, bwd_flops=2.0 * logits, bwd_bytes=(4.0 + e) * logits,
        saved_bytes=4.0 * logits, dims=(("b", x.b), ("l", x.s), ("vocab", vocab // tp))))
    return tuple(ops)


def traced_end_collectives(model: ModelSpec, x: LocalShape, *, first: bool, last: bool,
                           hand: tuple[Collective, ...]) -> tuple[Collective, ...]:
    """The ends' tensor-parallel communication: the hand-written vocab-parallel ones
    (``hand``) with fused kernels; by the model's plan with eager ones."""
    if model.kernels != "eager" or x.tp == 1:
        return hand
    trace = _trace(model, x)
    out = tuple(c for c in hand if c.name == "tp_allgather_p2p")
    if first:
        out += _eager(trace, x, "first")[1]
    if last:
        out += _eager(trace, x, "last")[1]
    return out


def _eager(trace: TracedModel, x: LocalShape, stage: str) -> tuple[tuple[Op, ...], tuple[Collective, ...]]:
    """One end as Hugging Face's eager code runs it, split by the model's plan."""
    from paraplan.inventory.tp_plan import COLWISE, GATHERS_OUTPUT, ROWWISE, _scaled, _scaled_gemm
    from paraplan.inventory.traced import layer_ops_from_trace

    params = _params_at(trace, stage)
    if stage == "last" and trace.head_path and trace.head_path not in params:
        vocab, h = _widths(trace)  # a tied head: its weight is the table (job.py counts it once)
        params[trace.head_path] = vocab * h
    pick = [op for op, st in zip(trace.ends, _stages(trace), strict=True) if st == stage]
    saved = tuple(t for w, t in trace.end_saved if w == stage)
    layer = TracedLayer(kind=f"{stage} end", indices=(), layer_type="", params=sum(params.values()),
                        param_breakdown=tuple(params.items()), ops=tuple(pick), saved=saved)
    ops = layer_ops_from_trace(layer)
    ops = tuple(dataclasses.replace(op, name="linear_final") if op.name == trace.head_path else op for op in ops)
    if x.tp == 1:
        return ops, ()
    plan = dict(trace.tp_plan)
    e, tp, sp = x.e, x.tp, x.s_norm != x.s
    hidden = e * x.tokens * _widths(trace)[1]
    reduce = CollectiveKind.REDUCE_SCATTER if sp else CollectiveKind.ALL_REDUCE
    out: list[Op] = []
    coll: list[Collective] = []
    head_style = plan.get(trace.head_path, "")
    gathered = head_style in GATHERS_OUTPUT or head_style in ROWWISE
    for op in ops:
        style = plan.get(op.name if op.name != "linear_final" else trace.head_path, "")
        if op.name == trace.embedding_path and style in _VOCAB_PARALLEL:
            out.append(_scaled(dataclasses.replace(op, params=op.params / tp), tp, "vocab-parallel"))
            coll.append(Collective("tp_allreduce", reduce, ParallelDim.TP, hidden, Phase.FWD))
        elif op.name == "linear_final" and style in COLWISE | ROWWISE:
            out.append(_scaled_gemm(op, tp, style, sp))
            dims = dict(op.dims)
            logits = e * dims.get("m", 0) * dims.get("n", 0)
            if sp:
                coll.append(Collective("tp_allgather", CollectiveKind.ALL_GATHER, ParallelDim.TP, hidden, Phase.FWD))
            if head_style in GATHERS_OUTPUT:
                coll.append(Collective("tp_allgather_output", CollectiveKind.ALL_GATHER, ParallelDim.TP, logits,
                                       Phase.FWD))
                coll.append(Collective("tp_allreduce", reduce, ParallelDim.TP, hidden, Phase.BWD_INPUT))
            else:
                coll.append(Collective("tp_allreduce", CollectiveKind.ALL_REDUCE, ParallelDim.TP, logits, Phase.FWD))
        elif sp and op.kind is OpKind.NORM:
            out.append(_scaled(op, tp, "sequence parallel"))
        elif op.name == "layer" and not gathered and stage == "last":
            out.append(_scaled(op, tp, "vocab / tp"))
        else:
            out.append(op)  # whole on every rank (the plan does not split it)
    return tuple(out), tuple(coll)
