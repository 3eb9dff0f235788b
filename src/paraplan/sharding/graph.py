"""A step function's graph as ParallelBlocks (CFP): tensor contractions with a parameter
operand, each grown along the operators through which its sharding propagates with no
communication, and the repeated block sequence (the layers) found once.

The graph is the function's jaxpr (``jax.make_jaxpr``), with calls (``pjit``, custom
derivative rules, ``checkpoint``) inlined -- so a rematerialised step is analysed and verified
without its recomputation. Loops and conditionals (``scan``, ``while``, ``cond``) stay single
operators: contractions inside them are not blocks. The function's first argument holds the
parameters (a pytree), as in ``train_step(params, batch)``.

A block starts at a ``dot_general`` one of whose operands is a parameter (possibly transposed
or cast; a reshaped weight is kept whole) and takes in every later elementwise operator whose
inputs all come from the block, a parameter or constants: a sharding passes through those with
no communication. (CFP also grows blocks through reshapes and reductions over unsplit
dimensions; here those stay in the glue, and a reshape into or out of attention heads instead
sets the *outer factor* a split must divide.) The backward pass's contraction with the same
weight (dx = dy W^T, found by its contracting the weight's other dimensions) belongs to the
forward block; a second forward use of a weight is a block of its own. Operators in no block
(attention's score and value products, norms' statistics, the loss) are the glue between
blocks; strategies and their costs are in :mod:`paraplan.sharding.strategies`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Operators through which a sharding passes unchanged (elementwise and layout-preserving).
ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "max", "min", "neg", "exp", "log", "tanh", "logistic", "erf", "sqrt", "rsqrt",
    "integer_pow", "pow", "convert_element_type", "select_n", "abs", "sign", "square", "exp2", "log1p", "erf_inv",
    "stop_gradient", "copy", "copy_p", "add_any", "cos", "sin", "ge", "gt", "le", "lt", "eq", "ne", "and", "or", "not",
})
#: Operators a parameter may pass through and still count as the contraction's weight.
WEIGHT_VIEWS = frozenset({"convert_element_type", "reshape", "transpose", "copy", "copy_p"})
#: Call-like operators whose sub-graphs are inlined (loops and conditionals are not: they stay
#: single operators, and contractions inside them are not blocks).
CALL_PRIMITIVES = frozenset({"pjit", "jit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call",
                             "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin"})
CALLS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


@dataclass
class Eqn:
    """One operator of the flattened graph: its primitive, input and output variable ids,
    output shapes and parameters."""

    index: int
    primitive: str
    inputs: tuple[int | None, ...]  # variable ids; None for literals
    outputs: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]  # of the outputs
    in_shapes: tuple[tuple[int, ...], ...] = ()  # of the inputs
    in_itemsize: tuple[int, ...] = ()  # bytes per element of the inputs
    in_dtypes: tuple[str, ...] = ()  # of the inputs, e.g. "float32"
    params: dict[str, Any] = field(repr=False, default_factory=dict)
    prim: Any = field(repr=False, default=None)  # the JAX primitive, to evaluate the graph again
    literals: tuple[Any, ...] = field(repr=False, default=())  # per input: its value if a literal


@dataclass
class Graph:
    eqns: list[Eqn]
    param_vars: set[int]  # variable ids of the parameter leaves
    param_shapes: dict[int, tuple[int, ...]]
    invars: list[int] = field(default_factory=list)  # every input leaf: parameters, then the rest
    outvars: list[int] = field(default_factory=list)
    consts: dict[int, Any] = field(repr=False, default_factory=dict)  # constants and literal outputs
    out_tree: Any = None  # the structure of fn's result


@dataclass(eq=False)
class ParallelBlock:
    """A contraction with a parameter operand and the operators its sharding reaches free."""

    index: int
    entry: Eqn  # the dot_general
    weight: int  # the parameter variable id it contracts with
    members: list[Eqn]
    weight_operand: int = 1  # which operand of the entry is (a view of) the weight
    later_uses: list[Eqn] = field(default_factory=list)  # the weight's input-gradient contractions (backward)
    weight_dims: tuple[int, ...] | None = None  # parameter dimension of each weight-operand dimension;
    #                                             None: reshaped on the way (the weight stays whole)
    needs_dx: bool = True  # the input depends on parameters, so its gradient is computed
    k_outer: int | None = None  # a reshape splits the input's contracted dim into (k_outer, ...)
    n_outer: int | None = None  # a reshape splits the output's last dim into (n_outer, ...)

    def signature(self) -> tuple:
        """What makes two blocks the same: the entry's operand shapes, dtypes and dimension
        numbers, which operand is the weight and how it is viewed, the head alignment, and the
        operators and output shapes of the members."""
        e = self.entry
        return (e.in_shapes, e.in_dtypes, e.params["dimension_numbers"], self.weight_operand,
                self.weight_dims is None, self.needs_dx, self.k_outer, self.n_outer,
                tuple((m.primitive, m.shapes) for m in self.members))


def trace(fn: Callable, *args: Any) -> Graph:
    """The flattened graph of ``fn(*args)``; ``args[0]`` holds the parameters."""
    import jax

    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    n_params = len(jax.tree_util.tree_leaves(args[0]))
    ids: dict[Any, int] = {}
    consts: dict[int, Any] = {}
    scopes = [0]

    def vid(var, scope: int = 0) -> int | None:
        """A variable's id; ``scope`` tells apart the inlinings of one sub-graph (JAX caches a
        function's jaxpr, so two calls share its variable objects)."""
        if type(var).__name__ == "Literal":
            return None
        key = (scope, var)
        if key not in ids:
            ids[key] = len(ids)
        return ids[key]

    def new_scope() -> int:
        scopes[0] += 1
        return scopes[0]

    vid.new_scope = new_scope  # type: ignore[attr-defined]
    invars = [vid(v) for v in closed.jaxpr.invars]
    for var, value in zip(closed.jaxpr.constvars, closed.consts, strict=True):
        consts[vid(var)] = value
    params = set(invars[:n_params])
    shapes = {invars[i]: tuple(closed.jaxpr.invars[i].aval.shape) for i in range(n_params)}
    eqns: list[Eqn] = []
    rename: dict[int, int] = {}
    _flatten(closed.jaxpr, eqns, vid, rename, consts, 0)
    outvars = [_out_id(v, rename, vid, consts, 0) for v in closed.jaxpr.outvars]
    return Graph(eqns, params, shapes, [i for i in invars if i is not None], outvars, consts,
                 jax.tree_util.tree_structure(out_shape))


def _out_id(var, rename: dict, vid, consts: dict, scope: int) -> int:
    """The id of an output variable, or of a fresh constant for a literal output."""
    if type(var).__name__ == "Literal":
        i = -(len(consts) + 1)
        consts[i] = var.val
        return i
    i = vid(var, scope)
    return rename.get(i, i)


def _flatten(jaxpr, out: list[Eqn], vid, rename: dict, consts: dict, scope: int) -> None:
    def resolve(var):
        i = vid(var, scope)
        return rename.get(i, i)

    for eqn in jaxpr.eqns:
        sub = next((eqn.params[k] for k in CALLS if k in eqn.params), None)
        if sub is not None and eqn.primitive.name in CALL_PRIMITIVES:
            inner = getattr(sub, "jaxpr", sub)
            inner_scope = vid.new_scope()
            for var, value in zip(inner.constvars, getattr(sub, "consts", ()), strict=False):
                consts[vid(var, inner_scope)] = value
            mapping = dict(rename)
            for inner_var, outer_var in zip(inner.invars, eqn.invars, strict=False):
                if type(outer_var).__name__ == "Literal":
                    mapping[vid(inner_var, inner_scope)] = _out_id(outer_var, rename, vid, consts, scope)
                else:
                    mapping[vid(inner_var, inner_scope)] = resolve(outer_var)
            _flatten(inner, out, vid, mapping, consts, inner_scope)
            for inner_var, outer_var in zip(inner.outvars, eqn.outvars, strict=False):
                rename[vid(outer_var, scope)] = _out_id(inner_var, mapping, vid, consts, inner_scope)
            continue
        out.append(Eqn(
            index=len(out),
            primitive=eqn.primitive.name,
            inputs=tuple(resolve(v) for v in eqn.invars),
            outputs=tuple(vid(v, scope) for v in eqn.outvars),
            shapes=tuple(tuple(getattr(v.aval, "shape", ())) for v in eqn.outvars),
            in_shapes=tuple(tuple(getattr(v.aval, "shape", ())) for v in eqn.invars),
            in_itemsize=tuple(_itemsize(v.aval) for v in eqn.invars),
            in_dtypes=tuple(str(getattr(v.aval, "dtype", "float32")) for v in eqn.invars),
            params=dict(eqn.params),
            prim=eqn.primitive,
            literals=tuple(v.val if type(v).__name__ == "Literal" else None for v in eqn.invars),
        ))


def _itemsize(aval) -> int:
    dtype = getattr(aval, "dtype", None)
    return int(getattr(dtype, "itemsize", 4) or 4)


def parallel_blocks(graph: Graph) -> list[ParallelBlock]:
    """The graph's ParallelBlocks in program order (see the module docstring)."""
    weight_of: dict[int, int] = {v: v for v in graph.param_vars}  # variable -> parameter it views
    dims_of: dict[int, tuple[int, ...] | None] = {v: tuple(range(len(s))) for v, s in graph.param_shapes.items()}
    blocks: list[ParallelBlock] = []
    first_use: dict[int, ParallelBlock] = {}  # parameter -> the block of its first contraction
    owner: dict[int, ParallelBlock] = {}  # variable -> block that produced it
    learned = set(graph.param_vars)  # variables that depend on a parameter
    for eqn in graph.eqns:
        ins = [v for v in eqn.inputs if v is not None]
        if any(v in learned for v in ins):
            learned.update(eqn.outputs)
        if eqn.primitive in WEIGHT_VIEWS and len(ins) == 1 and ins[0] in weight_of:
            weight_of[eqn.outputs[0]] = weight_of[ins[0]]
            dims_of[eqn.outputs[0]] = _view_dims(eqn, dims_of.get(ins[0]))
            continue
        if eqn.primitive == "dot_general":
            operands = [i for i, v in enumerate(eqn.inputs[:2]) if v in weight_of]
            if operands:
                w = operands[-1]
                dims = dims_of.get(eqn.inputs[w])
                first = first_use.get(weight_of[eqn.inputs[w]])
                if first is not None and _is_input_gradient(first, eqn, w, dims):
                    first.later_uses.append(eqn)
                    continue
                block = ParallelBlock(len(blocks), eqn, weight_of[eqn.inputs[w]], [eqn], weight_operand=w,
                                      weight_dims=dims, needs_dx=eqn.inputs[1 - w] in learned)
                blocks.append(block)
                first_use.setdefault(block.weight, block)
                owner[eqn.outputs[0]] = block
                continue
        sources = {owner[v] for v in ins if v in owner}
        if eqn.primitive in ELEMENTWISE and len(sources) == 1:
            block = sources.pop()
            if all((v in owner and owner[v] is block) or v in weight_of for v in ins):
                block.members.append(eqn)
                for o in eqn.outputs:
                    owner[o] = block
    _outer_factors(graph, blocks, owner)
    return blocks


def _view_dims(eqn: Eqn, dims: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """How a view of a weight maps its dimensions to the parameter's: casts and copies keep
    them, a transpose permutes them, a reshape loses them (unless it changes nothing)."""
    if dims is None:
        return None
    if eqn.primitive == "transpose":
        return tuple(dims[p] for p in eqn.params["permutation"])
    if eqn.primitive == "reshape":
        return dims if eqn.shapes[0] == eqn.in_shapes[0] else None
    return dims


def _contracted(eqn: Eqn, operand: int, dims: tuple[int, ...] | None) -> frozenset[int] | None:
    if dims is None:
        return None
    (lc, rc), _ = eqn.params["dimension_numbers"]
    return frozenset(dims[d] for d in (lc, rc)[operand])


def _is_input_gradient(first: ParallelBlock, eqn: Eqn, operand: int, dims: tuple[int, ...] | None) -> bool:
    """A later contraction with a weight is its backward (dx = dy W^T) when it contracts other
    weight dimensions than the first use did; one that contracts the same ones uses the weight
    again in the forward pass (a shared weight) and is a block of its own. When a reshape hides
    the dimensions, every later use counts as backward."""
    before = _contracted(first.entry, first.weight_operand, first.weight_dims)
    now = _contracted(eqn, operand, dims)
    return before is None or now is None or before != now


def _trailing_factor(dims: tuple[int, ...], size: int) -> int | None:
    """The first of the trailing ``dims`` whose product is ``size`` (a reshape's outer factor),
    or None when no run of two or more trailing dims multiplies to it."""
    prod = 1
    for i in range(len(dims) - 1, -1, -1):
        prod *= dims[i]
        if prod == size:
            return dims[i] if i < len(dims) - 1 else None
        if prod > size:
            return None
    return None


def _outer_factors(graph: Graph, blocks: list[ParallelBlock], owner: dict[int, ParallelBlock]) -> None:
    """Head alignment: a reshape that splits a block's output features into (heads, ...) means a
    split of N must divide the heads; one that merges (heads, ...) into a block's input features
    means the same for K. Other reshapes leave the whole dimension as the factor."""
    producer = {o: e for e in graph.eqns for o in e.outputs}
    for eqn in graph.eqns:
        if eqn.primitive != "reshape" or not eqn.in_shapes or not eqn.in_shapes[0]:
            continue
        block = owner.get(eqn.inputs[0]) if eqn.inputs[0] is not None else None
        if block is not None:
            factor = _trailing_factor(eqn.shapes[0], eqn.in_shapes[0][-1])
            if factor is not None:
                block.n_outer = math.gcd(block.n_outer or 0, factor)
    for block in blocks:
        x = block.entry.inputs[1 - block.weight_operand]
        eqn = producer.get(x)
        while eqn is not None and eqn.primitive in ELEMENTWISE and len([v for v in eqn.inputs if v is not None]) == 1:
            eqn = producer.get(next(v for v in eqn.inputs if v is not None))
        if eqn is not None and eqn.primitive == "reshape" and eqn.shapes[0]:
            factor = _trailing_factor(eqn.in_shapes[0], eqn.shapes[0][-1])
            if factor is not None:
                block.k_outer = factor


@dataclass(frozen=True)
class Segments:
    """The block sequence as ``prefix + segment * repeats + suffix`` (block indices)."""

    prefix: tuple[int, ...]
    segment: tuple[int, ...]  # the first occurrence
    repeats: int
    suffix: tuple[int, ...]

    @property
    def unique_blocks(self) -> tuple[int, ...]:
        return self.prefix + self.segment + self.suffix


def find_segments(blocks: Sequence[ParallelBlock]) -> Segments:
    """The longest run of one repeated block sequence (the layers), so that a model of many
    layers is analysed as one segment; the blocks before and after it stay as they are."""
    sig = [b.signature() for b in blocks]
    n = len(sig)
    best = (0, 0, 1)  # (covered blocks, start, period) -> repeats
    best_repeats = 1
    for period in range(1, n // 2 + 1):
        for start in range(n - 2 * period + 1):
            reps = 1
            while start + (reps + 1) * period <= n and sig[start + reps * period:start + (reps + 1) * period] == sig[start:start + period]:
                reps += 1
            if reps > 1 and reps * period > best[0]:
                best, best_repeats = (reps * period, start, period), reps
    covered, start, period = best
    if covered == 0:
        return Segments(tuple(range(n)), (), 0, ())
    return Segments(tuple(range(start)), tuple(range(start, start + period)), best_repeats,
                    tuple(range(start + covered, n)))


@dataclass
class Dataflow:
    source: dict[int, int | None]  # block -> the latest block its input derives from
    joins: set[tuple[int, int]]  # blocks whose outputs meet in one operator outside both
    glue_bytes: dict[int, float]  # block -> largest tensor of the attention-like glue after it
    readers: set[int]  # blocks that read the residual stream (or the step's input)
    writers: set[int]  # blocks whose output is added into the residual stream


def dataflow(graph: Graph, blocks: list[ParallelBlock]) -> Dataflow:
    """Per block: the latest block its input derives from (None: only the step's inputs); the
    pairs of blocks whose outputs meet in one operator outside both; and, per block whose output
    flows through a contraction without parameters (attention's scores and values), the bytes
    of the largest tensor in that glue -- where a layout change would land if one were needed.
    The residual stream: the step's non-parameter inputs, and every sum of a block's output
    with a value from elsewhere (``x + f(x)``), carried through the glue; blocks reading it are
    its readers, blocks added into it its writers.
    One pass over the forward part of the graph (up to the step's first result, the loss, or
    the first backward contraction if that comes earlier)."""
    owner: dict[int, int] = {}
    for b in blocks:
        for e in b.members:
            for o in e.outputs:
                owner[o] = b.index
    end = min((u.index for b in blocks for u in b.later_uses), default=len(graph.eqns))
    producer = {o: e.index for e in graph.eqns for o in e.outputs}
    if graph.outvars and graph.outvars[0] in producer:  # the loss ends the forward pass
        end = min(end, producer[graph.outvars[0]] + 1)
    latest: dict[int, int] = {}
    stream = {v for v in graph.invars if v not in graph.param_vars}
    writers: set[int] = set()
    joins: set[tuple[int, int]] = set()
    largest: dict[int, float] = {}  # block -> largest glue tensor derived from its output
    rigid: set[int] = set()  # blocks whose output goes through a contraction in the glue
    for eqn in graph.eqns[:end]:
        found = {latest[v] for v in eqn.inputs if v is not None and v in latest}
        for o in eqn.outputs:
            if o in owner:
                latest[o] = owner[o]
            elif found:
                latest[o] = max(found)
        glue = not all(o in owner for o in eqn.outputs)
        ins = [v for v in eqn.inputs if v is not None]
        if glue and eqn.primitive in ("add", "add_any") and len(ins) == 2 and len(set(eqn.in_shapes)) == 1:
            origins = [latest.get(v, -1) for v in ins]
            if origins[0] != origins[1] and any(o >= 0 for o in origins):  # x + f(x)
                stream.update(eqn.outputs)
                writers.update(o for o in origins if o >= 0)
        if glue and any(v in stream for v in ins):
            stream.update(o for o in eqn.outputs if o not in owner)
        if glue and found:
            itemsize = eqn.in_itemsize[0] if eqn.in_itemsize else 4
            for b in found:
                largest[b] = max(largest.get(b, 0.0), max(float(math.prod(sh)) * itemsize for sh in eqn.shapes))
                if eqn.primitive == "dot_general":
                    rigid.add(b)
        if len(found) >= 2 and glue:
            ordered = sorted(found)
            joins.update(itertools.combinations(ordered, 2))
    source = {}
    for b in blocks:
        x = b.entry.inputs[1 - b.weight_operand]
        source[b.index] = latest.get(x) if x is not None else None
    readers = {b.index for b in blocks if b.entry.inputs[1 - b.weight_operand] in stream}
    return Dataflow(source, joins, {b: largest[b] for b in rigid}, readers, writers)
