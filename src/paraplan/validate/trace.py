"""A profiler trace of a run as a measured run, and its components beside the prediction's.

The trace's summary (``traces.summary``) gives, per rank and iteration, compute by kernel class,
exposed communication per parallel dimension and idle time; they add up to the rank's iteration.
The iteration compared is the fastest one (or the median one) by its longest rank's time, as
``paraplan trace summarize`` reports it; each stage's components are the mean over the ranks
that ran it (ranks map onto stages with the pipeline dimension outermost, as Megatron-LM and
torch.distributed.pipelining number them). ``stageparts`` cuts the prediction the same way.

Every part that either side has is compared: a part the trace measured as 0 (none of it ran,
e.g. no optimizer kernel in the iteration) shows as 0 beside the prediction; a part the trace
cannot measure at all is None ("n/a"): a parallel dimension's communication on a stage where
some communication names no process group (it is "unknown comm", and may hold that dimension's).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from paraplan.catalog import load_catalog_entry
from paraplan.costmodel import CostModel
from paraplan.prediction import Prediction
from paraplan.specs import ConfigError, Job
from paraplan.traces.reader import TraceFileError, device_names, read_top
from paraplan.traces.rules import COMPUTE_CLASSES, P2P_KINDS, group_dimension
from paraplan.traces.summary import TraceSummary, summarize
from paraplan.validate.measured import MeasuredComponent, MeasuredRun
from paraplan.validate.result import ComponentError
from paraplan.validate.stageparts import predicted_stage_parts

ITERATIONS = ("fastest", "median")
COMM_PARTS = tuple(f"{dim} comm" for dim in ("tp", "cp", "ep", "pp", "dp", "unknown"))
#: The parts of a stage's iteration (they add up to it), in the order tables and figures show them.
PARTS = (*COMPUTE_CLASSES, *COMM_PARTS, "idle")
#: Every component a stage shows: the compute classes, their total, communication, idle, the iteration.
COMPONENTS = (*COMPUTE_CLASSES, "compute", *COMM_PARTS, "idle", "iteration")
TIMERS_FILE = "timers.json"  # what traces.tinyrun writes beside the traces


def stage_of_rank(job: Job, rank: int) -> int:
    """The pipeline stage of ``rank``: the pipeline dimension varies slowest."""
    return rank // (job.cluster.num_gpus // job.parallel.pp)


def check_run_matches_job(job: Job, directory: Path) -> None:
    """When the trace directory says what it ran (``timers.json`` of ``paraplan trace record``),
    refuse a job of another model or batch: its prediction would not be of this run."""
    path = Path(directory) / TIMERS_FILE
    if not path.is_file():
        return
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        model, mode = record["model"], record["mode"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return  # not tinyrun's record: nothing to check against
    plan = job.parallel
    ran = {key: model.get(key) for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                                           "vocab_size", "micro_batch_size")}
    ran["nproc"] = record.get("nproc")
    ran["num_microbatches"] = model.get("num_microbatches") if mode == "pipeline" else 1
    says = {
        "num_layers": job.model.num_layers,
        "hidden_size": job.model.hidden_size,
        "num_attention_heads": job.model.num_attention_heads,
        "seq_length": job.model.seq_length,
        "vocab_size": job.model.vocab_size,
        "micro_batch_size": plan.micro_batch_size,
        "nproc": job.cluster.num_gpus,
        "num_microbatches": plan.num_microbatches,
    }
    modes = {"pipeline": plan.pp > 1, "fsdp": plan.framework.value == "fsdp" and plan.zero_stage > 0,
             "ddp": plan.pp == 1 and plan.zero_stage == 0}
    if not modes.get(mode, True):
        raise ConfigError(f"{path}: the traced run was {mode}, job {job.name} is not (the job of another run?)")
    for key, value in says.items():
        if ran[key] is not None and ran[key] != value:
            raise ConfigError(
                f"{path}: the traced run had {key} {ran[key]}, job {job.name} has {value} "
                "(the job of another run?)"
            )


def measured_from_trace(job: Job, summary: TraceSummary, iteration: str = "fastest") -> MeasuredRun:
    """The run a trace recorded, as a measured run of ``job``: the chosen iteration (by the
    longest rank's time) and per stage the mean of its ranks' components."""
    if iteration not in ITERATIONS:
        raise ConfigError(f"--iteration {iteration!r}: choose one of {', '.join(ITERATIONS)}")
    plan = job.parallel
    worlds = {r.world_size for r in summary.ranks if r.world_size is not None}
    world = worlds.pop() if worlds else None
    if world is not None and world != job.cluster.num_gpus:
        raise ConfigError(
            f"the trace ran on {world} ranks; job {job.name}'s plan has {job.cluster.num_gpus} "
            f"(tp {plan.tp} x pp {plan.pp} x dp {plan.dp} x cp {plan.cp})"
        )
    step = summary.fastest_step if iteration == "fastest" else summary.median_step
    by_stage: dict[int, list] = {}
    for rank in summary.ranks:
        if rank.rank >= job.cluster.num_gpus:
            raise ConfigError(f"{rank.path}: rank {rank.rank}, but job {job.name} has {job.cluster.num_gpus} ranks")
        by_stage.setdefault(stage_of_rank(job, rank.rank), []).append(summary.iteration(rank, step))
    components = []
    unattributed = []
    for stage in sorted(by_stage):
        its = by_stage[stage]
        values: dict[str, float | None] = {
            **{c: statistics.fmean(it.compute_by_class.get(c, 0.0) for it in its) for c in COMPUTE_CLASSES},
            "compute": statistics.fmean(it.compute_s for it in its),
            **{f"{d} comm": statistics.fmean(it.exposed_by_dimension.get(d, 0.0) for it in its)
               for d in ("tp", "cp", "ep", "pp", "dp", "unknown")},
            "idle": statistics.fmean(it.idle_s for it in its),
            "iteration": statistics.fmean(it.iteration_s for it in its),
        }
        values["memory"] = statistics.fmean(it.memory_s for it in its)  # copies/sets are not compute
        if values["unknown comm"]:
            # communication no process group names: a dimension measured as 0 may be in it
            unattributed.append(stage)
            values.update({part: None for part in COMM_PARTS if part != "unknown comm" and not values[part]})
        components += [MeasuredComponent(name, f"stage {stage}", stage, values[name]) for name in COMPONENTS]
    ranks = sorted(len(its) for its in by_stage.values())
    notes = [
        f"measured: step {step}, the {iteration} of {len(summary.steps)} iterations by its longest rank's time; "
        f"each stage the mean of its {ranks[0] if ranks[0] == ranks[-1] else f'{ranks[0]}-{ranks[-1]}'} rank(s)",
    ]
    missing = sorted(set(range(plan.pp)) - set(by_stage))
    if missing:
        notes.append(f"no rank of stage(s) {', '.join(map(str, missing))} was traced: nothing measured there")
    if unattributed:
        notes.append(f"stage(s) {', '.join(map(str, unattributed))}: communication that no process group names "
                     "is unknown comm, so a dimension measured as 0 there is not measured (n/a), not 0")
    if any(r.device == "cpu" for r in summary.ranks):
        notes.append("a CPU trace: compute is the host's operators")
    if plan.pp > 1:
        notes.append("a blocking send/recv (gloo) spans the wait for its peer: measured pp comm holds "
                     "waiting the prediction counts as idle (the bubble)")
    return MeasuredRun(
        id=job.name,
        kind="trace",
        source="trace",
        job=job,
        measured_iteration_s=summary.step_times_s[step],
        components=tuple(components),
        gpu=job.cluster.gpu.name,
        notes=tuple(notes),
        warnings=job_mismatches(job, summary),
    )


def job_mismatches(job: Job, summary: TraceSummary) -> tuple[str, ...]:
    """Where the trace says it ran otherwise than ``job`` does, in words: the GPU (the trace's
    ``deviceProperties`` names, read through the catalog's aliases) and the pipeline degree
    (the size of a process group whose description or name says pipeline, else whether the
    trace holds any pipeline send or receive). Warnings, not errors: a prediction of the job
    on another GPU can still be worth comparing."""
    out = []
    tops = []
    for rank in summary.ranks:
        try:
            tops.append(read_top(rank.path))
        except (TraceFileError, OSError):
            continue
    names = sorted({name for top in tops for name in device_names(top)})
    says = job.cluster.gpu.name
    for name in names:
        theirs = _catalog_gpu(name)
        if (theirs or name.casefold()) != (_catalog_gpu(says) or says.casefold()):
            unknown = "" if theirs else " (a GPU the catalog does not know)"
            out.append(f"trace recorded on {name}{unknown}, job says {says}")
    pp = job.parallel.pp
    sizes = sorted({int(g["pg_size"]) for top in tops for g in (top.get("distributedInfo") or {}).get("pg_config") or ()
                    if isinstance(g, dict) and isinstance(g.get("pg_size"), int)
                    and group_dimension(f"{g.get('pg_desc') or ''} {g.get('pg_name') or ''}") == "pp"})
    if sizes and sizes != [pp]:
        out.append(f"the trace's pipeline process group has {' or '.join(map(str, sizes))} ranks, job says pp {pp}")
    elif not sizes:
        sends = sum(1 for r in summary.ranks for c in r.collectives if c.dimension == "pp" and c.kind in P2P_KINDS)
        if pp > 1 and not sends:
            out.append(f"the trace holds no pipeline send or receive, job says pp {pp}")
        elif pp == 1 and sends:
            out.append(f"the trace holds {sends} pipeline sends/receives in its iterations, job says pp 1")
    return tuple(out)


def _catalog_gpu(name: str) -> str | None:
    """The catalog's name of a GPU given any of its aliases ("NVIDIA A100-SXM4-40GB"); None
    for a GPU the catalog does not know."""
    try:
        return str(load_catalog_entry("gpus", name)["name"])
    except ConfigError:
        return None


def load_trace_run(
    job: Job, trace_dir: Path, iteration: str = "fastest"
) -> tuple[MeasuredRun, tuple[tuple[Path, str], ...]]:
    """The measured run a directory of rank traces recorded, of ``job`` (checked against the
    directory's ``timers.json`` when there is one), and the trace files that could not be read."""
    if iteration not in ITERATIONS:
        raise ConfigError(f"--iteration {iteration!r}: choose one of {', '.join(ITERATIONS)}")
    check_run_matches_job(job, Path(trace_dir))
    summary = summarize([Path(trace_dir)])
    return measured_from_trace(job, summary, iteration), summary.skipped


#: Shown for every stage whatever their values.
ALWAYS_SHOWN = frozenset({"compute", "idle", "iteration"})


def compare_trace(run: MeasuredRun, pred: Prediction, cm: CostModel) -> tuple[ComponentError, ...]:
    """Each component of each traced stage that either side has, measured beside paraplan's
    value of the same part: a part the trace measured (more than 0) or paraplan predicts (0
    where paraplan predicts none of it, e.g. ``other``: operators it does not model; a
    measured 0 where the trace has none of a predicted part; None where the trace cannot
    measure it), and always compute, idle and the iteration."""
    parts = predicted_stage_parts(pred, cm)
    out = []
    for c in run.components:
        predicted = parts[c.stage_index].get(c.name, 0.0)
        if c.name in ALWAYS_SHOWN or (c.seconds or 0.0) > 0 or predicted > 0:
            out.append(ComponentError(c.name, c.stage, c.seconds, predicted))
    return tuple(out)
