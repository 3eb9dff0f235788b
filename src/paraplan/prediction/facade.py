"""The facade: Job -> Prediction (iteration time, breakdown, memory, MFU, cost).

``predict`` is the homogeneous path with a cost model already chosen; the one door that chooses
it or the heterogeneous path, and the cost model, is ``prediction.entry.predict_any``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from paraplan.costmodel import AnalyticalCostModel, CostModel
from paraplan.inventory import JobInventory, StageInventory, count_job
from paraplan.prediction.memory import estimate_memory
from paraplan.prediction.offload import offload_notes
from paraplan.prediction.plan_notes import plan_notes
from paraplan.prediction.result import (
    Breakdown,
    CollectiveEstimate,
    Deferred,
    OpEstimate,
    Placement,
    Prediction,
    StageTiming,
)
from paraplan.prediction.sanity import check_breakdown, check_iteration, check_possible
from paraplan.prediction.stages import CommCosts, explain_layer, layer_costs, stage_timing
from paraplan.schedule import (
    PipelineResult,
    deepspeed_free_sends_finish,
    free_sends_finish,
    placement,
    simulate_deepspeed_pipeline,
    simulate_pipeline,
    transfer_s,
)
from paraplan.specs import Job


def predict(job: Job, cost_model: CostModel | None = None, *, keep_timeline: bool = False) -> Prediction:
    """Predict one training iteration of ``job`` (analytical backend unless one is given)."""
    inv = count_job(job)
    cm = cost_model if cost_model is not None else AnalyticalCostModel.of_plan(job.cluster, job.precision,
                                                                               job.parallel)
    prepare = getattr(cm, "prepare", None)
    if prepare is not None:  # batched backends estimate the whole job's operators at once
        prepare(inv)
    comm = CommCosts(inv, cm)
    layers = layer_costs(inv, cm, comm)
    timings = tuple(stage_timing(inv, st, cm, comm, layers) for st in inv.stages)
    crit_explain = functools.partial(explain_layer, inv, cm=cm, comm=comm, layers=layers)
    peak = job.cluster.gpu.flops_for(job.precision) * job.cluster.num_gpus
    notes = plan_notes(job, comm, inv)
    return assemble_prediction(
        job, inv, timings, cm.name, peak, crit_explain, keep_timeline=keep_timeline,
        uncalibrated=notes.uncalibrated, ignored_settings=notes.ignored, placement_notes=notes.placement,
    )


def assemble_prediction(
    job: Job,
    inv: JobInventory,
    timings: tuple[StageTiming, ...],
    backend: str,
    peak_flops_total: float,
    explain: Callable[[StageInventory], tuple[tuple[OpEstimate, ...], tuple[CollectiveEstimate, ...]]],
    *,
    keep_timeline: bool = False,
    placement: Placement | None = None,
    uncalibrated: tuple[str, ...] = (),
    ignored_settings: tuple[str, ...] = (),
    placement_notes: tuple[str, ...] = (),
) -> Prediction:
    """The iteration from per-stage timings: the pipeline schedule, the critical stage's
    breakdown, memory, MFU. ``peak_flops_total`` is the sum of every GPU's peak;
    ``explain(stage)`` lists the critical stage's operators on demand."""
    plan = job.parallel
    p2p = max(t.p2p_s for t in timings)
    mask = max(t.p2p_mask_s for t in timings)
    pipe = run_pipeline(job, timings, p2p, mask, keep_tasks=keep_timeline)
    drain = [pipe.finish[i] + timings[i].exposed_dp_s for i in range(plan.pp)]
    crit = max(range(plan.pp), key=drain.__getitem__)
    step = [t.optimizer_s for t in timings]
    opt = max(range(plan.pp), key=step.__getitem__)
    iteration = drain[crit] + step[opt]
    check_iteration(job, iteration)
    breakdown: Breakdown | Deferred
    if keep_timeline or plan.pp == 1:  # the timeline keeps the runs; one stage needs none
        free, compute = network_free_finish(job, timings, pipe.finish)
        if keep_timeline:
            pipe = dataclasses.replace(pipe, free_sends_finish=free, compute_finish=compute)
        breakdown = critical_breakdown(job, timings, crit, pipe.finish, step[opt], (free, compute))
    else:  # the free-send runs wait for the first read of the breakdown (the search makes none)
        breakdown = Deferred(functools.partial(checked_breakdown, job, timings, crit, pipe.finish, step[opt],
                                               iteration))
    memory = estimate_memory(inv)
    uncalibrated += offload_notes(job, max(mem.host for mem in memory))
    num_gpus = job.cluster.num_gpus
    mfu = inv.model_flops_per_iteration / (iteration * peak_flops_total)
    hfu = inv.hardware_flops_per_iteration / (iteration * peak_flops_total)
    prediction = Prediction(
        job=job,
        backend=backend,
        iteration_s=iteration,
        tokens_per_s=job.tokens_per_iteration / iteration,
        tflops_per_gpu=inv.model_flops_per_iteration / iteration / num_gpus / 1e12,
        mfu=mfu,
        hfu=hfu,
        breakdown=breakdown,
        stages=timings,
        memory=memory,
        params_total=inv.params_total,
        params_active=inv.params_active,
        model_flops_per_iteration=inv.model_flops_per_iteration,
        pipeline=pipe if keep_timeline else None,
        placement=placement,
        uncalibrated=uncalibrated,
        ignored_settings=ignored_settings,
        placement_notes=placement_notes,
        _explain=functools.partial(explain, inv.stages[crit]),
    )
    check_possible(prediction, inv, peak_flops_total, breakdown=not isinstance(breakdown, Deferred))
    return prediction


def critical_breakdown(
    job: Job,
    timings: tuple[StageTiming, ...],
    crit: int,
    finish: tuple[float, ...],
    step_s: float,
    runs: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
) -> Breakdown:
    """The iteration's breakdown: the critical stage ``crit``'s parts (``stage_parts``) and
    the slowest optimizer step, ``step_s``. ``runs``: ``network_free_finish``'s, when run."""
    free, compute = runs if runs is not None else network_free_finish(job, timings, finish)
    return Breakdown(**stage_parts(job, timings, crit, finish, free, compute), optimizer_step_s=step_s)


def checked_breakdown(
    job: Job, timings: tuple[StageTiming, ...], crit: int, finish: tuple[float, ...], step_s: float,
    iteration_s: float,
) -> Breakdown:
    """``critical_breakdown``, checked as ``check_possible`` checks a prediction's: a
    prediction's deferred breakdown."""
    breakdown = critical_breakdown(job, timings, crit, finish, step_s)
    check_breakdown(job, breakdown, iteration_s)
    return breakdown


def run_pipeline(
    job: Job, timings: tuple[StageTiming, ...], p2p_s: float, mask_s: float, *, keep_tasks: bool = False
) -> PipelineResult:
    """The plan's pipeline schedule over the stages' per-micro-batch passes, each send
    ``p2p_s`` (a forward's ``mask_s`` more)."""
    plan = job.parallel
    fwd = [t.fwd_pass_mb_s for t in timings]
    bwd = [t.bwd_pass_mb_s for t in timings]
    if plan.runs_deepspeed_train_schedule and plan.pp > 1:
        return simulate_deepspeed_pipeline(
            fwd, bwd, p2p_s, plan.num_microbatches, keep_tasks=keep_tasks, fwd_extra_s=mask_s
        )
    return simulate_pipeline(
        fwd, bwd, p2p_s, plan.num_microbatches, plan.schedule, plan.vpp, keep_tasks=keep_tasks, fwd_extra_s=mask_s,
        overlap_p2p=plan.overlap_p2p_comm, wgrad_s=[t.wgrad_mb_s for t in timings],
    )


def _own_work_mb_s(t: StageTiming) -> float:
    """One micro-batch's seconds on stage ``t`` that no network speed changes: its kernels and
    the host copies and kernel launches it waits for."""
    return t.forward_mb_s + t.backward_mb_s + t.recompute_mb_s + t.offload_mb_s + t.host_wait_mb_s


def network_free_finish(
    job: Job, timings: tuple[StageTiming, ...], finish: tuple[float, ...]
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Each stage's finish had every pipeline send been free, and had every collective been
    free as well (the passes their kernels and host waits only): the same schedule, both
    timed in one walk of its task graph. Only the breakdown needs them (the search never runs
    them: a prediction defers its breakdown until read); a single stage's passes run back to
    back, so there they are the schedule's ``finish``."""
    plan = job.parallel
    if plan.pp == 1:
        return finish, finish
    passes = ([t.fwd_pass_mb_s for t in timings], [t.bwd_pass_mb_s for t in timings])
    compute = ([t.forward_mb_s + t.host_wait_mb_s + t.offload_fwd_mb_s for t in timings],
               [t.backward_mb_s + t.recompute_mb_s + t.offload_bwd_mb_s for t in timings])
    if plan.runs_deepspeed_train_schedule:
        return deepspeed_free_sends_finish(passes, compute, plan.num_microbatches)
    return free_sends_finish(passes, compute, plan.num_microbatches, plan.schedule, plan.vpp,
                             [t.wgrad_mb_s for t in timings])


#: The collectives a pass waits for: (breakdown component, its forward and backward parts).
_COLLECTIVES = (
    ("tp_communication_s", "tp_fwd_mb_s", "tp_bwd_mb_s"),
    ("cp_communication_s", "cp_fwd_mb_s", "cp_bwd_mb_s"),
    ("ep_communication_s", "ep_fwd_mb_s", "ep_bwd_mb_s"),
    ("dp_communication_s", "zero_fwd_mb_s", "zero_bwd_mb_s"),
)


def stage_parts(
    job: Job,
    timings: tuple[StageTiming, ...],
    stage: int,
    finish: tuple[float, ...],
    free: tuple[float, ...],
    compute: tuple[float, ...],
) -> dict[str, float]:
    """Stage ``stage``'s seconds by breakdown component up to its exposed DP traffic's end,
    the optimizer step aside. Its kernels and host copies are its own; what
    waiting for the network costs it is what its finish would lose were that free: the
    pipeline's sends ``finish - free`` (blocking or not, its own or a neighbour's), the
    collectives ``free - compute``, shared by kind in proportion to the seconds each adds to
    the pipeline's passes (a stage waiting for another stage's all-reduce waits for TP). The
    idle time left, ``compute`` less the stage's own work, is the schedule's own bubble: no
    network speed changes it. With one stage that is its own passes' parts, as they are."""
    t = timings[stage]
    m = job.parallel.num_microbatches
    parts = {name: m * seconds for name, seconds in t.per_microbatch().items()}
    if job.parallel.pp > 1:
        waited = idle_s(free[stage], compute[stage])
        weights = {name: sum(getattr(u, f) + getattr(u, b) for u in timings) for name, f, b in _COLLECTIVES}
        total = sum(weights.values())
        for name, weight in weights.items():
            parts[name] = waited * weight / total if total > 0.0 else 0.0
        parts["pipeline_bubble_s"] = idle_s(compute[stage], m * _own_work_mb_s(t))
    else:
        parts["pipeline_bubble_s"] = idle_s(finish[stage], m * t.busy_mb_s)
    parts["dp_communication_s"] += t.exposed_dp_s
    parts["pipeline_p2p_s"] = idle_s(finish[stage], free[stage])
    return parts


def idle_s(span_s: float, busy_s: float) -> float:
    """The idle part of ``span_s`` seconds busy for ``busy_s``: none when they differ by
    rounding only (a stage that never waits, summed in two orders)."""
    idle = span_s - busy_s
    return idle if idle > 1e-9 * span_s else 0.0


def stage_sends_s(job: Job, stage: int, p2p_s: float, mask_s: float = 0.0) -> float:
    """Seconds stage ``stage`` spends holding pipeline sends over one iteration (``p2p_s`` one
    activation or gradient, ``mask_s`` what a forward send carries besides): what a trace shows
    it in sends. The breakdown's p2p is another figure: what the sends delay it by
    (``stage_parts``)."""
    plan = job.parallel
    lockstep = plan.runs_deepspeed_train_schedule and plan.pp > 1
    m = plan.num_microbatches
    if plan.pp == 1 or (plan.overlap_p2p_comm and not lockstep):
        return 0.0  # no pipeline, or asynchronous sends that hold no stage
    if lockstep:  # a rendezvous holds the receiver too: every transfer in or out of the stage
        return transfer_s(stage, plan.pp, m, p2p_s, mask_s)
    # each of the stage's v chunks sends forward and backward, except out of the model's ends
    # and between two chunks of the same stage (ZB-V's turn on the last stage)
    where_is = placement(plan.schedule, plan.pp, plan.schedule.chunks(plan.vpp))
    forward_sends = m * sum(where_is[s + 1][0] != i for s, (i, _) in enumerate(where_is[:-1]) if i == stage)
    backward_sends = m * sum(where_is[s - 1][0] != i for s, (i, _) in enumerate(where_is) if s > 0 and i == stage)
    return (p2p_s + mask_s) * forward_sends + p2p_s * backward_sends
