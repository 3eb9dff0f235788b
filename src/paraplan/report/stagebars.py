"""What the pictures of one prediction are drawn from: one bar of components per pipeline stage
(``stage_bars``) and the pipeline schedule as timed bars per stage (``timeline_bars``).

Both read a prediction made with ``keep_timeline=True`` (``Prediction.pipeline``): the
schedule the iteration time came from. Every stage's bar spans the whole iteration: what the
stage computes, communicates and steps, and its idle time (pipeline bubble, and waiting for
the slowest stage). The critical stage's bar is ``Prediction.breakdown`` itself, so it adds up
to ``iteration_s``.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.prediction import Prediction, StageTiming
from paraplan.prediction.components import BY_FIELD, COMPONENTS, ComponentKind
from paraplan.prediction.facade import idle_s, stage_parts

__all__ = ["COMPONENTS", "StageBar", "TimelineBar", "critical_stage", "stage_bars", "timeline_bars"]

#: The timeline's bar after a stage's last task that is its exposed DP / ZeRO traffic.
DP_LABEL = BY_FIELD["dp_communication_s"].label


@dataclass(frozen=True, slots=True)
class StageBar:
    """One pipeline stage's seconds in one iteration, by component (``COMPONENTS`` order)."""

    stage: int
    seconds: tuple[float, ...]
    critical: bool

    @property
    def total_s(self) -> float:
        return sum(self.seconds)

    def as_dict(self) -> dict[str, float]:
        """Seconds by component label."""
        return {c.label: s for c, s in zip(COMPONENTS, self.seconds, strict=True)}


def _require_timeline(pred: Prediction) -> None:
    if pred.pipeline is None:
        raise ValueError("this picture needs the pipeline schedule: predict with keep_timeline=True")


def critical_stage(pred: Prediction) -> int:
    """The stage whose pipeline drain and exposed DP traffic end last (the facade's choice)."""
    _require_timeline(pred)
    finish = pred.pipeline.finish
    return max(range(len(pred.stages)), key=lambda i: finish[i] + pred.stages[i].exposed_dp_s)


def stage_bars(pred: Prediction) -> tuple[StageBar, ...]:
    """One bar per pipeline stage, cut as the breakdown is (``facade.stage_parts``): its p2p
    time is what the pipeline's sends delay its finish by, its collectives what they delay it
    by beyond its kernels; its idle time is the rest of the iteration."""
    _require_timeline(pred)
    crit = critical_stage(pred)
    pipe = pred.pipeline
    free = pipe.free_sends_finish or pipe.finish
    compute = pipe.compute_finish or free
    bars = []
    for t in pred.stages:
        if t.stage == crit:
            parts = tuple(getattr(pred.breakdown, c.field) for c in COMPONENTS)
        else:
            work = stage_parts(pred.job, pred.stages, t.stage, pipe.finish, free, compute)
            work["optimizer_step_s"] = t.optimizer_s
            busy = sum(s for field, s in work.items() if field != "pipeline_bubble_s")
            work["pipeline_bubble_s"] = idle_s(pred.iteration_s, busy)
            parts = tuple(work[c.field] for c in COMPONENTS)
        bars.append(StageBar(stage=t.stage, seconds=parts, critical=t.stage == crit))
    return tuple(bars)


@dataclass(frozen=True, slots=True)
class TimelineBar:
    """One timed bar of the schedule: a forward or backward of a micro-batch (its blocking
    send included), or a stage's exposed DP traffic or optimizer step after its last task.
    ``waits`` holds what of a task's bar is communication (and offload copies) by breakdown
    component field, in ``COMPONENTS`` order: the pass's share of each and its blocking send."""

    stage: int
    kind: str  # "forward" | "backward" | "weight" (a zero-bubble W pass) | DP_LABEL | "optimizer"
    start: float
    end: float
    microbatch: int | None = None
    chunk: int = 0
    waits: tuple[tuple[str, float], ...] = ()


_WAITING = tuple(c.field for c in COMPONENTS if c.kind in (ComponentKind.COMMUNICATION, ComponentKind.HOST))


def _task_waits(t: StageTiming, kind: str, seconds: float, chunks: int, split: bool) -> tuple[tuple[str, float], ...]:
    """What of a ``seconds`` long task of stage ``t`` is communication: its chunk's share of
    what its pass waits for (``StageTiming``), and the rest of the bar beyond the pass is
    its blocking send (none in a zero-bubble W task: the weight gradients' kernels only)."""
    if kind == "weight":
        return ()
    if kind == "forward":
        kernels = t.forward_mb_s
        waits = {"tp_communication_s": t.tp_fwd_mb_s, "cp_communication_s": t.cp_fwd_mb_s,
                 "ep_communication_s": t.ep_fwd_mb_s, "dp_communication_s": t.zero_fwd_mb_s,
                 "offload_s": t.offload_fwd_mb_s, "host_wait_s": t.host_wait_mb_s}
    else:
        kernels = t.backward_mb_s - (t.wgrad_mb_s if split else 0.0) + t.recompute_mb_s
        waits = {"tp_communication_s": t.tp_bwd_mb_s, "cp_communication_s": t.cp_bwd_mb_s,
                 "ep_communication_s": t.ep_bwd_mb_s, "dp_communication_s": t.zero_bwd_mb_s,
                 "offload_s": t.offload_bwd_mb_s}
    waits = {field: w / chunks for field, w in waits.items()}
    waits["pipeline_p2p_s"] = max(0.0, seconds - kernels / chunks - sum(waits.values()))
    return tuple((field, waits[field]) for field in _WAITING if waits.get(field, 0.0) > 1e-9 * seconds)


def timeline_bars(pred: Prediction) -> tuple[TimelineBar, ...]:
    """The schedule the prediction used, then each stage's exposed DP traffic and optimizer step."""
    _require_timeline(pred)
    tasks = pred.pipeline.tasks
    if tasks is None:
        raise ValueError("this picture needs the pipeline's tasks: predict with keep_timeline=True")
    plan = pred.job.parallel
    chunks, split = plan.schedule.chunks(plan.vpp), plan.schedule.splits_backward
    bars = []
    for t in tasks:
        kind = "weight" if t.weight else "backward" if t.backward else "forward"
        waits = _task_waits(pred.stages[t.stage], kind, t.end - t.start, chunks, split)
        bars.append(TimelineBar(t.stage, kind, t.start, t.end, t.mb, t.chunk, waits))
    # the optimizer steps start together once the last stage has drained (the gradient-norm
    # all-reduce spans every stage), as the facade times them
    step_start = max(pred.pipeline.finish[t.stage] + t.exposed_dp_s for t in pred.stages)
    for t in pred.stages:
        start = pred.pipeline.finish[t.stage]
        if t.exposed_dp_s > 0:
            bars.append(TimelineBar(t.stage, DP_LABEL, start, start + t.exposed_dp_s))
        bars.append(TimelineBar(t.stage, "optimizer", step_start, step_start + t.optimizer_s))
    return tuple(bars)
