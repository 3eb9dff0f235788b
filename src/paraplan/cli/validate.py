"""`paraplan validate RUNS.json...` (measured runs: the error tables) and `paraplan validate
trace JOB TRACE_DIR` (a profiler trace beside the prediction of its job, per component)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from typer.core import TyperGroup

from paraplan.cli.common import EXIT_CODES, HELP_SETTINGS, OutputFormat, err, out, user_errors, write_text

if TYPE_CHECKING:  # typer vendors click (0.29+): no click of its own is installed
    from typer import _click as click


class _RunsByDefault(TyperGroup):
    """`paraplan validate FILE...` is `paraplan validate runs FILE...`: a first word that names
    no subcommand goes to `runs`. The help shows both forms, and `runs`' options."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["runs", *args]
        return super().parse_args(ctx, args)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "[runs] RUNS_FILES... [OPTIONS]")
        formatter.write_usage(ctx.command_path, "trace JOB TRACE_DIR [OPTIONS]", prefix="   or: ")

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        runs = self.commands["runs"]
        runs.format_options(type(ctx)(runs, info_name="runs", parent=ctx), formatter)
        self.format_commands(ctx, formatter)


validate_app = typer.Typer(
    name="validate",
    cls=_RunsByDefault,
    help="Predict measured runs from their configuration and print the errors: run files "
    "(runs_perlmutter.json, runs_dev*.json; `runs`, the default) or a profiler trace of a job (`trace`).",
    no_args_is_help=True,
    **HELP_SETTINGS,
)


@validate_app.command("runs", short_help="Measured runs from run files; the default form.", epilog=EXIT_CODES)
def validate_command(
    runs_files: Annotated[
        list[Path],
        typer.Argument(help="Measured runs: runs_perlmutter.json (GPUModeling25), runs_dev*.json (published)."),
    ],
    output: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
    components: Annotated[bool, typer.Option("--components/--no-components", help="Per-component tables.")] = True,
    backend: Annotated[str, typer.Option(help="analytical | learned (needs --models).")] = "analytical",
    models: Annotated[Path | None, typer.Option(help="Models file from `paraplan fit`.")] = None,
) -> None:
    """Predict measured runs from their configuration; print measured vs predicted, the error,
    and per source and per GPU the signed median, median and p90 of |error|."""
    from paraplan.prediction.backends import load_model_file
    from paraplan.report.formats import render_csv, render_json
    from paraplan.report.validation import render_validation, validation_rows
    from paraplan.validate import load_runs, validate_runs

    if models is not None and backend == "analytical":
        backend = "learned"
    skipped: list[tuple[str, str]] = []
    with user_errors():
        fitted = load_model_file(models) if models is not None else None
        results = [r for f in runs_files for r in validate_runs(load_runs(f), backend, fitted, skipped)]
    for run_id, reason in skipped:
        err.print(f"[yellow]skipped:[/] {run_id}: {reason}", highlight=False, soft_wrap=True)
    if not results:
        err.print("[bold red]error:[/] no run could be validated", highlight=False)
        raise typer.Exit(code=2)
    if output is OutputFormat.json:
        with user_errors():  # a non-finite number is an internal error (exit 3), never output
            write_text(render_json(validation_rows(results, components=True)))
    elif output is OutputFormat.csv:
        with user_errors():
            write_text(render_csv(validation_rows(results, components=False)))
    else:
        out.print(render_validation(results, components=components))


@validate_app.command("trace", short_help="A profiler trace beside the prediction of its job, per component.",
                      epilog=EXIT_CODES)
def trace_command(
    job_file: Annotated[Path, typer.Argument(metavar="JOB", help="The job file of the traced run.")],
    trace_dir: Annotated[Path, typer.Argument(
        metavar="TRACE_DIR", help="Its rank traces (rank*.json.gz), as `paraplan trace record` writes.")],
    cluster: Annotated[str | None, typer.Option(
        help="Predict on this cluster (a file, e.g. from `paraplan calibrate trace`, or a catalog name) "
             "instead of the job's.")] = None,
    output: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
    iteration: Annotated[str, typer.Option(help="fastest | median: the iteration compared.")] = "fastest",
    plot: Annotated[Path | None, typer.Option(help="Also draw the components' shares, measured beside predicted "
                                                   "(.png, .svg, .pdf).")] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing --plot file.")] = False,
) -> None:
    """Predict the job a profiler trace recorded; print, per pipeline stage, each component
    measured and predicted (compute by kernel class, exposed communication per dimension, idle)
    with its error, and the iteration's."""
    from paraplan.catalog import load_job
    from paraplan.files.pictures import check_plot_path
    from paraplan.report.formats import render_csv, render_json
    from paraplan.report.tracevalidation import (
        component_rows,
        render_trace_validation,
        render_trace_validation_plot,
        trace_validation_record,
    )
    from paraplan.specs import ConfigError, HeteroJob
    from paraplan.validate import validate_run
    from paraplan.validate.trace import load_trace_run

    with user_errors():
        if plot is not None:
            check_plot_path(plot, overwrite=force, flag="--force")  # before the work, not after
        job = load_job(job_file) if cluster is None else _job_on(job_file, cluster)
        if isinstance(job, HeteroJob):
            raise ConfigError(f"{job_file}: a heterogeneous cluster; validate trace takes one GPU type")
        measured, skipped = load_trace_run(job, trace_dir, iteration)
        result = validate_run(measured)
    for path, reason in skipped:
        err.print(f"[yellow]skipped:[/] {path}: {reason}", highlight=False, soft_wrap=True)
    for warning in result.warnings:  # the trace ran otherwise than the job says (JSON: "warnings")
        err.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    with user_errors():  # a non-finite number is an internal error (exit 3), never output
        if output is OutputFormat.json:
            write_text(render_json(trace_validation_record(result)))
        elif output is OutputFormat.csv:
            write_text(render_csv(component_rows(result)))
        else:
            out.print(render_trace_validation(result))
    if plot is not None:
        err.print(f"wrote {render_trace_validation_plot(result, plot)}", highlight=False)


def _job_on(job_file: Path, cluster: str):
    """The job of ``job_file`` on another cluster (a file relative to the working directory)."""
    from paraplan.catalog import resolve_job
    from paraplan.catalog.jobs import read_job_mapping

    raw = read_job_mapping(job_file)
    raw["cluster"] = str(Path(cluster).resolve()) if Path(cluster).is_file() else cluster
    return resolve_job(raw, base_dir=job_file.parent)
