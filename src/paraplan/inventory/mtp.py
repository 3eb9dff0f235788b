"""Multi-token prediction (``model.mtp_num_layers``, Megatron-Core's ``--mtp-num-layers``).

DeepSeek-AI 2024, "DeepSeek-V3 Technical Report" (arXiv 2412.19437), section 2.2: D sequential
modules, the k-th predicting the token k + 1 ahead. Each runs, on every token: the shared
embedding of the token k ahead, an RMSNorm of it and one of the previous depth's hidden state,
their concatenation projected from 2h to h (M_k), one transformer block (DeepSeek-V3's: a
mixture of experts, as its last layer), the shared output head (its final norm, the LM head
GEMM) and a cross entropy. Megatron-Core places the modules on the last pipeline stage
(``MultiTokenPredictionBlock``), which then also holds an embedding to look the tokens up,
kept equal to the first stage's by the embedding group's all-reduce.

Parameters: each module's norms, projection and block; the embedding and head are the main
model's (DeepSeek-V3-Base README_WEIGHTS.md: "11.5B unique parameters, excluding the shared 0.9B
Embedding and 0.9B output Head"; paraplan counts 11.61B). The model card's 685B (671B main +
14B MTP) counts the checkpoint, which also stores the MTP layer's copies of the embedding table
and output head (``mtp_checkpoint_params``).
"""

from __future__ import annotations

import dataclasses
import functools

from paraplan.inventory.ends import count_embedding_ops, count_head_ops
from paraplan.inventory.layer import count_layer_collectives, count_layer_ops, elementwise, gemm, norm
from paraplan.inventory.moe import count_moe_collectives, count_moe_layer_ops
from paraplan.inventory.ops import Collective, Op, OpKind, ParallelDim
from paraplan.inventory.shapes import LocalShape
from paraplan.specs import ModelSpec, ParallelPlan


def _mtp(op: Op) -> Op:
    return dataclasses.replace(op, role=f"MTP: {op.role}")


def _shared(op: Op) -> Op:
    """An operator of the shared embedding or head: its weight is the main model's."""
    return dataclasses.replace(op, role=f"MTP (shared weight): {op.role}", params=0.0)


@functools.lru_cache(maxsize=64)
def count_mtp_ops(model: ModelSpec, x: LocalShape) -> tuple[Op, ...]:
    """The operators of the model's multi-token-prediction modules on one last-stage rank,
    one micro-batch (empty when ``mtp_num_layers`` is 0)."""
    if not model.mtp_num_layers:
        return ()
    hidden = x.b * x.s_norm * x.h
    block = _block(model, x)[0]
    lookup = next(op for op in count_embedding_ops(model, x) if op.kind is OpKind.EMBEDDING)
    one = (
        _shared(lookup),
        norm(model, x, "MTP: norm of the next token's embedding"),
        norm(model, x, "MTP: norm of the previous depth's hidden state"),
        elementwise("mtp_concat", OpKind.ELEMENTWISE, "MTP: both halves concatenated", 2.0 * hidden, x.e),
        gemm("mtp_eh_proj", "MTP: projection of the concatenation, 2h -> h (column-parallel)", x.tokens, 2 * x.h,
             x.h // x.tp, x.e, bias=False, saved=2.0 * x.e * hidden),
        *(_mtp(op) for op in block),
        *(_shared(op) if op.name == "linear_final" else _mtp(op) for op in count_head_ops(model, x)),
    )
    return one * model.mtp_num_layers


def count_mtp_collectives(model: ModelSpec, plan: ParallelPlan, x: LocalShape) -> tuple[Collective, ...]:
    """The tensor- and expert-parallel communication of the MTP modules' transformer blocks."""
    if not model.mtp_num_layers:
        return ()
    return _block(model, x, plan)[1] * model.mtp_num_layers


def _block(model: ModelSpec, x: LocalShape, plan: ParallelPlan | None = None,
           ) -> tuple[tuple[Op, ...], tuple[Collective, ...]]:
    """The transformer block of an MTP module: the kind of the model's last layer, hand-written
    or, for a traced model, its traced kind (its operators and tensor-parallel collectives)."""
    if model.inventory == "traced":
        from paraplan.inventory.traced import is_moe_label, traced_layer_indices, traced_layers

        last = next(k for k, ix in traced_layer_indices(model, x).items() if model.num_layers - 1 in ix)
        ops, coll = traced_layers(model, x)[last]
        if plan is not None:  # as count_job takes a traced kind's: its plan's TP, the rest hand-written
            hand = count_moe_collectives(model, plan, x) if is_moe_label(last) else count_layer_collectives(model, plan, x)
            coll += tuple(c for c in hand if c.dim is not ParallelDim.TP or c.name == "tp_allgather_checkpoint")
        return ops, coll
    moe = model.moe_layers[-1]
    ops = count_moe_layer_ops(model, x) if moe else count_layer_ops(model, x)
    if plan is None:
        return ops, ()
    return ops, count_moe_collectives(model, plan, x) if moe else count_layer_collectives(model, plan, x)


def mtp_checkpoint_params(model: ModelSpec, x: LocalShape) -> float:
    """The copies of the embedding table and output head the MTP modules' checkpoint stores
    (DeepSeek-V3's ``model.layers.61.embed_tokens`` and ``shared_head.head``), which its
    authors' 685B counts and training shares with the main model."""
    return 2.0 * model.mtp_num_layers * x.vocab * x.h
