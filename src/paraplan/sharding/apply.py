"""Run a step with a plan's shardings pinned on every block's input (issue 5, part 5).

Sharding only the parameters and the batch leaves every activation's layout to GSPMD's
propagation, which resolves conflicts its own way: with the batch split over one axis and the
weights over another it may all-gather the weights (FSDP-style) instead of computing the
tensor-parallel plan it was given. :func:`constrained` evaluates the step's traced graph again
and puts ``with_sharding_constraint`` on the input of every block's contraction -- the layout
the plan chose for it -- so that the compiled program is the plan. The result is a function of
the same arguments (of the traced shapes) that a user can ``jax.jit`` with the plan's
``in_shardings``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paraplan.sharding.graph import Graph, ParallelBlock


def input_spec(block: ParallelBlock, strategy, axis_names: tuple[str, ...]) -> tuple:
    """PartitionSpec entries of a block's input x: the axes on B over its first batch dimension,
    on M over its first free dimension, on K over its first contracted dimension."""
    eqn = block.entry
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    x = 1 - block.weight_operand
    contract, batch = (lc, rc)[x], (lb, rb)[x]
    ndim = len(eqn.in_shapes[x])
    free = [d for d in range(ndim) if d not in contract and d not in batch]
    home = {"B": batch[0] if batch else None, "M": free[0] if free else None, "K": contract[0] if contract else None}
    spec: list = [None] * ndim
    for dim, d in home.items():
        axes = tuple(a for a, c in zip(axis_names, strategy, strict=True) if c == dim)
        if d is not None and axes:
            spec[d] = axes[0] if len(axes) == 1 else axes
    return tuple(spec)


def output_spec(block: ParallelBlock, strategy, axis_names: tuple[str, ...]) -> tuple:
    """PartitionSpec entries of a block's output y (dot_general's order: batch dimensions, then
    the left operand's free dimensions, then the right's): B and M as in the input, N over the
    weight's first free dimension; K is summed away."""
    eqn = block.entry
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    free = [[d for d in range(len(eqn.in_shapes[o])) if d not in (lc, rc)[o] and d not in (lb, rb)[o]] for o in (0, 1)]
    x = 1 - block.weight_operand
    nb = len(lb)
    start = {0: nb, 1: nb + len(free[0])}
    home = {"B": 0 if nb else None,
            "M": start[x] if free[x] else None,
            "N": start[block.weight_operand] if free[block.weight_operand] else None}
    spec: list = [None] * len(eqn.shapes[0])
    for dim, d in home.items():
        axes = tuple(a for a, c in zip(axis_names, strategy, strict=True) if c == dim)
        if d is not None and axes:
            spec[d] = axes[0] if len(axes) == 1 else axes
    return tuple(spec)


def constrained(graph: Graph, blocks: list[ParallelBlock], strategies, mesh) -> Callable[..., Any]:
    """``fn`` re-evaluated from its graph with each block's input pinned to the plan's layout on
    ``mesh`` (a ``jax.sharding.Mesh``)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    names = tuple(mesh.axis_names)
    pins = {b.entry.index: (1 - b.weight_operand, NamedSharding(mesh, P(*input_spec(b, s, names))))
            for b, s in zip(blocks, strategies, strict=True)}
    outs = {b.entry.index: NamedSharding(mesh, P(*output_spec(b, s, names))) for b, s in zip(blocks, strategies, strict=True)}

    def run(*args):
        leaves = jax.tree_util.tree_leaves(args)
        env: dict[int, Any] = dict(graph.consts)
        env.update(zip(graph.invars, leaves, strict=True))
        for eqn in graph.eqns:
            values = [eqn.literals[i] if v is None else env[v] for i, v in enumerate(eqn.inputs)]
            if eqn.index in pins:
                pos, sharding = pins[eqn.index]
                values[pos] = jax.lax.with_sharding_constraint(values[pos], sharding)
            result = eqn.prim.bind(*values, **eqn.params)
            if eqn.index in outs:
                result = jax.lax.with_sharding_constraint(result, outs[eqn.index])
            if eqn.prim.multiple_results:
                env.update(zip(eqn.outputs, result, strict=True))
            else:
                env[eqn.outputs[0]] = result
        return jax.tree_util.tree_unflatten(graph.out_tree, [env[v] for v in graph.outvars])

    return run
