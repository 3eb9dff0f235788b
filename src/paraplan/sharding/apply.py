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
from paraplan.sharding.layouts import operand_spec, output_spec


def constrained(graph: Graph, blocks: list[ParallelBlock], strategies, mesh) -> Callable[..., Any]:
    """``fn`` re-evaluated from its graph with each block's input pinned to the plan's layout on
    ``mesh`` (a ``jax.sharding.Mesh``)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    names = tuple(mesh.axis_names)
    pins = {b.entry.index: (1 - b.weight_operand, NamedSharding(mesh, P(*operand_spec(b, s, names, 1 - b.weight_operand))))
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
