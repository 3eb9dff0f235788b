"""Profiled block costs (issue 5, part 3): every (block, strategy) compiled on its own with
``NamedSharding``s -- the entry contraction's forward and backward (y, dx and dW) -- and what
XLA says about it: the bytes of its collectives, its FLOPs (``cost_analysis``) and its memory
(``memory_analysis``), per device. On GPUs the compiled block is also timed, and those times
replace the analytic node costs of the search; on CPUs nothing is timed (plans are never
ranked by CPU wall time) and the profile is a per-block check of the analytic model.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from paraplan.sharding.graph import ParallelBlock
from paraplan.sharding.layouts import operand_spec, output_spec
from paraplan.sharding.verify import collective_bytes


@dataclass(frozen=True)
class BlockProfile:
    xla_comm_bytes: dict[str, float]
    xla_flops: float | None  # per device, forward and backward
    xla_memory_bytes: float | None  # arguments + outputs + temporaries
    measured_s: float | None  # on GPUs: median time of the compiled block


def _compiled_block(block: ParallelBlock, strategy, mesh):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    eqn = block.entry
    names = tuple(mesh.axis_names)
    spec = [NamedSharding(mesh, P(*operand_spec(block, strategy, names, o))) for o in (0, 1)]
    out = NamedSharding(mesh, P(*output_spec(block, strategy, names)))
    dims = eqn.params["dimension_numbers"]
    dtypes = eqn.in_dtypes or ("float32", "float32")

    def step(a, b, dy):
        y, pull = jax.vjp(lambda a, b: jax.lax.dot_general(a, b, dims), a, b)
        da, db = pull(dy)
        return y, da, db

    args = [jax.ShapeDtypeStruct(eqn.in_shapes[o], jnp.dtype(dtypes[o])) for o in (0, 1)]
    args.append(jax.ShapeDtypeStruct(eqn.shapes[0], jnp.dtype(dtypes[0])))
    jitted = jax.jit(step, in_shardings=(spec[0], spec[1], out), out_shardings=(out, spec[0], spec[1]))
    return jitted.lower(*args).compile(), args, (spec[0], spec[1], out)


def _time(compiled, args, shardings, repeats: int = 10) -> float:
    import jax
    import jax.numpy as jnp

    values = [jax.device_put(jnp.zeros(a.shape, a.dtype), s) for a, s in zip(args, shardings, strict=True)]
    for _ in range(3):
        jax.block_until_ready(compiled(*values))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*values))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def profile_block(block: ParallelBlock, strategy, mesh, timed: bool) -> BlockProfile:
    compiled, args, shardings = _compiled_block(block, strategy, mesh)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    memory = compiled.memory_analysis()
    used = None if memory is None else float(memory.argument_size_in_bytes + memory.output_size_in_bytes
                                              + memory.temp_size_in_bytes - memory.alias_size_in_bytes)
    return BlockProfile(collective_bytes(compiled.as_text()),
                        float(cost["flops"]) if cost and "flops" in cost else None, used,
                        _time(compiled, args, shardings) if timed else None)


def on_accelerators(mesh) -> bool:
    """True when the mesh's devices are GPUs (or TPUs): only then are blocks timed."""
    return np.asarray(mesh.devices).flat[0].platform != "cpu"


def profile_blocks(blocks: list[ParallelBlock], options: dict[int, list], mesh,
                   progress: Callable[[int, int], None] | None = None) -> dict[int, list[BlockProfile]]:
    """Per unique block id, the profile of each of its strategies (in ``options`` order)."""
    timed = on_accelerators(mesh)
    total = sum(len(options[b.index]) for b in blocks)
    done, out = 0, {}
    for b in blocks:
        out[b.index] = []
        for s in options[b.index]:
            out[b.index].append(profile_block(b, s, mesh, timed))
            done += 1
            if progress is not None:
                progress(done, total)
    return out
