"""The last check before a prediction is an answer: every figure it reports is a finite number
a cluster can reach. A figure that is not is a bug (``InternalError``, exit code 3), never output."""

from __future__ import annotations

import math
from dataclasses import fields

from paraplan.inventory import JobInventory
from paraplan.prediction.result import Breakdown, Prediction
from paraplan.specs import InternalError, Job


def check_possible(prediction: Prediction, inv: JobInventory, peak_flops_total: float, *,
                   breakdown: bool = True) -> None:
    """Raise InternalError for a prediction no cluster can reach: an iteration that is not a
    positive finite number of seconds, shorter than the kernels' executed FLOPs take at the
    GPUs' summed peak, an MFU or HFU above 100 %, or any reported time, rate, memory or cost
    figure that is negative or not finite. Validated inputs cannot make the roofline beat a
    peak (every efficiency is at most 1 and every peak, bandwidth and latency positive and
    bounded), and model and hardware FLOPs count no more than the kernels run (causal
    attention's half), so each is a bug. With ``breakdown=False`` the breakdown and bubble
    fraction are left unread (a deferred one is checked when computed: ``check_breakdown``)."""
    iteration_s = prediction.iteration_s
    check_iteration(prediction.job, iteration_s)
    problems = []
    floor_s = inv.executed_flops_per_iteration / peak_flops_total
    if iteration_s < floor_s * (1 - 1e-9):
        problems.append(f"an iteration of {iteration_s:.4g} s, faster than the {floor_s:.4g} s its kernels' "
                        "FLOPs take at the GPUs' peak")
    problems += [f"{name} {100 * value:.1f} %, above 100 %"
                 for name, value in (("MFU", prediction.mfu), ("HFU", prediction.hfu)) if value > 1 + 1e-9]
    problems += [f"{name} {value!r}" for name, value in reported_figures(prediction, breakdown=breakdown)
                 if not (0 <= value < math.inf)]
    problems += unbalanced(prediction, breakdown=breakdown)
    if problems:
        _impossible(prediction.job, problems)


def check_breakdown(job: Job, breakdown: Breakdown, iteration_s: float) -> None:
    """Raise InternalError for a breakdown ``check_possible`` would refuse: a part that is
    negative or not finite, a bubble fraction that is not, or parts not adding up to the
    iteration."""
    figures = [("bubble_fraction", breakdown.pipeline_bubble_s / iteration_s)]
    figures += breakdown_figures(breakdown)
    problems = [f"{name} {value!r}" for name, value in figures if not (0 <= value < math.inf)]
    problems += _unbalanced_total(breakdown, iteration_s)
    if problems:
        _impossible(job, problems)


def check_iteration(job: Job, iteration_s: float) -> None:
    """Raise InternalError unless the iteration is a positive finite number of seconds (the
    figures divided by it are then finite too)."""
    if not (0 < iteration_s < math.inf):
        _impossible(job, [f"iteration time {iteration_s!r} s"])


def unbalanced(prediction: Prediction, rel: float = 1e-9, *, breakdown: bool = True) -> list[str]:
    """The breakdown's parts must add up to the iteration (unless ``breakdown`` is False), and
    each stage's parts of a pass (kernels and the communication they wait for) to the pass
    the schedule was given."""
    out = _unbalanced_total(prediction.breakdown, prediction.iteration_s, rel) if breakdown else []
    for t in prediction.stages:
        fwd = (t.forward_mb_s + t.tp_fwd_mb_s + t.cp_fwd_mb_s + t.ep_fwd_mb_s + t.zero_fwd_mb_s + t.offload_fwd_mb_s
               + t.host_wait_mb_s)
        bwd = (t.backward_mb_s + t.recompute_mb_s + t.tp_bwd_mb_s + t.cp_bwd_mb_s + t.ep_bwd_mb_s + t.zero_bwd_mb_s
               + t.offload_bwd_mb_s)
        for name, parts, whole in (("forward", fwd, t.fwd_pass_mb_s), ("backward", bwd, t.bwd_pass_mb_s)):
            if not math.isclose(parts, whole, rel_tol=rel, abs_tol=1e-15):
                out.append(f"stage {t.stage}'s {name} parts adding up to {parts!r} s, not its pass's {whole!r} s")
    return out


def _unbalanced_total(breakdown: Breakdown, iteration_s: float, rel: float = 1e-9) -> list[str]:
    total = breakdown.total_s
    if not math.isclose(total, iteration_s, rel_tol=rel):
        return [f"a breakdown adding up to {total!r} s, not the iteration's {iteration_s!r} s"]
    return []


def _fields(record) -> list[tuple[str, object]]:
    """A flat dataclass's fields and values (``asdict`` would deep-copy each one)."""
    return [(f.name, getattr(record, f.name)) for f in fields(record)]


def reported_figures(prediction: Prediction, *, breakdown: bool = True) -> list[tuple[str, float]]:
    """Every number a prediction reports that must be finite and not negative, by name (the
    breakdown's and the bubble fraction only with ``breakdown``)."""
    p = prediction
    names = ("tokens_per_s", "tflops_per_gpu", "mfu", "hfu", "bubble_fraction", "params_total", "params_active",
             "model_flops_per_iteration")
    figures = [(name, getattr(p, name)) for name in names if breakdown or name != "bubble_fraction"]
    if breakdown:
        figures += breakdown_figures(p.breakdown)
    for st in p.stages:
        figures += [(f"stages[{st.stage}].{k}", float(v)) for k, v in _fields(st)]
    for mem in p.memory:
        figures += [(f"memory[{mem.stage}].{k}", float(v)) for k, v in _fields(mem) if not isinstance(v, str)]
        figures.append((f"memory[{mem.stage}].total", mem.total))
    for name in ("cost_per_hour_usd", "usd_per_million_tokens", "time_to_train_s", "cost_to_train_usd"):
        value = getattr(p, name)
        if value is not None:
            figures.append((name, value))
    return figures


def breakdown_figures(breakdown: Breakdown) -> list[tuple[str, float]]:
    """The breakdown's parts, by name (``breakdown.<field>``)."""
    return [(f"breakdown.{k}", v) for k, v in _fields(breakdown)]


def _impossible(job: Job, problems: list[str]) -> None:
    raise InternalError(
        f"internal error: the prediction for job {job.name!r} ({job.model.name} on "
        f"{job.cluster.num_gpus} x {job.cluster.gpu.name}) is impossible: {'; '.join(problems)}. "
        "It is not an answer; please report it to paraplan with the job file"
    )
