"""`paraplan profile ops`: time operators on this machine into a samples file."""

from __future__ import annotations

import enum
import time
from pathlib import Path
from typing import Annotated

import typer

from paraplan.cli.common import EXIT_CODES, HELP_SETTINGS, OutputFormat, err, out, user_errors, write_text
from paraplan.cli.profile_comm import comm_command
from paraplan.specs import ConfigError, positive_value

profile_app = typer.Typer(
    name="profile",
    help="Time operators (and collectives) on your own hardware; write samples `paraplan fit` reads.",
    no_args_is_help=True,
    **HELP_SETTINGS,
)


@profile_app.command("ops", short_help="Time operators' forward and backward over a grid.", epilog=EXIT_CODES)
def ops_command(
    out_file: Annotated[Path, typer.Option("--out", "-o", help="Samples file to write (a journal beside it "
                                           "keeps every point as measured; the same command resumes).")],
    grid: Annotated[list[Path] | None, typer.Option("--grid", help="Grid YAML (GPUModeling kernel grid or "
                                                    "paraplan's; repeatable).")] = None,
    job_file: Annotated[list[Path] | None, typer.Option("--for", help="Sample the shapes this job and its "
                                                        "neighbour plans (tp, micro-batch x2, /2) need "
                                                        "(repeatable: one sweep for several jobs).")] = None,
    neighbours: Annotated[bool, typer.Option(help="With --for: also the neighbour plans.")] = True,
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")] = "cpu",
    dtype: Annotated[list[str] | None, typer.Option("--dtype", help="fp32, tf32, fp16, bf16, fp8 (repeatable; "
                                                    "default: the job's precision, else fp32).")] = None,
    device_name: Annotated[str | None, typer.Option(help="Catalog GPU name to file the rows under (default: "
                                                    "torch's device name; cpu-core on the CPU).")] = None,
    threads: Annotated[int, typer.Option(help="CPU threads (1 = the one core cpu-core describes).")] = 1,
    parts: Annotated[int, typer.Option(help="Split the grid into this many parts ...")] = 1,
    part: Annotated[int, typer.Option(help="... and measure this one (1-based).")] = 1,
    force: Annotated[bool, typer.Option(help="Replace an existing --out.")] = False,
    output: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Time the forward and backward of every operator of a grid (shapes from the inventory),
    append each point to a journal as it is measured, and write the samples file at the end.
    A killed run, started again with the same command, continues where it stopped."""
    from paraplan.cli.progress import StagedProgress
    from paraplan.profile import ops, records
    from paraplan.profile.grid import split
    from paraplan.report.profile import render_sweep, sweep_record
    from paraplan.samples.store import check_samples_path

    with user_errors():
        check_samples_path(out_file, overwrite=force, flag="--force")
        points, job_dtype = _grid_points(grid, job_file, neighbours)
        points = split(points, parts, part)
        settings = ops.SweepSettings(device=device, device_name=device_name or ops.default_device_name(device),
                                     dtypes=tuple(dict.fromkeys(dtype or job_dtype or ["fp32"])), threads=threads)
        info = ops.device_info(device)
        header = ops.sweep_header(points, settings, info, (parts, part))
        with records.RecordStore(records.journal_path(out_file), header) as store:
            todo = ops.pending(points, settings, store)
            with StagedProgress(err, f"{todo} points to measure") as bar:
                bar.add_work(todo)
                result = ops.run_sweep(points, settings, store,
                                       progress=lambda key, outcome: (bar.stage(key), bar.advance(1)))
            grid_name = ", ".join(str(g) for g in grid or []) + "".join(f" --for {j}" for j in job_file or [])
            meta = store.finalize(out_file, ops.metadata(store, settings, info, (parts, part), grid_name.strip()),
                                  overwrite=force)
            record = sweep_record(result, store, meta, out_file)
    if output is OutputFormat.json:
        from paraplan.report.formats import render_json

        write_text(render_json(record))
    elif output is OutputFormat.csv:
        from paraplan.report.formats import render_csv

        write_text(render_csv([record["summary"]]))
    else:
        out.print(render_sweep(record))


def _grid_points(grid: list[Path] | None, job_files: list[Path] | None, neighbours: bool
                 ) -> tuple[list, list[str]]:
    """The grid points of ``--grid`` files and every ``--for JOB`` (no repeats: one sweep for
    several jobs measures a shape they share once), and the jobs' precisions."""
    from paraplan.profile.grid import grid_for_job, load_grid

    if not grid and not job_files:
        raise ConfigError("give --grid FILE or --for JOB (the shapes to sample)")
    points, job_dtypes = [], []
    if grid:
        points += load_grid(grid)
    for job_file in job_files or []:
        from paraplan.catalog.jobs import load_job

        job = load_job(job_file)
        if not hasattr(job, "parallel"):
            raise ConfigError(f"{job_file}: --for takes a job of one GPU type")
        points += grid_for_job(job, neighbours=neighbours)
        job_dtypes.append(job.precision.value)
    return list(dict.fromkeys(points)), list(dict.fromkeys(job_dtypes))


def _fraction(text: str) -> float:
    """``5%`` or ``0.05`` -> 0.05."""
    value = text.strip()
    try:
        number = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise ConfigError(f"--target-error: {text!r} is not a fraction (0.05) or a percentage (5%)") from None
    if not 0.0 < number < 1.0:
        raise ConfigError(f"--target-error: {text!r} must be between 0 and 100 %")
    return number


def _duration(text: str) -> float:
    """``--max-time``: '90s', '4 min', '240' -> seconds (positive)."""
    from paraplan.units import parse_seconds

    return positive_value("--max-time", text, parse_seconds, "duration")


class StopRule(str, enum.Enum):
    oob = "oob"
    holdout = "holdout"


class SampleOrder(str, enum.Enum):
    adaptive = "adaptive"
    random = "random"


@profile_app.command("adaptive", short_help="Time only the shapes the regressors need, to a target error.",
                     epilog=EXIT_CODES)
def adaptive_command(
    out_file: Annotated[Path, typer.Option("--out", "-o", help="Samples file to write (journal beside it).")],
    grid: Annotated[list[Path] | None, typer.Option("--grid", help="Grid YAML: the candidate shapes.")] = None,
    job_file: Annotated[list[Path] | None, typer.Option("--for", help="Candidates: this job's shapes and its "
                                                        "neighbour plans' (repeatable).")] = None,
    target_error: Annotated[str, typer.Option(help="Median |error| to stop at (5% or 0.05).")] = "5%",
    stop: Annotated[StopRule, typer.Option(help="What the error is measured on. oob: the random forest's "
                                           "out-of-bag error over the shapes measured; no shape is timed "
                                           "only to score the others. holdout: 20 % of each regressor's "
                                           "shapes are timed and held out. Default oob: replayed on the "
                                           "GPUModeling A100/GH200 samples to 5 %, it timed 8.0-8.5k of 94k "
                                           "shapes (11-12x fewer) where holdout timed 27k (3.5x); the "
                                           "held-out error after it: 3.5-3.8 % at the median regressor, "
                                           "worst 6-8 % (docs/learned-backend.md).")] = StopRule.oob,
    order: Annotated[SampleOrder, typer.Option(help="random: batches in a random order; adaptive: the "
                                               "shapes the forest knows least next. Default random: with "
                                               "the oob stop, adaptive order stopped later in the replay "
                                               "(11.9k shapes vs 8.0k).")] = SampleOrder.random,
    batch: Annotated[int, typer.Option(help="Shapes measured between two fits (at least).")] = 8,
    max_time: Annotated[str | None, typer.Option("--max-time", help="Start no batch after this long "
                                                 "(90s, 4 min, 1h); the batch in hand is finished, the "
                                                 "samples measured are written and each regressor not "
                                                 "done says 'time budget spent'.")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")] = "cpu",
    dtype: Annotated[list[str] | None, typer.Option("--dtype", help="fp32, fp16, bf16 (repeatable).")] = None,
    device_name: Annotated[str | None, typer.Option(help="Catalog GPU name to file the rows under.")] = None,
    cluster_files: Annotated[list[Path] | None, typer.Option("--cluster", help="Cluster file for a GPU the "
                                                             "catalog lacks (e.g. examples/tiny-cpu/cluster.yaml).")] = None,
    threads: Annotated[int, typer.Option(help="CPU threads.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the held-out split and the loop.")] = 0,
    force: Annotated[bool, typer.Option(help="Replace an existing --out.")] = False,
    output: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Per regressor (operator, dtype, direction): measure batches of the candidate shapes
    (in random order, or where the regressors disagree most or err most) until the median
    error reaches the target: the forest's out-of-bag error (--stop oob), or the error on 20 %
    of the shapes timed and held out (--stop holdout). Every point is journalled; the same
    command resumes."""
    from paraplan.catalog.jobs import load_cluster_file
    from paraplan.costmodel.fitting import Hardware
    from paraplan.profile import ops, records
    from paraplan.profile.adaptive_sweep import JournalMeasure, run_adaptive_sweep
    from paraplan.report.adaptive import adaptive_record, render_adaptive
    from paraplan.samples.store import check_samples_path

    with user_errors():
        check_samples_path(out_file, overwrite=force, flag="--force")
        target = _fraction(target_error)
        deadline = None if max_time is None else time.monotonic() + _duration(max_time)
        points, job_dtype = _grid_points(grid, job_file, True)
        hardware = Hardware.of(load_cluster_file(p) for p in cluster_files or [])
        settings = ops.SweepSettings(device=device, device_name=device_name or ops.default_device_name(device),
                                     dtypes=tuple(dict.fromkeys(dtype or job_dtype or ["fp32"])), threads=threads)
        info = ops.device_info(device)
        header = {**ops.sweep_header(points, settings, info, (1, 1)), "adaptive": {"target": target, "seed": seed,
                                                                         "stop": stop.value, "order": order.value}}
        with records.RecordStore(records.journal_path(out_file), header) as store:
            measure = JournalMeasure(points, settings, store, progress=lambda key, outcome: err.print(
                f"{key}: {outcome}", highlight=False))
            runs = run_adaptive_sweep(points, measure, target_error=target, batch_size=batch, random_state=seed,
                                      hardware=hardware, stop=stop.value, order=order.value, deadline=deadline)
            meta = store.finalize(out_file, ops.metadata(store, settings, info, (1, 1), f"adaptive {target:g}"),
                                  overwrite=force)
            record = adaptive_record(runs, measure.measured, measure.skipped, len(store.rows()), target, out_file)
    del meta
    if output is OutputFormat.json:
        from paraplan.report.formats import render_json

        write_text(render_json(record))
    else:
        out.print(render_adaptive(record))


profile_app.command("comm", short_help="Time collectives over a size sweep (here, torchrun or SLURM).",
                    epilog=EXIT_CODES)(comm_command)
