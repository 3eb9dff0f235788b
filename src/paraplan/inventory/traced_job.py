"""A traced layer in the job's precision and context parallelism (``inventory: traced``).

**FP8.** The trace runs in 16 bits (the meta device has no FP8 GEMMs to record); FP8 training
as Transformer Engine and torchao run it changes only the layer's linear GEMMs and adds the casts
around them. So, as the hand-written layer does (``layer.with_fp8_casts``): each traced linear
GEMM (every GEMM but the router's scores, which stay in 16 bits) becomes an FP8 GEMM at its
traced (and tensor-parallel) shape (``layer.gemm``: one-byte operands, its input kept in FP8),
run as the job's recipe runs it (``layer.recipe_gemm``), and the layer gains the recipe's casts,
amaxes and transposes of those GEMMs' inputs and output gradients (``layer.fp8_casts``,
``inventory.fp8``). A GEMM right after a norm reads the FP8 input the fused norm writes
(Transformer Engine's LayerNormLinear: the hand-written ``linear1`` and ``linear3``); a QK-norm
feeds no GEMM.

**Context parallelism.** The layer is traced at the rank's sequence chunk (seq / cp tokens), so
every per-token operator is the rank's share; the attention core then attends its chunk's
queries to all seq keys (ring attention, Megatron-Core's ``p2p``, or the all-gather variants):
its FLOPs grow by cp and it reads every chunk's keys and values, as the hand-written core
(``layer.attention_core``: 4 b h s s_kv d, bytes e (2 q + 2 kv)), keeping its own chunk's q, k
and v, launched as the plan's context parallelism launches it (``layer.context_parallel_core``:
one launch per K/V chunk for a ring). The CP collectives are the hand-written ones (``layer.count_layer_collectives``).

Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses

from paraplan.inventory.layer import context_parallel_core, fp8_casts, gemm, recipe_gemm
from paraplan.inventory.ops import Op, OpKind
from paraplan.inventory.shapes import LocalShape
from paraplan.specs import ConfigError


def in_job(ops: tuple[Op, ...], x: LocalShape) -> tuple[Op, ...]:
    """One traced layer's (sharded) operators in the job's FP8 recipe and context parallelism."""
    if x.s_kv != x.s:
        ops = tuple(out for op in ops
                    for out in (context_parallel_core(_ring_attention(op, x), x) if op.kind is OpKind.ATTENTION else (op,)))
    if x.fp8_linears:
        ops = traced_fp8(ops, x)
    return ops


def _is_linear(op: Op) -> bool:
    return op.kind is OpKind.GEMM and "router" not in op.role.lower() and {"m", "k", "n"} <= dict(op.dims).keys()


def traced_fp8(ops: tuple[Op, ...], x: LocalShape) -> tuple[Op, ...]:
    """``ops`` with their linear GEMMs in FP8 (``x.fp8_recipe``) and the casts those need."""
    out: list[Op] = []
    fed: set[str] = set()
    previous: Op | None = None
    for op in ops:
        if _is_linear(op) and not op.fp8:
            dims = dict(op.dims)
            e = x.e
            g = gemm(op.name, op.role, dims["m"], dims["k"], dims["n"], e, bias=False, saved=op.saved_bytes, fp8=True)
            op = dataclasses.replace(op, bytes=g.bytes, bwd_bytes=g.bwd_bytes, bwd_weight_bytes=g.bwd_weight_bytes,
                                     saved_bytes=g.saved_bytes, fp8=True)
            if previous is not None and previous.kind is OpKind.NORM and previous.name != "qk_norm":
                fed.add(op.name)
        op = recipe_gemm(op, x.fp8_recipe, x.e)
        out.append(op)
        previous = op
    gemms = [op for op in out if op.fp8]
    if not gemms:
        return tuple(out)
    return (*out, fp8_casts(gemms, x.e, x.fp8_recipe, norm_fed=frozenset(fed)))


def _ring_attention(op: Op, x: LocalShape) -> Op:
    """The traced core (``seq / cp`` queries and keys) attending to all ``seq`` keys."""
    cp = x.s_kv // x.s
    if abs(op.exec_fraction - 0.5) > 1e-12:
        raise ConfigError("parallel.cp: context parallelism of a sliding-window or non-causal traced attention is "
                          "not applied yet; use cp: 1 or model.inventory: hand")
    reads = (x.heads + cp * x.groups) / (x.heads + x.groups)  # q, o once; every chunk's k and v
    dims = tuple((k, x.s_kv if k == "l_kv" else v) for k, v in op.dims)
    return dataclasses.replace(
        op, role=f"{op.role} [context parallel / {cp}: all {x.s_kv} keys]",
        flops=op.flops * cp, bwd_flops=op.bwd_flops * cp, bytes=op.bytes * reads, bwd_bytes=op.bwd_bytes * reads,
        dims=dims,
    )
