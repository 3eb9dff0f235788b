"""Prove a sharding plan by compiling it (issue 5, part 5): the whole step with the plan's
``NamedSharding``s on the mesh, its result compared with the unsharded step, and the bytes of
XLA's collectives compared with the analytic bytes.

Each block's weight gets a ``PartitionSpec`` from its strategy (:mod:`.layouts`; through the
transposes it was viewed with); parameters no block contracts with (norm gains, biases) are
replicated; the batch is sharded over the layout most blocks give their batch dimension. Every
block's input and output are pinned to the plan's layout (:mod:`.apply`), so that GSPMD
compiles this plan and only chooses the layouts of the operators between blocks. In tests the
mesh is 8 CPU devices (``--xla_force_host_platform_device_count=8``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from paraplan.sharding.graph import Graph, ParallelBlock
from paraplan.sharding.layouts import operand_spec

_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT\s+)?%?\S+\s*=\s*(.+?)\s+(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start)?\(",
    re.MULTILINE)
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_DTYPE_BYTES = {"f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16, "f32": 4, "s32": 4, "u32": 4, "bf16": 2,
                "f16": 2, "s16": 2, "u16": 2, "s8": 1, "u8": 1, "pred": 1}


def _dtype_bytes(dtype: str) -> int:
    if dtype in _DTYPE_BYTES:
        return _DTYPE_BYTES[dtype]
    return 1 if dtype.startswith(("f8", "s4", "u4", "f4")) else 4


#: A plan whose compiled collective bytes differ from the analytic ones by more than this
#: fraction (of the larger total) is flagged.
FLAG_THRESHOLD = 0.05


@dataclass
class Verification:
    max_abs_error: float | None  # None when the arguments were abstract (compiled, not run)
    matches: bool | None  # numerically equal to the unsharded step (allclose); None: not run
    xla_collective_bytes: dict[str, float]  # kind -> bytes of the results of XLA's collectives
    analytic_collective_bytes: dict[str, float]
    compiled_flops: float | None  # XLA's cost_analysis, per device
    xla_memory_bytes: float | None  # XLA's memory_analysis: arguments + outputs + temporaries
    compile_s: float

    def to_dict(self) -> dict:
        return {"matches": self.matches, "max_abs_error": self.max_abs_error,
                "xla_collective_bytes": self.xla_collective_bytes,
                "analytic_collective_bytes": self.analytic_collective_bytes,
                "bytes_difference": self.bytes_difference, "flag": self.flag,
                "compiled_flops": self.compiled_flops, "xla_memory_bytes": self.xla_memory_bytes,
                "compile_s": self.compile_s}

    @property
    def bytes_difference(self) -> float:
        """(XLA - analytic) / the larger of the two totals; 0 when both are 0."""
        xla, ana = sum(self.xla_collective_bytes.values()), sum(self.analytic_collective_bytes.values())
        return 0.0 if max(xla, ana) == 0 else (xla - ana) / max(xla, ana)

    @property
    def flag(self) -> str | None:
        """Why the plan is not as predicted, or None: wrong numbers, or collective bytes of
        any kind (or in all) more than :data:`FLAG_THRESHOLD` of the total away from the
        analytic ones."""
        if self.matches is False:
            return f"the sharded step differs from the unsharded one (max |error| {self.max_abs_error:.2e})"
        kinds = sorted(set(self.xla_collective_bytes) | set(self.analytic_collective_bytes))
        total = max(sum(self.xla_collective_bytes.values()), sum(self.analytic_collective_bytes.values()))
        parts = []
        for kind in kinds:  # a kind off by more than the threshold of the total
            x, a = self.xla_collective_bytes.get(kind, 0.0), self.analytic_collective_bytes.get(kind, 0.0)
            if abs(x - a) > FLAG_THRESHOLD * total:
                parts.append(f"{kind} {_kib(x)} compiled vs {_kib(a)} analytic")
        if not parts and abs(self.bytes_difference) <= FLAG_THRESHOLD:
            return None
        detail = "; ".join(parts) or "spread over every kind"
        return (f"XLA's collectives move {self.bytes_difference:+.0%} bytes vs the analytic model ({detail}): "
                "communication the block model does not see (resharding inside the glue between blocks) "
                "or a collective XLA chose differently")


def _kib(nbytes: float) -> str:
    return f"{nbytes / 1024:,.1f} KiB"


def weight_specs(graph: Graph, blocks: list[ParallelBlock], strategies, axis_names: tuple[str, ...]) -> dict[int, tuple]:
    """Parameter variable id -> PartitionSpec entries (one per weight dimension)."""
    out: dict[int, tuple] = {}
    for block, strategy in zip(blocks, strategies, strict=True):
        if block.weight_dims is None or block.weight in out:
            continue  # reshaped before use: left whole; used again: its first block rules
        operand = operand_spec(block, strategy, axis_names, block.weight_operand)
        spec: list = [None] * len(graph.param_shapes[block.weight])
        for i, d in enumerate(block.weight_dims):  # through the transposes on the way
            spec[d] = operand[i]
        out[block.weight] = tuple(spec)
    return out


def collective_bytes(hlo_text: str) -> dict[str, float]:
    """Bytes of the results of every collective in compiled HLO text, by kind."""
    totals: dict[str, float] = {}
    for shape_text, kind, start in _COLLECTIVE.findall(hlo_text):
        arrays = [_dtype_bytes(dt) * math.prod(int(x) for x in dims.split(",") if x)
                  for dt, dims in _ARRAY.findall(shape_text)]
        if start and kind == "collective-permute" and len(arrays) >= 2:
            arrays = [arrays[1]]  # (operand, result, context...)
        elif start and kind != "all-reduce" and len(arrays) >= 2:
            arrays = arrays[len(arrays) // 2:]  # ((operands...), (results...))
        totals[kind] = totals.get(kind, 0.0) + sum(arrays)
    return totals


def device_mesh(mesh_axes: tuple[tuple[str, int], ...]):
    """A ``jax.sharding.Mesh`` of the first devices, row-major over the axes (as the cost model
    lays them out); a clear error when there are too few."""
    import jax
    import numpy as np

    from paraplan.specs import ConfigError

    size = math.prod(n for _, n in mesh_axes)
    if len(jax.devices()) < size:
        raise ConfigError(
            f"mesh: needs {size} devices to compile the plan, JAX sees {len(jax.devices())} "
            f"(on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count={size} before JAX starts)")
    devices = np.array(jax.devices()[:size]).reshape([n for _, n in mesh_axes])
    return jax.sharding.Mesh(devices, tuple(a for a, _ in mesh_axes))


def verify(fn, args: tuple, mesh_axes: tuple[tuple[str, int], ...], specs: dict[int, tuple],
           batch_axes: tuple[str, ...], graph: Graph, analytic_bytes: dict[str, float] | None = None,
           pins: tuple[list[ParallelBlock], list] | None = None) -> Verification:
    """Compile ``fn(*args)`` with the plan's shardings on the first devices; when the arguments
    are concrete arrays, run it and compare with the unsharded run. With ``pins`` (blocks and
    their strategies) every block's input is pinned to the plan's layout
    (:func:`paraplan.sharding.apply.constrained`); without, GSPMD propagates the rest."""
    import time

    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from paraplan.specs import ConfigError

    mesh = device_mesh(mesh_axes)
    leaves, tree = jax.tree_util.tree_flatten(args[0])
    param_ids = sorted(graph.param_vars)
    shardings = [NamedSharding(mesh, P(*specs[i]) if i in specs else P()) for i in param_ids[: len(leaves)]]
    batch_spec = P(batch_axes if len(batch_axes) > 1 else (batch_axes[0] if batch_axes else None))
    batch, replicated = NamedSharding(mesh, batch_spec), NamedSharding(mesh, P())
    ways = math.prod(n for a, n in mesh_axes if a in batch_axes)

    def batch_or_whole(leaf):  # the batch axis splits leaves whose first dimension it divides
        shape = getattr(leaf, "shape", ())
        return batch if shape and shape[0] % ways == 0 else replicated

    rest = [jax.tree_util.tree_map(batch_or_whole if i == 0 else (lambda _: replicated), a)
            for i, a in enumerate(args[1:])]
    in_shardings = (jax.tree_util.tree_unflatten(tree, shardings), *rest)
    step = fn
    if pins is not None:
        from paraplan.sharding.apply import constrained

        step = constrained(graph, pins[0], pins[1], mesh)
    start = time.perf_counter()
    try:
        compiled = jax.jit(step, in_shardings=in_shardings).lower(*args).compile()
    except Exception as exc:  # XLA's own message, on one line
        raise ConfigError(f"verify: XLA could not compile the plan: {str(exc).splitlines()[0]}") from None
    compile_s = time.perf_counter() - start
    error = matches = None
    if not any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree_util.tree_leaves(args)):
        flat_e = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
        flat_g = jax.tree_util.tree_leaves(compiled(*args))
        pairs = [(np.asarray(a), np.asarray(b)) for a, b in zip(flat_e, flat_g, strict=True)]
        error = max((float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) for a, b in pairs if a.size),
                    default=0.0)
        matches = all(_close(a, b) for a, b in pairs)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    flops = float(cost["flops"]) if cost and "flops" in cost else None
    memory = compiled.memory_analysis()
    used = (None if memory is None else float(memory.argument_size_in_bytes + memory.output_size_in_bytes
                                              + memory.temp_size_in_bytes - memory.alias_size_in_bytes))
    return Verification(error, matches, collective_bytes(compiled.as_text()), dict(analytic_bytes or {}), flops,
                        used, compile_s)


def _close(expected, got) -> bool:
    """Equal up to the rounding of the dtype: a sharded reduction adds in another order, so
    allow a few units in the last place of the largest value (fp32: 1e-4 relative at least)."""
    import jax.numpy as jnp
    import numpy as np

    if not jnp.issubdtype(expected.dtype, jnp.inexact):
        return bool(np.array_equal(expected, got))
    eps = float(jnp.finfo(expected.dtype).eps)
    a, b = expected.astype(np.float64), got.astype(np.float64)
    scale = float(np.max(np.abs(a))) if a.size else 0.0
    rtol = max(1e-4, 16 * eps)
    return bool(np.allclose(a, b, rtol=rtol, atol=max(1e-5, 16 * eps * scale)))


def plan_inputs(blocks: list[ParallelBlock], strategies, mesh_axes, stream=None) -> tuple[str, ...]:
    """Mesh axes the batch is sharded over: the axes most blocks put on their batch dimension
    M (the residual stream keeps the input's layout through every layer, so the common layout
    is the one that costs least to keep; the first block's on a tie), major axis first
    (:func:`~paraplan.sharding.layouts.batch_major`)."""
    from collections import Counter

    from paraplan.sharding.layouts import batch_major

    layouts = [tuple(a for (a, _), c in zip(mesh_axes, s, strict=True) if c == "M") for s in strategies]
    counts = Counter(layouts)
    best = max(layouts, key=lambda lay: (counts[lay], -layouts.index(lay)))
    if stream is not None:  # the residual stream's layout the search costed
        best = tuple(a for (a, _), c in zip(mesh_axes, stream, strict=True) if c == "M")
    major = batch_major(strategies, tuple(a for a, _ in mesh_axes))
    return tuple(sorted(best, key=major.index))
