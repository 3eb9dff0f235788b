"""Heterogeneous clusters (node groups of different GPUs on one network) and jobs on them.

A pipeline stage runs on the nodes its ranks land on. Ranks follow Megatron-LM's order
(tp fastest, then cp, dp, pp), so stage ``s`` holds ranks ``s*tp*cp*dp ..`` and the
``node_order`` -- which group each node of the job comes from, in rank order -- decides which
GPUs every stage gets (FASOP's "node placement").
"""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, ConfigDict, Field, model_validator

from paraplan.specs._types import Count, Headroom, Int
from paraplan.specs.enums import Precision
from paraplan.specs.errors import short_repr
from paraplan.specs.hardware import ClusterSpec, LinkSpec
from paraplan.specs.job import DEFAULT_MEMORY_HEADROOM, Job
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.preset import PresetUse

_FROZEN = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


def _slower(a: LinkSpec | None, b: LinkSpec | None) -> LinkSpec | None:
    if a is None or b is None:
        return a or b
    return a if a.bus_bytes_per_s <= b.bus_bytes_per_s else b


class HeteroClusterSpec(BaseModel):
    """Node groups, each a homogeneous cluster (its GPU, node size, NVLink/PCIe, NICs, price).

    ``inter_node`` is the network between groups; left out, it is the slowest group NIC.
    Every group needs the same number of GPUs per node (ranks are laid out node by node).
    """

    model_config = _FROZEN
    name: str = "hetero"
    aliases: tuple[str, ...] = ()
    node_groups: tuple[ClusterSpec, ...] = Field(min_length=1)
    inter_node: LinkSpec | None = None
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> HeteroClusterSpec:
        sizes = sorted({g.gpus_per_node for g in self.node_groups})
        if len(sizes) > 1:
            raise ValueError(
                f"node_groups: every group needs the same gpus_per_node (got {', '.join(map(str, sizes))}); "
                "describe bigger nodes as several nodes"
            )
        if self.num_nodes > 1 and self.fabric is None:
            raise ValueError(
                f"inter_node: cluster {short_repr(self.name)} has {self.num_nodes} nodes but neither it nor a "
                "node group names an inter-node link"
            )
        return self

    @property
    def fabric(self) -> LinkSpec | None:
        """The link between nodes of different groups."""
        if self.inter_node is not None:
            return self.inter_node
        slowest = None
        for g in self.node_groups:
            slowest = _slower(slowest, g.inter_node)
        return slowest

    @property
    def gpus_per_node(self) -> int:
        return self.node_groups[0].gpus_per_node

    @property
    def num_nodes(self) -> int:
        return sum(g.num_nodes for g in self.node_groups)

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def price_per_hour_usd(self) -> float | None:
        """The whole cluster's price per hour; ``None`` when a group has no price."""
        if any(g.price_per_gpu_hour is None for g in self.node_groups):
            return None
        return sum(g.price_per_gpu_hour * g.num_gpus for g in self.node_groups)

    def declared_order(self) -> tuple[int, ...]:
        """The group index of every node, groups in the order they are declared."""
        return tuple(i for i, g in enumerate(self.node_groups) for _ in range(g.num_nodes))

    def view(self, group: int, crossing: bool = False) -> ClusterSpec:
        """The whole cluster as if every node were of ``group``: its GPU and intra-node link,
        and its own NIC -- or, for traffic ``crossing`` into another group, the slower of its
        NIC and the network between groups. A stage's collectives are costed on the view of
        each GPU type the stage holds."""
        g = self.node_groups[group]
        inter = _slower(g.inter_node, self.fabric) if crossing else (g.inter_node or self.fabric)
        return g.model_copy(update={
            "name": g.name if len(self.node_groups) == 1 else f"{self.name}[{g.name}]",
            "num_nodes": self.num_nodes,
            "inter_node": inter if self.num_nodes > 1 else g.inter_node,
        })


class HeteroJob(BaseModel):
    """A job on a heterogeneous cluster: the same degrees on every stage (Megatron-LM's
    rule), the layers each stage holds, and the order of the nodes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "job"
    model: ModelSpec
    cluster: HeteroClusterSpec
    parallel: ParallelPlan = ParallelPlan()
    precision: Precision = Precision.BF16
    train_tokens: Count | None = None
    node_order: tuple[Int, ...] | None = None
    memory_headroom: Headroom = DEFAULT_MEMORY_HEADROOM  # share of each GPU's memory left free
    preset: PresetUse | None = None  # the framework preset (Job.preset)

    @model_validator(mode="after")
    def _consistent(self) -> HeteroJob:
        c = self.cluster
        for g in c.node_groups:
            if self.precision not in g.gpu.peak_flops:
                raise ValueError(f"precision: GPU {g.gpu.name} has no {self.precision.value} peak")
        view = self.view_job(0)  # Megatron-LM's divisibility rules, resolved dp
        object.__setattr__(self, "parallel", view.parallel)
        if c.gpus_per_node % view.parallel.tp:
            raise ValueError(
                f"parallel.tp: {view.parallel.tp} does not divide the {c.gpus_per_node} GPUs of a node "
                "(a tensor-parallel group must not span two nodes, which may hold different GPUs)"
            )
        order = self.node_order if self.node_order is not None else c.declared_order()
        if Counter(order) != Counter(c.declared_order()):
            have = ", ".join(f"{g.num_nodes} x {g.name}" for g in c.node_groups)
            raise ValueError(f"node_order: must list every node once by its group index ({have})")
        object.__setattr__(self, "node_order", tuple(order))
        return self

    def view_job(self, group: int) -> Job:
        """The job on the cluster's view of one group (see ``HeteroClusterSpec.view``)."""
        return Job(
            name=self.name,
            model=self.model,
            cluster=self.cluster.view(group),
            parallel=self.parallel,
            precision=self.precision,
            train_tokens=self.train_tokens,
            memory_headroom=self.memory_headroom,
            preset=self.preset,
        )

    def stage_groups(self) -> tuple[tuple[int, ...], ...]:
        """The node groups (sorted indices) each pipeline stage's ranks land on."""
        plan = self.parallel
        return stage_groups(self.node_order, plan.tp * plan.cp * plan.dp, self.cluster.gpus_per_node, plan.pp)


def stage_groups(
    node_order: tuple[int, ...], gpus_per_stage: int, gpus_per_node: int, pp: int
) -> tuple[tuple[int, ...], ...]:
    """The node groups (sorted indices) each of ``pp`` stages of ``gpus_per_stage``
    consecutive ranks lands on, nodes taken in ``node_order``."""
    out = []
    for s in range(pp):
        first, last = s * gpus_per_stage // gpus_per_node, ((s + 1) * gpus_per_stage - 1) // gpus_per_node
        out.append(tuple(sorted({node_order[n] for n in range(first, last + 1)})))
    return tuple(out)
