"""What predict, report and compare share between parsing and rendering: the job a file (or the
built-in demo job) and the flags describe, and its prediction with the chosen cost model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from paraplan.cli.common import JOB_FLAGS

if TYPE_CHECKING:
    from paraplan.prediction import Prediction
    from paraplan.specs import HeteroJob, Job
    from paraplan.uncertainty import Interval, ResidualTable
    from paraplan.uncertainty.pair import RatioInterval


def load_flagged_job(job_file: Path | None, flags: dict[str, Any]) -> tuple[Job | HeteroJob, str | None]:
    """The job of ``job_file`` (None: the built-in demo job) with ``flags`` laid over it, and
    the line to print on stderr once the command has its answer (bad input prints one line,
    the error): what was taken from the demo job, or where the sequence length came from."""
    from paraplan.catalog.jobs import demo_for_flags, demo_job_mapping, read_job_file
    from paraplan.catalog.origin import resolve_with_flags

    flags = cwd_paths(flags)
    raw = read_job_file(job_file) if job_file is not None else demo_for_flags(demo_job_mapping(), flags)
    base, origin = (job_file.parent, str(job_file)) if job_file is not None else (Path("."), "the demo job")
    job = resolve_with_flags(raw, flags, base, origin)
    note = None
    taken = from_demo(raw, flags, job.model.seq_length) if job_file is None else []
    if taken:
        note = f"from the demo job: {' '.join(taken)}"
    elif job_file is not None and flags.get("hf_config") is not None and flags.get("seq_length") is None:
        note = f"note: --seq-length {job.model.seq_length} from {job_file}'s model (--hf-config gives none)"
    return job, note


def cwd_paths(flags: dict[str, Any]) -> dict[str, Any]:
    """A path on the command line is relative to the working directory, not to the job file."""
    hf = flags.get("hf_config")
    return flags if hf is None else {**flags, "hf_config": str(Path(hf).absolute())}


def from_demo(demo: dict[str, Any], flags: dict[str, Any], seq_length: int) -> list[str]:
    """The demo job's settings no flag replaced, as the flags that would set them
    (``--model llama-3-8b``, ``--seq-length 8192``, ``--tp 2``, ``--sequence-parallel``)."""
    from paraplan.catalog.jobs import apply_overrides, demo_for_flags

    demo = demo_for_flags(demo, flags)  # (as load_flagged_job reads it: the same again is the same)
    given = {k for k, v in flags.items() if v is not None}
    if "gpu" in given:
        given.add("cluster")  # the GPU's reference node replaces the demo's cluster
    # (a --seq-length alone changes the demo's model, which is still the one it names)
    merged, base = apply_overrides(demo, {**flags, "seq_length": None}), apply_overrides(demo, {})
    by_key = {f.key: f for f in JOB_FLAGS}
    words: list[str] = []
    for path, value in _leaves(base):
        key = "cluster" if path == ("cluster", "name") else path[-1]
        if key in given or key == "name" or _get(merged, path) != value:
            continue
        flag = by_key.get(key)
        if flag is None:  # a setting with no flag of its own
            words.append(f"{'.'.join(path)}={value}")
        elif isinstance(value, bool):
            on, _, off = flag.flag.partition("/")
            words.append(on if value else off)
        else:
            words.append(f"{flag.flag} {value}")
        if key == "model" and "seq_length" not in given:
            words.append(f"--seq-length {seq_length}")
    if "hf_config" in given and "seq_length" not in given:
        words.append(f"--seq-length {seq_length}")
    return words


def _leaves(mapping: dict[str, Any], path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out: list[tuple[tuple[str, ...], Any]] = []
    for key, value in mapping.items():
        if isinstance(value, dict):
            out += _leaves(value, (*path, key))
        else:
            out.append(((*path, key), value))
    return out


def _get(mapping: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(mapping, dict) or key not in mapping:
            return None
        mapping = mapping[key]
    return mapping


def predict_flagged(job: Job | HeteroJob, backend: str, models: Path | None,
                    keep_timeline: bool = False) -> tuple[Prediction, tuple[str, ...]]:
    """The prediction of ``job`` with the cost model ``backend`` (``models``: a fitted models
    file), and the notes about it: that its framework cannot run the plan, and what the cost
    model has to say."""
    from paraplan.prediction.entry import predict_any
    from paraplan.specs.frameworks import unrunnable_note

    unrunnable = tuple(n for n in (unrunnable_note(job),) if n is not None)
    notes: list[str] = []
    prediction = predict_any(job, backend=backend, models=models, keep_timeline=keep_timeline, notes=notes)
    return prediction, unrunnable + tuple(notes)


def interval_of(job: Job | HeteroJob, pred: Prediction, level: float, backend: str, models: Path | None,
                table: ResidualTable | None = None) -> Interval:
    """The interval of ``pred`` at ``level``: its regime's split-conformal bounds, widened by the
    spread of the prediction over the plausible values of each setting ``job`` left unstated
    (each recomputed with the same cost model; a heterogeneous job is not widened)."""
    from dataclasses import replace

    from paraplan.prediction.entry import predict_any
    from paraplan.specs import Job
    from paraplan.uncertainty import interval_for
    from paraplan.uncertainty.guessed import setting_spreads

    spreads = ()
    if isinstance(job, Job):
        spreads = setting_spreads(job, pred.iteration_s,
                                  lambda j: predict_any(j, backend=backend, models=models).iteration_s)
    learned = learned_errors(models, pred) if backend == "learned" and models is not None else None
    interval = interval_for(pred, level, table, guessed=spreads, learned=learned)
    said = []
    if backend != "analytical":  # the dev runs' residuals are the analytical backend's predictions'
        said.append(f"the regimes' residuals are the analytical backend's (the {backend} backend has none "
                    "on the dev runs)")
    if not isinstance(job, Job):
        said.append("a heterogeneous job is not widened for the settings it left unstated")
    return replace(interval, rule="; ".join([interval.rule, *said])) if said else interval


def learned_errors(models: Path, pred: Prediction) -> dict[str, float]:
    """Each operator regressor of ``models`` for ``pred``'s GPU and precision, with the held-out
    mean |error| ``paraplan fit`` scored it with (``regress.store.read_manifest``)."""
    from paraplan.regress.store import read_manifest

    prefix = f"op/{pred.job.cluster.gpu.name}/{pred.job.precision.value}/"
    return {key: float(entry["holdout_error"]) for key, entry in read_manifest(models)["models"].items()
            if key.startswith(prefix)}


def prediction_data(job: Job | HeteroJob, pred: Prediction, level: float, backend: str, models: Path | None,
                    table: ResidualTable | None = None) -> tuple[dict[str, Any], Interval]:
    """What ``paraplan predict --format json`` prints (the web page sends the same): the
    prediction's fields with its interval at ``level`` (:func:`interval_of`), and the interval."""
    bounds = interval_of(job, pred, level, backend, models, table)
    return {**pred.to_dict(), "interval": bounds.to_dict(pred)}, bounds


def pair_intervals(job_a: Job | HeteroJob, job_b: Job | HeteroJob, a: Prediction, b: Prediction, level: float,
                   backend: str, models: Path | None) -> tuple[Interval, Interval, RatioInterval]:
    """A's and B's intervals at ``level``, and the interval of the ratio B / A of their
    iteration times (``uncertainty.pair``: in one regime the two share most of their error)."""
    from paraplan.prediction.entry import predict_any
    from paraplan.specs import Job
    from paraplan.uncertainty.guessed import ratio_spreads
    from paraplan.uncertainty.pair import ratio_interval
    from paraplan.uncertainty.regimes import architectures_of

    ia = interval_of(job_a, a, level, backend, models)
    ib = interval_of(job_b, b, level, backend, models)
    spreads = ()
    if isinstance(job_a, Job) and isinstance(job_b, Job):
        known = {id(job_a): a.iteration_s, id(job_b): b.iteration_s}

        def seconds(j: Job) -> float:
            return known.get(id(j)) or predict_any(j, backend=backend, models=models).iteration_s

        spreads = ratio_spreads(job_a, job_b, seconds)
    return ia, ib, ratio_interval(ia.regime, ib.regime, b.iteration_s / a.iteration_s, level, guessed=spreads,
                                  architectures=(architectures_of(a), architectures_of(b)),
                                  gpus=(a.job.cluster.gpu.name, b.job.cluster.gpu.name))


def runs_table(files: list[Path], level: float) -> tuple[ResidualTable, list[str]]:
    """The package's residuals with those of a user's measured runs (``--runs``: files as
    ``paraplan validate runs`` reads) added to their regimes, and the warnings to print: each
    run that could not be read, and each regime of the user's runs that still has too few runs
    for ``level``, with the fallback rule its intervals take."""
    from paraplan.uncertainty import load_residuals
    from paraplan.uncertainty.interval import conformal_interval
    from paraplan.validate import load_runs, validate_runs
    from paraplan.validate.residuals import held_runs

    skipped: list[tuple[str, str]] = []
    held = held_runs(r for f in files for r in validate_runs(load_runs(f), skipped=skipped))
    table = load_residuals().with_runs((h.regime, h.residual, h.architecture) for h in held)
    warnings = [f"--runs: skipped {run_id}: {reason}" for run_id, reason in skipped]
    for regime in sorted({h.regime for h in held}):
        _, _, rule, fallback, _ = conformal_interval(regime, level, table)
        if fallback:
            warnings.append(f"--runs: {rule}")
    return table, warnings
