"""Prove a sharding plan by compiling it (issue 5, part 5): the whole step with the plan's
``NamedSharding``s on the mesh, its result compared with the unsharded step, and the bytes of
XLA's collectives compared with the analytic bytes.

Each block's weight gets a ``PartitionSpec`` from its strategy (the mesh axes on K shard the
weight's contracted dimension, those on N its other one); parameters no block contracts with
(norm gains, biases) are replicated; the batch is sharded over the first block's M axes.
Everything else is left to XLA's sharding propagation (GSPMD), which is what a user applying
the plan gets. In tests the mesh is 8 CPU devices (``--xla_force_host_platform_device_count=8``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from paraplan.sharding.graph import Graph, ParallelBlock

_COLLECTIVE = re.compile(
    r"=\s*(\(?[a-z0-9\[\],{}\s:]*?\)?)\s+(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(")
_ARRAY = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")
_DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "f64": 8, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1}


@dataclass
class Verification:
    max_abs_error: float
    matches: bool  # numerically equal to the unsharded step (allclose)
    xla_collective_bytes: dict[str, float]  # kind -> bytes of the outputs of XLA's collectives
    compiled_flops: float | None


def weight_specs(graph: Graph, blocks: list[ParallelBlock], strategies, axis_names: tuple[str, ...]) -> dict[int, tuple]:
    """Parameter variable id -> PartitionSpec entries (one per weight dimension)."""
    out: dict[int, tuple] = {}
    for block, strategy in zip(blocks, strategies, strict=True):
        eqn = block.entry
        (lc, rc), _ = eqn.params["dimension_numbers"]
        contract = (lc, rc)[block.weight_operand]
        shape = eqn.in_shapes[block.weight_operand]
        if graph.param_shapes.get(block.weight) != shape or block.weight in out:
            continue  # reshaped before use: left replicated; used again (backward): its first use rules
        spec = []
        for d in range(len(shape)):
            want = "K" if d in contract else "N"
            axes = tuple(a for a, c in zip(axis_names, strategy, strict=True) if c == want)
            spec.append(axes[0] if len(axes) == 1 else (axes or None))
        out[block.weight] = tuple(spec)
    return out


def collective_bytes(hlo_text: str) -> dict[str, float]:
    """Bytes of the results of every collective in compiled HLO text, by kind."""
    totals: dict[str, float] = {}
    for shape_text, kind in _COLLECTIVE.findall(hlo_text):
        nbytes = sum(_DTYPE_BYTES.get(dt, 4) * math.prod(int(x) for x in dims.split(",") if x)
                     for dt, dims in _ARRAY.findall(shape_text))
        totals[kind] = totals.get(kind, 0.0) + nbytes
    return totals


def verify(fn, args: tuple, mesh_axes: tuple[tuple[str, int], ...], specs: dict[int, tuple],
           batch_axes: tuple[str, ...], graph: Graph) -> Verification:
    """Compile ``fn(*args)`` with the plan's shardings and compare it with the unsharded run."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    names = tuple(a for a, _ in mesh_axes)
    devices = np.array(jax.devices()[: math.prod(n for _, n in mesh_axes)]).reshape([n for _, n in mesh_axes])
    mesh = jax.sharding.Mesh(devices, names)
    leaves, tree = jax.tree_util.tree_flatten(args[0])
    param_ids = sorted(graph.param_vars)
    shardings = [NamedSharding(mesh, P(*specs[i]) if i in specs else P()) for i in param_ids[: len(leaves)]]
    batch_spec = P(batch_axes if len(batch_axes) > 1 else (batch_axes[0] if batch_axes else None))
    in_shardings = (jax.tree_util.tree_unflatten(tree, shardings), NamedSharding(mesh, batch_spec))
    sharded = jax.jit(fn, in_shardings=in_shardings)
    compiled = sharded.lower(*args).compile()
    expected = jax.jit(fn)(*args)
    got = compiled(*args)
    flat_e = jax.tree_util.tree_leaves(expected)
    flat_g = jax.tree_util.tree_leaves(got)
    error = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(flat_e, flat_g, strict=True))
    matches = all(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5) for a, b in zip(flat_e, flat_g, strict=True))
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    flops = float(cost.get("flops")) if cost and "flops" in cost else None
    return Verification(error, matches, collective_bytes(compiled.as_text()), flops)


def plan_inputs(blocks: list[ParallelBlock], strategies, mesh_axes) -> tuple[str, ...]:
    """Mesh axes the batch is sharded over: the first block's M axes."""
    return tuple(a for (a, _), c in zip(mesh_axes, strategies[0], strict=True) if c == "M")


