"""`paraplan fit SAMPLES --out MODELS`: fit the learned backend's regressors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from paraplan.cli.common import OutputFormat, err, out, user_errors, write_text


def fit_command(
    samples_file: Annotated[Path, typer.Argument(help="Samples file from `paraplan samples import`.")],
    out_file: Annotated[Path, typer.Option("--out", "-o", help="Models file to write.")],
    quick: Annotated[bool, typer.Option("--quick", help="Tiny tuning grid: seconds, for tests and previews.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing models file.")] = False,
    learning_curves: Annotated[
        Path | None,
        typer.Option(help="Also write learning curves (10/25/50/100 % of samples) to this .png, .svg or .pdf."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the hold-out split and the regressors.")] = 0,
    output: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Fit one residual regressor per (GPU, operator, direction) and (cluster, collective);
    print each one's cross-validated and held-out error next to the analytical baseline's."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from paraplan.fitting import fit_models, fit_tasks, learning_curves_for, training_metadata
    from paraplan.regress.plot import check_plot_path
    from paraplan.regress.store import check_output_path, save_models
    from paraplan.report.fitting import fit_rows, render_fit, render_learning_curves
    from paraplan.samples import load_samples
    from paraplan.specs import ConfigError

    budget = "quick" if quick else "default"
    with user_errors():
        # Every output path is checked before minutes of fitting, not after.
        check_output_path(out_file, overwrite=force, flag="--force")
        if learning_curves is not None:
            check_plot_path(learning_curves, overwrite=force, flag="--force")
            if learning_curves.resolve() == out_file.resolve():
                raise ConfigError(f"{learning_curves}: --learning-curves and --out name the same file")
        samples = load_samples(samples_file)
        tasks = fit_tasks(samples)
        if not tasks:
            raise ConfigError(f"{samples_file}: no operator or collective samples to fit")
        with Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(), console=err, transient=True,
        ) as bar:
            job = bar.add_task("fitting", total=len(tasks))

            def advance(key: str) -> None:
                bar.update(job, description=f"fitting {key}")

            models = fit_models(tasks, budget=budget, random_state=seed, progress=advance, done=lambda: bar.advance(job))
        save_models(out_file, models, training_metadata(samples_file, samples, budget, seed), overwrite=force)
        curves = None
        if learning_curves is not None:
            curves = learning_curves_for(tasks, models, random_state=seed)
            from paraplan.regress.plot import plot_learning_curves

            plot_learning_curves(curves, learning_curves)
    rows = fit_rows(models)
    if output is OutputFormat.json:
        from paraplan.report.formats import render_json

        with user_errors():  # a non-finite number is an internal error (exit 3), never output
            write_text(render_json({"models": rows, "learning_curves": curves}))
    elif output is OutputFormat.csv:
        from paraplan.report.formats import render_csv

        with user_errors():
            write_text(render_csv(rows))
    else:
        out.print(render_fit(rows, out_file))
        if curves is not None:
            out.print(render_learning_curves(curves))
