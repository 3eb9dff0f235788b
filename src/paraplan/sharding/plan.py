"""``paraplan.sharding.search(fn, example_args, mesh)``: trace, block, cost, search -- a plan
whose ``PartitionSpec``s apply to the user's arrays, with its per-block report and a
``verify`` that compiles it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paraplan.sharding.chain import ChainCosts, chain_costs, expand, relations, set_stream
from paraplan.sharding.chain import search as search_chain
from paraplan.sharding.graph import Graph, ParallelBlock, dataflow, find_segments, parallel_blocks, trace
from paraplan.sharding.profile import BlockProfile, on_accelerators, profile_blocks
from paraplan.sharding.strategies import Mesh, Strategy, add_volume, enter, reshard
from paraplan.sharding.verify import Verification, device_mesh, plan_inputs, verify, weight_specs

#: How each placement of a mesh axis reads in the report.
ROLE = {"B": "expert", "M": "batch", "K": "row", "N": "column", None: "replicated"}


def describe(strategy: Strategy, axis_names: tuple[str, ...]) -> str:
    """``data=batch model=column``: the role of every mesh axis for one block."""
    return " ".join(f"{a}={ROLE[c]}" for a, c in zip(axis_names, strategy, strict=True))


@dataclass
class BlockReport:
    """One block of the chosen plan: its weight, strategy and analytic costs per device."""

    weight: str  # the parameter's path in the pytree, e.g. layers.0.qkv
    shape: tuple[int, ...]
    strategy: str
    time_s: float  # compute + its collectives + the resharding into it
    comm_bytes: dict[str, float]
    memory_bytes: float
    flops: float
    profile: BlockProfile | None = None  # XLA's view of the block compiled alone (search(profile=True))


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
    reports: list[BlockReport] = field(default_factory=list)
    cluster: str = ""
    memory_budget: float | None = None
    analysis_s: float = 0.0  # tracing, costing and search
    repeats: int = 0  # how many times the repeated segment (the layers) occurs
    unique_blocks: int = 0  # blocks costed (the segment once)
    costs: str = "analytic"  # or "measured on <platform>" when profiled blocks were timed

    @property
    def comm_bytes(self) -> dict[str, float]:
        """Analytic bytes of collective results per device per step, by XLA's collective name."""
        out: dict[str, float] = {}
        for r in self.reports:
            add_volume(out, r.comm_bytes)
        return out

    @property
    def flops(self) -> float:
        return sum(r.flops for r in self.reports)

    @property
    def tflops(self) -> float:
        """Achieved TFLOP/s per device: the blocks' contraction FLOPs over the estimated time."""
        return self.flops / self.time_s / 1e12 if self.time_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain data (the ``--format json`` output)."""
        return {
            "mesh": dict(self.mesh_axes),
            "cluster": self.cluster,
            "time_s": self.time_s,
            "memory_bytes": self.memory_bytes,
            "memory_budget_bytes": self.memory_budget,
            "fits": self.fits,
            "tflops_per_device": self.tflops,
            "comm_bytes": self.comm_bytes,
            "batch_axes": list(self.batch_axes),
            "blocks_costed": self.unique_blocks,
            "layers_found": self.repeats,
            "analysis_s": self.analysis_s,
            "costs": self.costs,
            "blocks": [{
                "weight": r.weight, "shape": list(r.shape), "strategy": r.strategy,
                "partition_spec": [list(d) if isinstance(d, tuple) else d for d in spec],
                "time_s": r.time_s, "comm_bytes": r.comm_bytes, "memory_bytes": r.memory_bytes, "flops": r.flops,
                "profile": None if r.profile is None else {
                    "xla_comm_bytes": r.profile.xla_comm_bytes, "xla_flops": r.profile.xla_flops,
                    "xla_memory_bytes": r.profile.xla_memory_bytes, "measured_s": r.profile.measured_s},
            } for r, spec in zip(self.reports, self._block_specs(), strict=True)],
        }

    def _block_specs(self) -> list[tuple]:
        specs = weight_specs(self.graph, self.blocks, self.strategies, tuple(a for a, _ in self.mesh_axes))
        return [specs.get(b.weight, ()) for b in self.blocks]

    def partition_specs(self):
        """The parameters' ``jax.sharding.PartitionSpec`` pytree."""
        import jax
        from jax.sharding import PartitionSpec as P

        return jax.tree_util.tree_map(lambda spec: P(*spec), self.param_specs, is_leaf=lambda v: isinstance(v, tuple))

    def batch_spec(self):
        """The ``PartitionSpec`` of the batch (the step's second argument)."""
        from jax.sharding import PartitionSpec as P

        axes = self.batch_axes
        return P(axes if len(axes) > 1 else (axes[0] if axes else None))

    def verify(self, fn, example_args, pin_activations: bool = True) -> Verification:
        """Compile ``fn`` with this plan on the first devices (every block's input pinned to the
        plan's layout unless ``pin_activations`` is False), compare it with the unsharded run
        (concrete arguments) and diff XLA's collective bytes against the analytic ones."""
        specs = weight_specs(self.graph, self.blocks, self.strategies, tuple(a for a, _ in self.mesh_axes))
        pins = (self.blocks, self.strategies) if pin_activations else None
        return verify(fn, tuple(example_args), self.mesh_axes, specs, self.batch_axes, self.graph, self.comm_bytes,
                      pins)

    def apply(self, mesh):
        """The step as a function of the same arguments with every block's input pinned to this
        plan's layout on ``mesh`` (a ``jax.sharding.Mesh`` with this plan's axis names): jit it
        with ``in_shardings`` from :meth:`partition_specs` and :meth:`batch_spec`."""
        from paraplan.sharding.apply import constrained

        return constrained(self.graph, self.blocks, self.strategies, mesh)


@dataclass
class Analysis:
    """A traced step with its blocks, segments and every strategy's cost on a mesh."""

    graph: Graph
    blocks: list[ParallelBlock]
    order: list[int]  # unique block id per position of the chain
    costs: ChainCosts
    mesh: Mesh
    repeats: int
    cluster: str
    params: Any  # the example parameters (a pytree of arrays or shapes)
    profiles: dict[int, list[BlockProfile]] | None = None
    costs_kind: str = "analytic"
    readers: set[int] = field(default_factory=set)  # unique block ids that read the residual stream


def analyse(fn, example_args, mesh: dict[str, int] | tuple, *, cluster: str = "dgx-h100",
            precision: str = "fp32") -> Analysis:
    """Trace ``fn(params, batch, ...)``, find its blocks and cost every strategy of each unique
    block on ``mesh`` (axis name -> size, outermost first) of the catalog ``cluster``."""
    from paraplan.catalog import load_cluster
    from paraplan.specs import ConfigError, Precision

    axes = tuple(mesh.items()) if isinstance(mesh, dict) else tuple(mesh)
    if not axes or any(not isinstance(n, int) or n < 1 for _, n in axes):
        raise ConfigError(f"mesh: {axes!r} needs at least one axis, each of size >= 1")
    try:
        peak_precision = Precision(precision)
    except ValueError:
        raise ConfigError(f"precision: {precision!r} is not one of {', '.join(p.value for p in Precision)}") from None
    gpn = load_cluster(cluster).gpus_per_node
    c = load_cluster(cluster, num_nodes=max(1, -(-math.prod(n for _, n in axes) // gpn)))
    try:
        graph = trace(fn, *example_args)
    except Exception as exc:  # the user's function failed on the example arguments
        text = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"fn: tracing it on the example arguments raised {type(exc).__name__}: {text}") from None
    blocks = parallel_blocks(graph)
    if not blocks:
        raise ConfigError("fn: no contraction with a parameter (a leaf of the first argument) to shard")
    seg = find_segments(blocks)
    order = expand(seg)
    m = Mesh(axes, c)
    flow = dataflow(graph, blocks)
    costs = chain_costs([blocks[i] for i in seg.unique_blocks], m, c.gpu.flops_for(peak_precision),
                        relations(flow, blocks, order))
    readers = {order[i] for i, b in enumerate(blocks) if b.index in flow.readers}
    return Analysis(graph, blocks, order, costs, m, seg.repeats, cluster, example_args[0], readers=readers)


def profile(a: Analysis, progress=None) -> Analysis:
    """Compile every (unique block, strategy) alone on the first devices and record XLA's view
    (:mod:`paraplan.sharding.profile`); on GPUs their measured times replace the analytic node
    times (the resharding edges stay analytic)."""
    jmesh = device_mesh(a.mesh.axes)
    unique = [a.blocks[i] for i in sorted(a.costs.options)]
    a.profiles = profile_blocks(unique, a.costs.options, jmesh, progress)
    if on_accelerators(jmesh):
        for b, rows in a.profiles.items():
            a.costs.time[b] = np.array([p.measured_s for p in rows])
        a.costs_kind = f"measured on {np.asarray(jmesh.devices).flat[0].platform}"
    return a


def search(fn, example_args, mesh: dict[str, int] | tuple, *, cluster: str = "dgx-h100", precision: str = "fp32",
           memory_budget: float | None = None, profiled: bool = False, progress=None) -> ShardingPlan:
    """The fastest per-block sharding of ``fn(params, batch, ...)`` on ``mesh`` (axis name ->
    size, outermost first) of the catalog ``cluster``, within ``memory_budget`` bytes per device.
    The arguments may be arrays or ``jax.ShapeDtypeStruct``s (tracing needs only shapes). With
    ``profiled`` every block's strategies are also compiled (and timed on GPUs: :func:`profile`);
    ``progress(done, total)`` is called as they are."""
    start = time.perf_counter()
    a = analyse(fn, example_args, mesh, cluster=cluster, precision=precision)
    if profiled:
        profile(a, progress)
    best = search_chain(a.order, a.costs, memory_budget)
    stream = stream_layout(a, best.choice)
    if stream is not None:  # search again with the residual stream in the layout its readers chose
        set_stream(a.costs, a.mesh, stream, a.order, a.readers)
        best = search_chain(a.order, a.costs, memory_budget)
    plan = assemble(a, best.choice, memory_budget)
    plan.analysis_s = time.perf_counter() - start
    return plan


def stream_layout(a: Analysis, choice: list[int]) -> tuple[str | None, ...] | None:
    """The batch layout (per mesh axis "M" or None) most blocks reading the residual stream
    chose in ``choice``; None when no block reads it."""
    from collections import Counter

    readers = a.readers
    layouts = Counter(tuple("M" if c == "M" else None for c in a.costs.options[b][c_])
                      for b, c_ in zip(a.order, choice, strict=True) if b in readers)
    return layouts.most_common(1)[0][0] if layouts else None


def assemble(a: Analysis, choice: list[int], memory_budget: float | None = None) -> ShardingPlan:
    """The plan that takes strategy ``choice[i]`` (an index into ``a.costs.options``) at each
    position of the chain: its specs, per-block report and totals."""
    import jax

    strategies = [a.costs.options[b][c] for b, c in zip(a.order, choice, strict=True)]
    names = a.mesh.names
    specs = weight_specs(a.graph, a.blocks, strategies, names)
    paths, tree = jax.tree_util.tree_flatten_with_path(a.params)
    ids = sorted(a.graph.param_vars)[: len(paths)]
    per_leaf = [specs.get(i, (None,) * len(getattr(leaf, "shape", ()))) for i, (_, leaf) in zip(ids, paths, strict=True)]
    names_of = {i: jax.tree_util.keystr(p, simple=True, separator=".") for i, (p, _) in zip(ids, paths, strict=True)}
    reports = _reports(a.order, choice, a.costs, a.mesh, a.blocks, a.graph, names_of)
    if a.profiles is not None:
        for r, b, c in zip(reports, a.order, choice, strict=True):
            r.profile = a.profiles[b][c]
    memory = sum(r.memory_bytes for r in reports)
    return ShardingPlan(a.mesh.axes, strategies, jax.tree_util.tree_unflatten(tree, per_leaf),
                        plan_inputs(a.blocks, strategies, a.mesh.axes, a.costs.stream), sum(r.time_s for r in reports),
                        memory,
                        memory_budget is None or memory <= memory_budget, a.blocks, a.graph, reports, a.cluster,
                        memory_budget, 0.0, a.repeats, len(a.costs.options), a.costs_kind)


def plan_of(a: Analysis, strategies: list[Strategy], memory_budget: float | None = None) -> ShardingPlan:
    """A hand-written plan (one strategy per block, e.g. Megatron's column/row pattern) costed
    like a searched one, to compare with it or to verify it."""
    from paraplan.specs import ConfigError

    if len(strategies) != len(a.order):
        raise ConfigError(f"strategies: {len(strategies)} given for {len(a.order)} blocks")
    choice = []
    for pos, (b, s) in enumerate(zip(a.order, strategies, strict=True)):
        if tuple(s) not in a.costs.options[b]:
            raise ConfigError(f"strategies[{pos}]: {s!r} is not a valid strategy of this block on the mesh")
        choice.append(a.costs.options[b].index(tuple(s)))
    return assemble(a, choice, memory_budget)


def _reports(order: list[int], choice: list[int], costs: ChainCosts, mesh: Mesh, blocks: list[ParallelBlock],
             graph: Graph, names_of: dict[int, str]) -> list[BlockReport]:
    """Per position of the chain: the block's own cost plus the resharding into it."""
    reports = []
    previous, prev_id = None, None
    for pos, (b, c) in enumerate(zip(order, choice, strict=True)):
        cost = costs.details[b][c]
        strategy = costs.options[b][c]
        volume = dict(cost.comm_bytes)
        seconds = float(costs.time[b][c])  # analytic, or measured when profiled on GPUs
        if previous is not None:
            extra_s, extra = reshard(previous, strategy, costs.shapes[b], mesh, costs.relations[prev_id, b],
                                     costs.stream, costs.shapes[prev_id])
            seconds += extra_s
            add_volume(volume, extra)
        elif costs.entry is not None and costs.stream is not None:  # the first block reads the step's input
            extra_s, extra = enter(costs.stream, strategy, costs.shapes[b], mesh)
            seconds += extra_s
            add_volume(volume, extra)
        block = blocks[pos]
        reports.append(BlockReport(names_of.get(block.weight, f"block {pos}"), graph.param_shapes.get(block.weight, ()),
                                   describe(strategy, mesh.names), seconds, volume, cost.memory_bytes, cost.flops))
        previous, prev_id = strategy, b
    return reports

