"""Predict a job on a heterogeneous cluster: every stage costed on the GPUs it runs on.

Each node group is costed on its *view* of the cluster (``HeteroClusterSpec.view``: its GPU,
its intra-node link, its own NIC for traffic that stays inside the group, the slower of its NIC
and the network between groups for traffic that crosses), with the same inventory, cost model
and stage timing as a homogeneous job. A stage whose ranks span two groups (its data-parallel
replicas sit on different GPUs) runs at the pace of the slower one: it takes the whole timing
of the group with the longest busy time per micro-batch (the replicas meet at each gradient
reduction, so the slow one sets the pace), its collectives cross groups, and its memory must fit
the smallest GPU. A pipeline send crosses groups when the two stages are not on the same single
group; the schedule uses the slowest send.
"""

from __future__ import annotations

import dataclasses
import functools
import operator

from paraplan.costmodel import AnalyticalCostModel
from paraplan.inventory import count_job
from paraplan.prediction.facade import assemble_prediction
from paraplan.prediction.plan_notes import plan_notes
from paraplan.prediction.result import Placement, Prediction
from paraplan.prediction.stages import CommCosts, explain_layer, layer_costs, stage_timing
from paraplan.specs import HeteroJob


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


def _explain(inv, costs, slowest_group, st):
    return explain_layer(inv, st, **costs[slowest_group[st.index]])


def predict_hetero(job: HeteroJob, *, keep_timeline: bool = False) -> Prediction:
    """Predict one iteration of ``job`` with the analytical backend (see the module docstring)."""
    stage_groups = job.stage_groups()
    pp = len(stage_groups)
    inv = count_job(job.view_job(stage_groups[0][0]))  # the inventory does not depend on the GPU
    costs = {}

    def cost(g: int, crossing: bool) -> dict:
        key = (g, crossing)
        if key not in costs:
            cm = AnalyticalCostModel.of_plan(job.cluster.view(g, crossing), job.precision, job.parallel)
            comm = CommCosts(inv, cm)
            costs[key] = {"cm": cm, "comm": comm, "layers": layer_costs(inv, cm, comm)}
        return costs[key]

    crosses = [len(gs) > 1 or (s + 1 < pp and stage_groups[s + 1] != gs) for s, gs in enumerate(stage_groups)]
    p2p = mask = 0.0
    if inv.p2p is not None:
        for s, gs in enumerate(stage_groups[:-1]):
            for g in set(gs) | set(stage_groups[s + 1]):
                comm = cost(g, crosses[s])["comm"]
                p2p = max(p2p, comm.seconds(inv.p2p))
                if inv.p2p_mask is not None:
                    mask = max(mask, comm.seconds(inv.p2p_mask))
    timings, slowest_group = [], []
    for st, groups in zip(inv.stages, stage_groups, strict=True):
        mixed = len(groups) > 1
        options = [stage_timing(inv, st, **cost(g, mixed)) for g in groups]
        i = max(range(len(groups)), key=lambda i: options[i].busy_mb_s)
        slowest_group.append((groups[i], mixed))
        timings.append(dataclasses.replace(options[i], p2p_s=p2p if pp > 1 else 0.0, p2p_mask_s=mask))
    peak = sum(g.gpu.flops_for(job.precision) * g.num_gpus for g in job.cluster.node_groups)
    # the same notes as a homogeneous job's, said for every group's view the stages are costed on
    notes = functools.reduce(operator.add, (
        plan_notes(job.view_job(g).model_copy(update={"cluster": cost["cm"].cluster}), cost["comm"], inv)
        for (g, _), cost in costs.items()
    ))
    return assemble_prediction(
        job.view_job(stage_groups[0][0]), inv, tuple(timings), "analytical", peak,
        functools.partial(_explain, inv, costs, slowest_group),
        keep_timeline=keep_timeline,
        placement=placement_of(job) if len(job.cluster.node_groups) > 1 else None,
        uncalibrated=notes.uncalibrated,
        ignored_settings=notes.ignored,
        placement_notes=notes.placement,
    )
