"""Search plans whose stages hold unequal layer counts, on heterogeneous or homogeneous clusters.

For every point of the space (tp, pp, cp, micro-batch, ZeRO 0/1, recompute, global batch) and
every distinct placement of the stages on the node groups (node orders, FASOP's device
placement; permutations of the node multiset, or of whole groups when those are too many),
the layers are split across the stages by the exact method of
:mod:`paraplan.search.partition`, fed with each stage's time per micro-batch as a function of
its layer count on its GPUs and its memory limit. Both are exact straight lines in the layer
count (a stage's busy time and memory grow by the same amount per layer; ZeRO 0 and 1 keep it
so), costed with the prediction's own ``stage_timing`` and ``estimate_stage_memory`` at one and
two layers. The best plans by that estimate are then predicted in full (``predict_hetero``:
the event simulation of the pipeline with data-parallel communication and the optimizer step)
and ranked by the exact numbers.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from pydantic import ValidationError

from paraplan.costmodel import AnalyticalCostModel
from paraplan.inventory import count_job
from paraplan.inventory.partition import count_layers_per_stage, split_layers
from paraplan.prediction import Prediction
from paraplan.prediction.entry import predict_any
from paraplan.prediction.memory import estimate_stage_memory, usable_hbm_bytes
from paraplan.prediction.stages import CommCosts, stage_timing
from paraplan.prediction.stages import layer_costs as cost_layers
from paraplan.search.partition import closed_form_s, partition_layers
from paraplan.search.space import SearchSpace, rejection_reason, runs_as_zero, sp_axis, with_preset
from paraplan.specs import (
    DEFAULT_MEMORY_HEADROOM,
    ConfigError,
    HeteroClusterSpec,
    HeteroJob,
    ModelSpec,
    Precision,
    Recompute,
    Schedule,
)
from paraplan.specs.frameworks import framework_refusal
from paraplan.specs.hetero import stage_groups
from paraplan.specs.preset import PresetUse
from paraplan.units import format_bytes

MAX_NODE_ORDERS = 512  # beyond this many node orders, only orders that keep each group together


def node_orders(cluster: HeteroClusterSpec) -> list[tuple[int, ...]]:
    """Distinct orders of the cluster's nodes (group index per node), declared order first."""
    counts = [g.num_nodes for g in cluster.node_groups]
    total = math.factorial(sum(counts)) // math.prod(math.factorial(c) for c in counts)
    if total > MAX_NODE_ORDERS:
        return [tuple(g for g in perm for _ in range(counts[g])) for perm in itertools.permutations(range(len(counts)))]
    return list(_multiset_orders(counts))


def _multiset_orders(counts: list[int]) -> Iterator[tuple[int, ...]]:
    if sum(counts) == 0:
        yield ()
        return
    for g, c in enumerate(counts):
        if c:
            counts[g] -= 1
            for rest in _multiset_orders(counts):
                yield (g, *rest)
            counts[g] += 1


@dataclass(frozen=True)
class Candidate:
    plan: dict
    node_order: tuple[int, ...]
    layers: tuple[int, ...]
    estimate_s: float  # iteration seconds by the closed form plus the once-per-iteration parts
    memory_bytes: float = 0.0  # the worst stage's, exact (straight lines in the layer count)
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM  # the share of each GPU's memory left free
    preset: PresetUse | None = None  # the framework preset's defaults the plan took (Job.preset)


def _lines(job: HeteroJob, layer_costs: dict | None = None):
    """Per (node group, crossing): per stage, (seconds with one layer, seconds per extra
    layer) of one micro-batch's compute and TP/CP communication, and the stage's
    once-per-iteration seconds (exposed DP and optimizer); per (group, crossing) the pipeline
    send; per stage, memory (bytes with one layer, bytes per extra layer). ``crossing``: the
    traffic goes over the network between groups (``HeteroClusterSpec.view``). Stages between
    the first and the last differ only in memory (micro-batches in flight), so their timing is
    costed once."""
    inv = count_job(job.view_job(0))
    pp = len(inv.stages)
    classes = sorted({0, min(1, pp - 1), pp - 1})
    pick = [0] + [min(1, pp - 1)] * (pp - 2) + [pp - 1] if pp > 1 else [0]
    time_lines, once, p2p = {}, {}, {}
    for g in range(len(job.cluster.node_groups)):
        for crossing in (False, True):
            view = job.cluster.view(g, crossing)
            if crossing and view.inter_node == job.cluster.view(g).inter_node:  # the fabric is its NIC
                for table in (time_lines, once, p2p):
                    table[g, True] = table[g, False]
                continue
            cm = AnalyticalCostModel.of_plan(view, job.precision, job.parallel)
            comm = CommCosts(inv, cm)
            # what LayerCost.of reads: the layer's operators and collectives, where the TP/CP
            # groups lie (tp, cp) and how TP and CP traffic overlaps
            p, st0 = job.parallel, inv.stages[0]
            shape = (g, crossing, st0.layer_ops, st0.layer_collectives, p.tp, p.cp, p.tp_comm_overlap, p.tp_comm_overlap_cfg, p.async_tp, p.cp_comm)
            if layer_costs is None or shape not in layer_costs:
                layer = cost_layers(inv, cm, comm)
                if layer_costs is not None:
                    layer_costs[shape] = layer
            else:
                layer = layer_costs[shape]
            rows, per_iter = {}, {}
            for c in classes:
                st = inv.stages[c]
                one = stage_timing(inv, st.with_layers(1), cm, comm, layer).busy_mb_s
                two = stage_timing(inv, st.with_layers(2), cm, comm, layer).busy_mb_s
                full = stage_timing(inv, st, cm, comm, layer)
                rows[c] = (one, two - one)
                per_iter[c] = full.exposed_dp_s + full.optimizer_s
            key = (g, crossing)
            time_lines[key] = np.array([rows[c] for c in pick])
            once[key] = np.array([per_iter[c] for c in pick])
            p2p[key] = (
                comm.seconds(inv.p2p) if inv.p2p is not None else 0.0,
                comm.seconds(inv.p2p_mask) if inv.p2p_mask is not None else 0.0,
            )
    mem = []
    for st in inv.stages:
        m1 = estimate_stage_memory(inv, st.with_layers(1)).total
        m2 = estimate_stage_memory(inv, st.with_layers(2)).total
        mem.append((m1, m2 - m1))
    return time_lines, once, p2p, np.array(mem)


def plan_candidates(
    model: ModelSpec, cluster: HeteroClusterSpec, job: HeteroJob, orders: list[tuple[int, ...]], plan_args: dict,
    cache: dict | None = None,
) -> tuple[list[Candidate], int]:
    """The best layer partition of ``job``'s plan (given as ``plan_args``) for every distinct
    stage placement among ``orders``; and how many placements had no partition that fits."""
    cache = {} if cache is None else cache
    time_lines, once, p2p_of, mem = _lines(job, cache.setdefault("layer_costs", {}))
    plan = job.parallel
    L, S, m = model.num_layers, plan.pp, plan.num_microbatches
    k = np.arange(1, L + 1, dtype=float)
    hbm = [usable_hbm_bytes(g.gpu.hbm_bytes, job.memory_headroom) for g in cluster.node_groups]
    per_stage_gpus = plan.tp * plan.cp * plan.dp
    seen, out, no_fit = set(), [], 0
    for order in orders:
        groups = stage_groups(order, per_stage_gpus, cluster.gpus_per_node, S)
        if groups in seen:
            continue
        seen.add(groups)
        # as predict_hetero: mixed stages and sends between different groups cross groups
        mixed = [len(gs) > 1 for gs in groups]
        crosses = [mixed[s] or (s + 1 < S and groups[s + 1] != gs) for s, gs in enumerate(groups)]
        pairs = [p2p_of[g, crosses[s]] for s in range(S - 1) for g in set(groups[s]) | set(groups[s + 1])]
        p2p = max((x for x, _ in pairs), default=0.0)
        mask = max((x for _, x in pairs), default=0.0)
        # blocking sends hold the stage too: forward out of all but the last stage (with
        # DeepSpeed's attention mask), backward out of all but the first
        sends = np.array([(s < S - 1) * (p2p + mask) + (s > 0) * p2p for s in range(S)])
        T = np.full((S, L), -np.inf)
        limit = np.full(S, np.inf)
        for g in {g for gs in groups for g in gs}:
            for crossing in (False, True):
                on = np.array([g in gs and mixed[s] == crossing for s, gs in enumerate(groups)])
                if not on.any():
                    continue
                line = time_lines[g, crossing][on]
                T[on] = np.maximum(T[on], line[:, :1] + (k - 1) * line[:, 1:])
                limit[on] = np.minimum(limit[on], hbm[g])
        T += sends[:, None]
        T[mem[:, :1] + (k - 1) * mem[:, 1:] > limit[:, None]] = np.inf
        key = (T.tobytes(), m)  # plans that differ only where memory is not binding share it
        part = cache[key] if key in cache else cache.setdefault(key, partition_layers(T, m))
        if part is None:
            no_fit += 1
            continue
        per_iter = max(once[g, mixed[s]][s] for s, gs in enumerate(groups) for g in gs)
        worst = float(np.max(mem[:, 0] + (np.array(part.layers) - 1) * mem[:, 1]))
        out.append(Candidate(plan_args, order, part.layers, part.objective_s + per_iter, worst, job.memory_headroom,
                                 job.preset))
        # Megatron-LM's even split too, when it fits and differs: the partition is optimal
        # for the closed form, the exact simulation may still prefer equal stages
        even = count_layers_per_stage(model, job.parallel)
        if even != part.layers and L % S == 0:
            t = T[np.arange(S), np.array(even) - 1]
            if np.all(np.isfinite(t)):
                worst = float(np.max(mem[:, 0] + (np.array(even) - 1) * mem[:, 1]))
                out.append(Candidate(plan_args, order, even, closed_form_s(t, m) + per_iter, worst,
                                     job.memory_headroom, job.preset))
    return out, no_fit


def enumerate_hetero(
    model: ModelSpec,
    cluster: HeteroClusterSpec,
    global_batch_size: int,
    precision: Precision,
    space: SearchSpace,
    train_tokens: float | None = None,
) -> tuple[list[Candidate], Counter, int]:
    """Every plan of ``space`` on ``cluster`` with its best placement-and-partition
    candidates; the excluded plans by reason; the number considered (a point of the space
    the rules exclude counts once, a point that passes them once per candidate: node order
    and layer split)."""
    n, gpn = cluster.num_gpus, cluster.gpus_per_node
    tps = space.tp or tuple(t for t in (1, 2, 4, 8, 16) if t <= gpn)
    pps = space.pp or tuple(p for p in range(1, min(model.num_layers, n) + 1) if n % p == 0)
    orders = node_orders(cluster)
    excluded: Counter = Counter()
    cands: list[Candidate] = []
    partitions: dict = {}
    sps = sp_axis(space)
    runs: set = set()  # distinct runs (``runs_as_zero``; tp = 1 repeats itself with sp on and off)
    for gbs, tp, pp, cp, vpp, mbs, zero, recompute, sp in itertools.product(
        space.batch_sizes(global_batch_size), tps, pps, space.cp, space.vpp, space.micro_batch_size,
        space.zero_stage, space.recompute, sps,
    ):
        if n % (tp * pp * cp):
            excluded["tp*pp*cp does not divide the number of GPUs"] += 1
            continue
        dp = n // (tp * pp * cp)
        if gpn % tp:
            excluded[f"tp does not divide the node's {gpn} GPUs (a TP group would span two nodes)"] += 1
            continue
        if gbs % (mbs * dp):
            excluded["global batch is not a multiple of micro-batch x dp"] += 1
            continue
        if vpp > 1:
            excluded["interleaving (vpp > 1) is not searched with uneven stages"] += 1
            continue
        if zero > 1:
            excluded["ZeRO-2/3 is not searched with uneven stages (stage time is then not linear in layers)"] += 1
            continue
        refusal = framework_refusal(space.framework, tp=tp, pp=pp, cp=cp, dp=dp, zero_stage=zero,
                                    schedule=Schedule(space.extra.get("schedule", "1f1b")),
                                    recompute=Recompute(recompute), moe=model.is_moe)
        if refusal is not None:  # a plan the framework cannot launch (specs.frameworks)
            excluded[refusal] += 1
            continue
        plan = {
            "tp": tp, "pp": pp, "dp": dp, "cp": cp, "micro_batch_size": mbs, "global_batch_size": gbs,
            "zero_stage": zero, "recompute": recompute, "framework": space.framework,
            "sequence_parallel": (tp > 1) if sp is None else (sp and tp > 1), **space.extra,
        }
        plan, preset = with_preset(plan, model, cluster, space, precision)
        if model.num_layers % pp and "layers_per_stage" not in plan:  # this search states every split it runs
            plan["layers_per_stage"] = split_layers(model.num_layers, pp)
        run = (gbs, tp, pp, cp, mbs, runs_as_zero(zero, dp * cp, precision), recompute,
               plan.get("sequence_parallel", False))
        if run in runs:
            continue
        try:
            job = HeteroJob(model=model, cluster=cluster, parallel=plan, precision=precision,
                            train_tokens=train_tokens, memory_headroom=space.memory_headroom, preset=preset)
        except (ValidationError, ConfigError) as err:
            excluded[rejection_reason(err)] += 1
            continue
        runs.add(run)
        found, _ = plan_candidates(model, cluster, job, orders, plan, partitions)
        if not found:
            hbm = min(g.gpu.hbm_bytes for g in cluster.node_groups)
            excluded[f"does not fit in memory with any layer partition (smallest GPU {format_bytes(hbm)}, "
                     f"{space.memory_headroom:.0%} headroom)"] += 1
        cands += found
    return cands, excluded, len(cands) + sum(excluded.values())


def hetero_job(model, cluster, precision, train_tokens, cand: Candidate) -> HeteroJob:
    p = plan = dict(cand.plan, layers_per_stage=cand.layers)
    name = f"tp{p['tp']}-pp{p['pp']}-dp{p['dp']}"
    if len(cluster.node_groups) > 1:
        name += "-" + "".join(str(g) for g in cand.node_order)
    return HeteroJob(name=name, model=model, cluster=cluster, parallel=plan, precision=precision,
                     train_tokens=train_tokens, node_order=cand.node_order, memory_headroom=cand.memory_headroom,
                     preset=cand.preset)


REFINE_MOVES = 16  # at most this many one-layer moves between neighbouring stages on the best plan


def rank_candidates(
    model: ModelSpec,
    cluster: HeteroClusterSpec,
    precision: Precision,
    train_tokens: float | None,
    cands: list[Candidate],
    shortlist: int,
    shortlist_within: float,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[Prediction], list[Candidate]]:
    """Exact predictions of the best candidates by estimated seconds per token (at least
    ``shortlist``, and all within ``shortlist_within`` of the best), the best of them refined
    (:func:`refine_split`); and the candidates left out."""
    if not cands:
        return [], []
    per_token = np.array([c.estimate_s / c.plan["global_batch_size"] for c in cands])
    order = np.argsort(per_token, kind="stable")
    within = int(np.count_nonzero(per_token <= per_token.min() * (1.0 + shortlist_within)))
    chosen = np.sort(order[: max(shortlist, within)])
    preds = []
    for n, i in enumerate(chosen):
        if progress is not None:
            progress(n, len(chosen))
        preds.append(predict_any(hetero_job(model, cluster, precision, train_tokens, cands[int(i)])))
    fits = [i for i, p in enumerate(preds) if p.fits]
    if fits:
        best = min(fits, key=lambda i: (preds[i].iteration_s / preds[i].job.parallel.global_batch_size, i))
        taken = {(p.placement.job.node_order if p.placement else None, p.job.parallel) for p in preds}
        preds[best] = refine_split(preds[best], taken)
    return preds, [cands[int(i)] for i in order[max(shortlist, within):]]


def refine_split(pred: Prediction, taken: set) -> Prediction:
    """Move one layer at a time between neighbouring stages while the full prediction gets
    faster (first improvement, at most :data:`REFINE_MOVES` moves): the partition is optimal for the pipeline's
    closed form, the full prediction also sees the exact 1F1B schedule with unequal stages and
    the exposed data-parallel reduction. Splits in ``taken`` (already ranked) are skipped."""
    job = pred.placement.job if pred.placement is not None else None
    if job is None:
        base = pred.job
        job = HeteroJob(name=base.name, model=base.model, cluster=HeteroClusterSpec(name=base.cluster.name, node_groups=(base.cluster,)),
                        parallel=base.parallel, precision=base.precision, train_tokens=base.train_tokens,
                        memory_headroom=base.memory_headroom)
    moves = 0
    improved = True
    while improved and moves < REFINE_MOVES:
        improved = False  # one pass over the boundaries, taking each move that helps at once
        for i in range(job.parallel.pp - 1):
            for src, dst in ((i, i + 1), (i + 1, i)):
                split = list(job.parallel.layers_per_stage or count_layers_per_stage(job.model, job.parallel))
                if split[src] <= 1 or moves >= REFINE_MOVES:
                    continue
                split[src] -= 1
                split[dst] += 1
                parallel = job.parallel.model_copy(update={"layers_per_stage": tuple(split)})
                if (job.node_order if pred.placement else None, parallel) in taken:
                    continue
                trial = predict_any(job.model_copy(update={"parallel": parallel}))
                if trial.fits and trial.iteration_s < pred.iteration_s * (1 - 1e-9):
                    pred, job, improved = trial, job.model_copy(update={"parallel": parallel}), True
                    moves += 1
    return pred
