"""``paraplan.sharding.search(fn, example_args, mesh)``: trace, block, cost, search -- a plan
whose ``PartitionSpec``s apply to the user's arrays."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paraplan.sharding.chain import chain_costs, expand, pairs_of
from paraplan.sharding.chain import search as search_chain
from paraplan.sharding.graph import Graph, ParallelBlock, find_segments, parallel_blocks, trace
from paraplan.sharding.strategies import Mesh, Strategy
from paraplan.sharding.verify import Verification, plan_inputs, verify, weight_specs


@dataclass
class ShardingPlan:
    """The chosen strategy of every block, as PartitionSpec entries for the parameters."""

    mesh_axes: tuple[tuple[str, int], ...]
    strategies: list[Strategy]  # per block, in program order
    param_specs: Any  # a pytree like the parameters: per leaf a tuple of PartitionSpec entries
    batch_axes: tuple[str, ...]
    time_s: float  # analytic, per step on the mesh's cluster
    memory_bytes: float  # analytic, per device
    fits: bool
    blocks: list[ParallelBlock]
    graph: Graph

    def partition_specs(self):
        """The parameters' ``jax.sharding.PartitionSpec`` pytree."""
        import jax
        from jax.sharding import PartitionSpec as P

        return jax.tree_util.tree_map(lambda spec: P(*spec), self.param_specs, is_leaf=lambda v: isinstance(v, tuple))

    def verify(self, fn, example_args) -> Verification:
        """Compile ``fn`` with this plan on the first devices and compare with the unsharded run."""
        specs = weight_specs(self.graph, self.blocks, self.strategies, tuple(a for a, _ in self.mesh_axes))
        return verify(fn, tuple(example_args), self.mesh_axes, specs, self.batch_axes, self.graph)


def search(fn, example_args, mesh: dict[str, int] | tuple, *, cluster: str = "dgx-h100", precision: str = "fp32",
           memory_budget: float | None = None) -> ShardingPlan:
    """The fastest per-block sharding of ``fn(params, batch, ...)`` on ``mesh`` (axis name ->
    size, outermost first) of the catalog ``cluster``, within ``memory_budget`` bytes per device."""
    import jax

    from paraplan.catalog import load_cluster
    from paraplan.specs import Precision

    axes = tuple(mesh.items()) if isinstance(mesh, dict) else tuple(mesh)
    graph = trace(fn, *example_args)
    blocks = parallel_blocks(graph)
    seg = find_segments(blocks)
    order = expand(seg)
    c = load_cluster(cluster)
    m = Mesh(axes, c)
    costs = chain_costs([blocks[i] for i in seg.unique_blocks], m, c.gpu.flops_for(Precision(precision)), pairs_of(order))
    best = search_chain(order, costs, memory_budget)
    names = tuple(a for a, _ in axes)
    specs = weight_specs(graph, blocks, best.strategies, names)
    leaves, tree = jax.tree_util.tree_flatten(example_args[0])
    ids = sorted(graph.param_vars)[: len(leaves)]
    per_leaf = [specs.get(i, (None,) * len(getattr(leaf, "shape", ()))) for i, leaf in zip(ids, leaves, strict=True)]
    return ShardingPlan(axes, best.strategies, jax.tree_util.tree_unflatten(tree, per_leaf),
                        plan_inputs(blocks, best.strategies, axes), best.time_s, best.memory_bytes, best.fits,
                        blocks, graph)
