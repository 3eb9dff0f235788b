"""Predict a job on a heterogeneous cluster: every stage costed on the GPUs it runs on.

Each node group is costed on its *view* of the cluster (``HeteroClusterSpec.view``: its GPU,
its intra-node link, the slower of its NIC and the network between groups), with the same
inventory, cost model and stage timing as a homogeneous job. A stage whose ranks span two
groups (its data-parallel replicas sit on different GPUs) runs at the pace of the slower one:
every part of its timing is the larger of the groups' (the replicas meet at each gradient
reduction, so the slow one sets the pace). Its memory must fit the smallest GPU.
"""

from __future__ import annotations

import dataclasses

from paraplan.costmodel import AnalyticalCostModel
from paraplan.inventory import count_job
from paraplan.prediction import (
    CommCosts,
    LayerCost,
    Placement,
    Prediction,
    StageTiming,
    assemble_prediction,
    explain_layer,
    stage_timing,
)
from paraplan.specs import HeteroJob


def _slowest(options: list[StageTiming]) -> StageTiming:
    first = options[0]
    if len(options) == 1:
        return first
    fields = {f.name: max(getattr(o, f.name) for o in options) for f in dataclasses.fields(first)}
    return StageTiming(**fields)


def _busy(t: StageTiming) -> float:
    return t.forward_mb_s + t.backward_mb_s + t.recompute_mb_s + t.tp_fwd_mb_s + t.tp_bwd_mb_s


def placement_of(job: HeteroJob) -> Placement:
    """Which GPUs every stage of ``job`` runs on, its memory limit and the cluster's price."""
    c = job.cluster
    stage_groups = job.stage_groups()
    return Placement(
        cluster=c.name,
        node_order=tuple(c.node_groups[g].gpu.name for g in job.node_order),
        stage_gpus=tuple("+".join(c.node_groups[g].gpu.name for g in gs) for gs in stage_groups),
        stage_hbm_bytes=tuple(min(c.node_groups[g].gpu.hbm_bytes for g in gs) for gs in stage_groups),
        gpus=tuple((g.gpu.name, g.num_gpus) for g in c.node_groups),
        price_per_hour_usd=c.price_per_hour_usd,
        job=job,
    )


def predict_hetero(job: HeteroJob, *, keep_timeline: bool = False) -> Prediction:
    """Predict one iteration of ``job`` with the analytical backend (see the module docstring)."""
    stage_groups = job.stage_groups()
    used = sorted({g for gs in stage_groups for g in gs})
    views = {g: job.view_job(g) for g in used}
    inv = count_job(views[used[0]])  # the inventory does not depend on the GPU
    costs = {}
    for g in used:
        cm = AnalyticalCostModel(views[g].cluster, job.precision)
        comm = CommCosts(inv, cm)
        costs[g] = {"cm": cm, "comm": comm, "layer": LayerCost.of(inv.stages[0], cm, comm)}
    timings, slowest_group = [], []
    for st, groups in zip(inv.stages, stage_groups, strict=True):
        options = [stage_timing(inv, st, **costs[g]) for g in groups]
        slowest_group.append(groups[max(range(len(groups)), key=lambda i: _busy(options[i]))])
        timings.append(_slowest(options))
    peak = sum(g.gpu.flops_for(job.precision) * g.num_gpus for g in job.cluster.node_groups)

    def explain(st):
        return explain_layer(inv, st, **costs[slowest_group[st.index]])

    return assemble_prediction(
        views[stage_groups[0][0]], inv, tuple(timings), "analytical", peak, explain,
        keep_timeline=keep_timeline,
        placement=placement_of(job) if len(job.cluster.node_groups) > 1 else None,
    )
