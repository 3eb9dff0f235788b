"""Tensor (and sequence) parallelism of a traced layer by the model's own plan.

``transformers`` publishes, for each architecture, how its layers split over tensor-parallel
ranks: ``config.base_model_tp_plan`` maps module patterns (``layers.*.self_attn.q_proj``) to
styles (``transformers.integrations.tensor_parallel``): ``colwise`` splits a Linear's output
features (``packed_colwise``, ``local_colwise`` alike; ``colwise_rep`` / ``colwise_gather_output``
then all-gather the output), ``rowwise`` splits its input features and all-reduces the output
(``rowwise_rep``, ``packed_rowwise``, ``rowwise_split_input`` alike; ``local_rowwise`` leaves the
reduction out), ``sequence_parallel`` splits a module's tokens, ``replicate`` (and
``replicated_with_grad_allreduce``, ``local_params``, ``local``) keeps it whole.

Applied to a traced layer at tp ranks: a colwise or rowwise GEMM does 1/tp of its FLOPs and
holds 1/tp of its parameters (its bytes by the same GEMM's shapes); the attention core runs
1/tp of the heads; the other operators of a module whose children are planned (the attention
block, the MLP: the region between a colwise and a rowwise Linear) work on 1/tp of the
activation; the rest of the layer (norms, residual adds) on all of it, or on 1/tp of the tokens
with sequence parallelism. Each rowwise Linear all-reduces its output forward, each group of
colwise Linears sharing a parent its input's gradient backward (Megatron's f and g operators;
Shoeybi et al. 2019); with sequence parallelism each all-reduce is an all-gather and a reduce-
scatter (Korthikanti et al. 2022). Styles of mixtures of experts are not applied yet.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

from paraplan.inventory.ops import Collective, CollectiveKind, Op, OpKind, ParallelDim
from paraplan.specs import ConfigError, Phase

_WHERE = "model.hf_config"
COLWISE = frozenset({"colwise", "packed_colwise", "local_colwise", "colwise_rep", "colwise_gather_output"})
GATHERS_OUTPUT = frozenset({"colwise_rep", "colwise_gather_output"})
ROWWISE = frozenset({"rowwise", "rowwise_rep", "packed_rowwise", "rowwise_split_input", "local_rowwise",
                     "local_packed_rowwise"})
REDUCES_OUTPUT = ROWWISE - {"local_rowwise", "local_packed_rowwise"}
WHOLE = frozenset({"replicate", "replicated_with_grad_allreduce", "local_params", "local", "gather",
                   "sequence_parallel", "all_reduce"})


@functools.lru_cache(maxsize=16)
def _read(path: str) -> str:
    from paraplan.inventory.hftrace import read_config

    return json.dumps(read_config(Path(path)), sort_keys=True)


def config_of(path: str) -> dict[str, Any]:
    """The config.json at ``path`` as a mapping (read once)."""
    return json.loads(_read(path))


@functools.lru_cache(maxsize=16)
def _plan(blob: str) -> tuple[tuple[str, str], ...] | None:
    from paraplan.inventory.hftrace import build_config

    config = build_config(json.loads(blob))
    plan = getattr(config, "base_model_tp_plan", None)
    return tuple(sorted(plan.items())) if plan else None


def layer_plan(config: dict[str, Any]) -> dict[str, str] | None:
    """The model's tensor-parallel plan for the modules of one decoder layer (paths inside the
    layer, ``self_attn.q_proj``), or None when the model publishes none."""
    plan = _plan(json.dumps(config, sort_keys=True))
    if plan is None:
        return None
    return {key.split(".*.", 1)[1]: style for key, style in plan if ".*." in key}


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _scaled_gemm(op: Op, tp: int, style: str, sp: bool) -> Op:
    """A colwise (n / tp) or rowwise (k / tp) GEMM: its FLOPs and parameters 1/tp, its bytes by
    the ideal GEMM's traffic at the sharded shape over the traced one (so eager extras scale)."""
    dims = dict(op.dims)
    m, k, n = dims.get("m", 1), dims.get("k", 1), dims.get("n", 1)
    col = style in COLWISE
    k2, n2 = (k, n // tp) if col else (k // tp, n)

    def ratio(full: float, shard: float) -> float:
        return shard / full if full else 1.0 / tp

    fwd = ratio(m * k + k * n + m * n, m * k2 + k2 * n2 + m * n2)
    wgrad = ratio(m * k + m * n + k * n, m * k2 + m * n2 + k2 * n2)
    dgrad = ratio(m * n + k * n + m * k, m * n2 + k2 * n2 + m * k2)
    bwd_input = op.bwd_bytes - op.bwd_weight_bytes
    # what the GEMM keeps is its input: a colwise GEMM's is the whole activation (1/tp of the
    # tokens under sequence parallelism, gathered again for the weight gradient), a rowwise one's
    # is already split
    saved = op.saved_bytes / tp if (not col or sp) else op.saved_bytes
    return dataclasses.replace(
        op,
        role=f"{op.role} [{style} / {tp}]",
        flops=op.flops / tp, bwd_flops=op.bwd_flops / tp, bwd_weight_flops=op.bwd_weight_flops / tp,
        bytes=op.bytes * fwd, bwd_weight_bytes=op.bwd_weight_bytes * wgrad,
        bwd_bytes=bwd_input * dgrad + op.bwd_weight_bytes * wgrad,
        params=op.params / tp, saved_bytes=saved,
        dims=(("m", m), ("k", k2), ("n", n2)),
    )


def _scaled(op: Op, tp: int, why: str) -> Op:
    """A memory-bound operator (or the attention core) on 1/tp of its elements; its parameters
    (a norm's weight) stay whole."""
    dims = tuple((key, value // tp if key == "h" else value) for key, value in op.dims)
    kept = op.selective_kept_bytes / tp
    return dataclasses.replace(
        op, role=f"{op.role} [{why} / {tp}]", flops=op.flops / tp, bytes=op.bytes / tp, bwd_flops=op.bwd_flops / tp,
        bwd_bytes=op.bwd_bytes / tp, bwd_weight_flops=op.bwd_weight_flops / tp,
        bwd_weight_bytes=op.bwd_weight_bytes / tp, saved_bytes=op.saved_bytes / tp, selective_kept_bytes=kept,
        dims=dims,
    )


def shard_layer(
    ops: tuple[Op, ...], modules: tuple[str, ...], plan: dict[str, str] | None, tp: int, sp: bool, e: int,
) -> tuple[tuple[Op, ...], tuple[Collective, ...]]:
    """One traced layer's operators on one of ``tp`` ranks by ``plan`` (``layer_plan``), with
    the collectives the plan implies. ``modules[i]`` is the path of ``ops[i]`` inside the layer
    (the attention core: its attention module's); ``e`` the activation's bytes per element."""
    if tp == 1:
        return ops, ()
    if not plan:
        raise ConfigError(
            f"{_WHERE}: base_model_tp_plan: the model publishes no tensor-parallel plan, so paraplan "
            f"cannot split it over parallel.tp = {tp}; use tp: 1 or model.inventory: hand"
        )
    unknown = sorted({s for m, s in plan.items() if s not in COLWISE | ROWWISE | WHOLE and m in modules})
    if unknown:
        raise ConfigError(
            f"{_WHERE}: base_model_tp_plan: style {unknown[0]!r} is not applied to a traced inventory yet "
            f"(colwise, rowwise, sequence_parallel and replicate are); use tp: 1 or model.inventory: hand"
        )
    regions = {_parent(m) for m, s in plan.items() if s in COLWISE | ROWWISE and m in modules}
    out: list[Op] = []
    fwd_reduce: list[float] = []  # bytes of each forward reduction (rowwise outputs)
    bwd_reduce: list[float] = []  # bytes of each colwise group's input gradient
    gathers: list[float] = []  # colwise_rep outputs, all-gathered forward
    col_groups: dict[str, float] = {}
    for op, module in zip(ops, modules, strict=True):
        style = plan.get(module)
        if op.kind is OpKind.GEMM and style in COLWISE | ROWWISE:
            dims = dict(op.dims)
            out.append(_scaled_gemm(op, tp, style, sp))
            if style in REDUCES_OUTPUT:
                fwd_reduce.append(e * dims.get("m", 0) * dims.get("n", 0))
            if style in COLWISE:
                col_groups.setdefault(_parent(module), e * dims.get("m", 0) * dims.get("k", 0))
            if style in GATHERS_OUTPUT:
                gathers.append(e * dims.get("m", 0) * dims.get("n", 0))
        elif op.kind is OpKind.ATTENTION or any(module == r or module.startswith(r + ".") for r in regions if r):
            out.append(_scaled(op, tp, "heads" if op.kind is OpKind.ATTENTION else "tp region"))
        elif sp:
            out.append(_scaled(op, tp, "sequence parallel"))
        else:
            out.append(op)
    bwd_reduce = list(col_groups.values())
    coll: list[Collective] = []

    def add(name: str, kind: CollectiveKind, sizes: list[float], phase: Phase) -> None:
        for size in sorted(set(sizes)):
            coll.append(Collective(name, kind, ParallelDim.TP, size, phase, sizes.count(size)))

    if sp:
        add("tp_allgather", CollectiveKind.ALL_GATHER, bwd_reduce, Phase.FWD)
        add("tp_reducescatter", CollectiveKind.REDUCE_SCATTER, fwd_reduce, Phase.FWD)
        add("tp_allgather", CollectiveKind.ALL_GATHER, fwd_reduce, Phase.BWD_INPUT)
        add("tp_reducescatter", CollectiveKind.REDUCE_SCATTER, bwd_reduce, Phase.BWD_INPUT)
    else:
        add("tp_allreduce", CollectiveKind.ALL_REDUCE, fwd_reduce, Phase.FWD)
        add("tp_allreduce", CollectiveKind.ALL_REDUCE, bwd_reduce, Phase.BWD_INPUT)
    add("tp_allgather_output", CollectiveKind.ALL_GATHER, gathers, Phase.FWD)
    return tuple(out), tuple(coll)
