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
from paraplan.sharding.layouts import batch_major, operand_spec, output_spec


def _pins(graph: Graph, blocks: list[ParallelBlock], strategies, names) -> tuple[dict, dict]:
    """Per operator index: {operand position: spec} for its inputs, and a spec for its result.
    Forward: each block's input x and result y. Backward (the step's graph already holds it):
    the input gradient dx = dy W^T reads dy in y's layout and gives dx in x's; the weight
    gradient dW = x^T dy (a contraction of the block's saved input) reads dy in y's layout."""
    inputs: dict[int, dict[int, tuple]] = {}
    results: dict[int, tuple] = {}
    major = batch_major(strategies, names)
    backward_from = min((u.index for b in blocks for u in b.later_uses), default=len(graph.eqns))
    contractions = [e for e in graph.eqns[backward_from:] if e.primitive == "dot_general"]
    for b, s in zip(blocks, strategies, strict=True):
        x = 1 - b.weight_operand
        x_spec, y_spec = operand_spec(b, s, names, x, major), output_spec(b, s, names, major)
        x_shape, y_shape = b.entry.in_shapes[x], b.entry.shapes[0]
        w_size = sorted(b.entry.in_shapes[b.weight_operand])
        inputs.setdefault(b.entry.index, {})[x] = x_spec
        results[b.entry.index] = y_spec
        x_var = b.entry.inputs[x]
        for eqn in contractions:
            dx = eqn in b.later_uses
            dw = x_var in eqn.inputs[:2] and sorted(eqn.shapes[0]) == w_size
            if not (dx or dw):
                continue
            for pos, shape in enumerate(eqn.in_shapes[:2]):
                if eqn.inputs[pos] != x_var and shape == y_shape:
                    inputs.setdefault(eqn.index, {})[pos] = y_spec
            if dx and eqn.shapes[0] == x_shape:
                results[eqn.index] = x_spec
    return inputs, results


def constrained(graph: Graph, blocks: list[ParallelBlock], strategies, mesh) -> Callable[..., Any]:
    """``fn`` re-evaluated from its graph with each block's activations pinned to the plan's
    layouts on ``mesh`` (a ``jax.sharding.Mesh``): see :func:`_pins`."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    spec_in, spec_out = _pins(graph, blocks, strategies, tuple(mesh.axis_names))
    pins = {i: {pos: NamedSharding(mesh, P(*spec)) for pos, spec in d.items()} for i, d in spec_in.items()}
    outs = {i: NamedSharding(mesh, P(*spec)) for i, spec in spec_out.items()}

    def run(*args):
        leaves = jax.tree_util.tree_leaves(args)
        env: dict[int, Any] = dict(graph.consts)
        env.update(zip(graph.invars, leaves, strict=True))
        for eqn in graph.eqns:
            values = [eqn.literals[i] if v is None else env[v] for i, v in enumerate(eqn.inputs)]
            for pos, sharding in pins.get(eqn.index, {}).items():
                values[pos] = jax.lax.with_sharding_constraint(values[pos], sharding)
                env[eqn.inputs[pos]] = values[pos]  # later readers (the backward's dW) see the pinned layout
            result = eqn.prim.bind(*values, **eqn.params)
            if eqn.index in outs:
                result = jax.lax.with_sharding_constraint(result, outs[eqn.index])
            if eqn.prim.multiple_results:
                env.update(zip(eqn.outputs, result, strict=True))
            else:
                env[eqn.outputs[0]] = result
        return jax.tree_util.tree_unflatten(graph.out_tree, [env[v] for v in graph.outvars])

    return run
