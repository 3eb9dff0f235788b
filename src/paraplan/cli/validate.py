"""`paraplan validate RUNS.json...`: predict measured runs and print the error tables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from paraplan.cli.common import OutputFormat, err, out, user_errors, write_text


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
