"""Operators outside the transformer layers: embedding (first stage), LM head and loss (last)."""

from __future__ import annotations

import dataclasses
import functools

from paraplan.inventory.fp8 import amax_reductions
from paraplan.inventory.layer import elementwise, gemm, norm
from paraplan.inventory.ops import Collective, CollectiveKind, Op, OpKind, ParallelDim
from paraplan.inventory.shapes import LocalShape
from paraplan.specs import Framework, ModelSpec, ParallelPlan, Phase


@functools.lru_cache(maxsize=256)
def count_embedding_ops(model: ModelSpec, x: LocalShape) -> tuple[Op, ...]:
    """Vocab-parallel word embedding (+ learned positions) for one micro-batch; a traced
    model's from its own code (``traced_ends``)."""
    if model.inventory == "traced":
        from paraplan.inventory.traced_ends import traced_embedding_ops

        return traced_embedding_ops(model, x)
    hidden = x.b * x.s * x.h
    table = x.vocab * x.h
    lookup = Op(
        name="embedding",
        kind=OpKind.EMBEDDING,
        role="word embedding lookup (vocab-parallel)",
        flops=hidden,
        bytes=x.e * 2 * hidden,
        bwd_flops=hidden,
        # backward zero-fills and scatter-adds into the [vocab/tp, h] gradient
        bwd_bytes=x.e * (2 * hidden + table),
        params=table,
        dims=(("tokens", x.b * x.s), ("vocab", x.vocab), ("dim", x.h)),
    )
    ops = [lookup]
    if model.position_embedding == "learned":
        ops.append(
            elementwise(
                "res_add",
                OpKind.ELEMENTWISE,
                "add learned position embedding",
                hidden,
                x.e,
                reads=2.0,
                params=model.seq_length * x.h,
            )
        )
    return tuple(ops)


@functools.lru_cache(maxsize=256)
def count_head_ops(model: ModelSpec, x: LocalShape) -> tuple[Op, ...]:
    """Final norm, LM-head GEMM (vocab-parallel) and the vocab-parallel cross entropy; a traced
    model's from its own code (``traced_ends``)."""
    if model.inventory == "traced":
        from paraplan.inventory.traced_ends import traced_head_ops

        return traced_head_ops(model, x)
    logits = x.b * x.s * x.vocab
    return (
        norm(model, x, "final norm"),
        gemm(
            "linear_final",
            "LM head (output projection)",
            x.tokens,
            x.h,
            x.vocab,
            x.e,
            bias=False,
            saved=x.e * x.b * x.s_norm * x.h,
        ),
        Op(
            name="cross_entropy",
            kind=OpKind.LOSS,
            role="vocab-parallel cross entropy (fp32)",
            flops=5.0 * logits,
            bytes=(x.e + 4.0 * 2) * logits,  # read logits, write fp32 exp-logits, read them back
            bwd_flops=2.0 * logits,
            bwd_bytes=(4.0 + x.e) * logits,
            saved_bytes=4.0 * logits,  # fp32 softmax kept for the backward pass
            dims=(("b", x.b), ("l", x.s), ("vocab", x.vocab)),
        ),
    )


def chunked_loss(plan: ParallelPlan, x: LocalShape, ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """``ops`` (a last stage's end operators) as torchtitan's ``ChunkedLossWrapper`` runs them
    (``loss_chunks`` n > 1; torchtitan/components/loss.py): the model stops before the LM head,
    the hidden states [T, D] are split into n contiguous chunk copies (detached leaves), and
    each chunk runs the LM head, the loss and its backward at once, its input gradient copied
    into an fp32 ``GradAccumulator`` of [T, D]; the decoder's backward runs once afterwards.
    The loss saves one chunk's fp32 softmax (1/n of it) and holds, across the chunks, the
    copies (e bytes a hidden element) and the accumulator (4), which its saved bytes carry.
    Under tensor parallelism the chunks are the replicated hidden states, [b x s, h] on every
    rank. Time is not changed (the same FLOPs in n smaller GEMMs)."""
    n = plan.loss_chunks or 1
    if n <= 1:
        return ops
    held = (x.e + 4.0) * x.b * x.s * x.h
    return tuple(dataclasses.replace(op, saved_bytes=op.saved_bytes / n + held) if op.kind is OpKind.LOSS else op
                 for op in ops)


def count_end_collectives(
    model: ModelSpec, plan: ParallelPlan, x: LocalShape, *, first: bool, last: bool
) -> tuple[Collective, ...]:
    """TP communication of the vocab-parallel embedding and LM head.

    The embedding's partial outputs are all-reduced (reduce-scattered with sequence
    parallelism, whose backward then all-gathers the gradient). The LM head's input is
    replicated (all-gathered from the sequence shards with sequence parallelism) and its
    input gradient all-reduced (reduce-scattered); the loss all-reduces three [s, b] fp32
    statistics (max, sum of exponentials, target logit).
    """
    out: tuple[Collective, ...] = ()
    if plan.tp > 1:
        sp = plan.sequence_parallel
        gathers_p2p = plan.pp > 1 and plan.scatters_p2p and not sp
        out = _end_collectives(x, sp, gathers_p2p, plan.framework is Framework.DEEPSPEED, first, last)
    if model.inventory == "traced":
        from paraplan.inventory.traced_ends import traced_end_collectives

        out = tuple(traced_end_collectives(model, x, first=first, last=last, hand=out))
    if last and model.mtp_num_layers:
        from paraplan.inventory.mtp import count_mtp_collectives

        out = out + tuple(count_mtp_collectives(model, plan, x))
    if x.fp8_linears:  # DelayedScaling's amax reductions, per model chunk (``inventory.fp8``)
        out = out + amax_reductions(model, plan, x.fp8_recipe)
    return out


@functools.lru_cache(maxsize=1024)
def _end_collectives(
    x: LocalShape, sp: bool, gathers_p2p: bool, deepspeed: bool, first: bool, last: bool
) -> tuple[Collective, ...]:
    """``count_end_collectives`` with tp > 1, by what it reads of the plan (every stage of every
    Job of a plan search asks: one tuple per answer, kept)."""
    out: list[Collective] = []
    hidden = x.e * x.tokens * x.h
    reduce = CollectiveKind.REDUCE_SCATTER if sp else CollectiveKind.ALL_REDUCE
    if first:
        out.append(Collective("tp_allreduce", reduce, ParallelDim.TP, hidden, Phase.FWD))
        if sp:
            out.append(Collective("tp_allgather", CollectiveKind.ALL_GATHER, ParallelDim.TP, hidden, Phase.BWD_INPUT))
    if last:
        if sp:
            out.append(Collective("tp_allgather", CollectiveKind.ALL_GATHER, ParallelDim.TP, hidden, Phase.FWD))
        out.append(
            Collective("tp_allreduce", CollectiveKind.ALL_REDUCE, ParallelDim.TP, 4.0 * x.tokens, Phase.FWD, 3)
        )
        out.append(Collective("tp_allreduce", reduce, ParallelDim.TP, hidden, Phase.BWD_INPUT))
    if gathers_p2p:
        # A pipeline message travels as one 1/tp slice and the receiver all-gathers it:
        # the activation before the forward, the gradient before the backward. DeepSpeed's
        # engine also gathers its own output back before the backward, having kept only a
        # slice of it (PipelineEngine._exec_forward_pass / _exec_backward_pass,
        # is_pipe_partitioned and is_grad_partitioned whenever tp > 1).
        if not first:
            out.append(Collective("tp_allgather_p2p", CollectiveKind.ALL_GATHER, ParallelDim.TP, hidden, Phase.FWD))
        if not last:
            rebuilt = 2 if deepspeed else 1
            out.append(
                Collective("tp_allgather_p2p", CollectiveKind.ALL_GATHER, ParallelDim.TP, hidden,
                           Phase.BWD_INPUT, rebuilt)
            )
    return tuple(out)


def tied_weight(model: ModelSpec, x: LocalShape) -> float:
    """The weight a tied LM head shares with the input embedding (the table at ``x``'s
    vocabulary; a traced model's unpadded)."""
    if model.inventory == "traced":
        from paraplan.inventory.traced_ends import tied_table

        return tied_table(model, x)
    return float(x.vocab * x.h)
