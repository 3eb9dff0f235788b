"""`paraplan fit SAMPLES... --out MODELS`: fit the learned backend's regressors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from paraplan.cli.common import OutputFormat, err, out, user_errors, write_text


def fit_command(
    samples_files: Annotated[list[Path], typer.Argument(
        help="Samples files (`paraplan samples import`, `paraplan profile ops`); several are read as one.")],
    out_file: Annotated[Path, typer.Option("--out", "-o", help="Models file to write.")],
    cluster_files: Annotated[list[Path] | None, typer.Option(
        "--cluster", help="Cluster file whose GPU (and cluster) samples name but the catalog lacks "
        "(e.g. examples/tiny-cpu/cluster.yaml for cpu-core; repeatable).")] = None,
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
    import paraplan.costmodel.fitting as fitting
    from paraplan.catalog.jobs import load_cluster_file
    from paraplan.cli.progress import StagedProgress
    from paraplan.files.atomic import check_output_path
    from paraplan.files.pictures import check_plot_path
    from paraplan.regress.select import MIN_DISTINCT_SAMPLES
    from paraplan.regress.store import save_models
    from paraplan.report.fitting import fit_rows, render_fit, render_learning_curves
    from paraplan.samples.merge import load_many
    from paraplan.specs import ConfigError

    budget = "quick" if quick else "default"
    with user_errors():
        hardware = fitting.Hardware.of(load_cluster_file(p) for p in cluster_files or [])
        samples_file = ", ".join(map(str, samples_files))
        # Every output path is checked before minutes of fitting, not after.
        check_output_path(out_file, overwrite=force, flag="--force")
        if learning_curves is not None:
            check_plot_path(learning_curves, overwrite=force, flag="--force")
            if learning_curves.resolve() == out_file.resolve():
                raise ConfigError(f"{learning_curves}: --learning-curves and --out name the same file")
        # One bar over every stage, its work in rough seconds (paraplan.costmodel.fitting), so the ETA
        # holds from the first stage to the last.
        with StagedProgress(err, "reading samples") as bar:
            bar.add_work(fitting.READ_WORK)
            samples = load_many(samples_files)
            bar.advance(fitting.READ_WORK)
            # the whole run's work as the table foretells it: an ETA from the first stage on
            n_rows = fitting.fitted_rows(samples)
            planned = fitting.work_plan(fitting.regressor_sizes(samples), budget, curves=learning_curves is not None)
            bar.add_work(n_rows * fitting.FEATURE_WORK_PER_ROW + planned.total)
            bar.stage(f"features of {n_rows:,} samples")
            tasks = fitting.fit_tasks(samples, progress=lambda n: bar.advance(n * fitting.FEATURE_WORK_PER_ROW),
                                      hardware=hardware)
            tasks, too_few = fitting.fittable(tasks)
            for key, distinct in too_few.items():
                err.print(f"[yellow]kept analytical:[/] {key}: {distinct} distinct samples (a regressor "
                          f"needs {MIN_DISTINCT_SAMPLES})", highlight=False, soft_wrap=True)
            if not tasks:
                raise ConfigError(f"{samples_file}: no operator or collective samples to fit"
                                  + (f" (every regressor has fewer than {MIN_DISTINCT_SAMPLES} distinct samples)"
                                     if too_few else ""))
            work = fitting.work_plan(fitting.task_sizes(tasks), budget, curves=learning_curves is not None)
            bar.add_work(work.total - planned.total)
            order = {t.key: i for i, t in enumerate(tasks, 1)}
            current: list[str] = []

            def starting(what: str) -> Callable[[str], None]:
                def start(key: str) -> None:
                    current[:] = [key]
                    bar.stage(f"{what} {order[key]}/{len(tasks)}: {_short(key)}")

                return start

            models = fitting.fit_models(tasks, budget=budget, random_state=seed, progress=starting("fitting"),
                                        done=lambda: bar.advance(work.fit[current[0]]))
            bar.stage("saving the models")
            save_models(out_file, models, fitting.training_metadata(samples_file, samples, budget, seed, hardware),
                        overwrite=force)
            bar.advance(work.save)
            curves = None
            if learning_curves is not None:
                curves = fitting.learning_curves_for(tasks, models, random_state=seed,
                                                     progress=starting("curves"),
                                                     done=lambda: bar.advance(work.curves[current[0]]))
                bar.stage("plotting curves")
                from paraplan.report.learning_curves import plot_learning_curves

                plot_learning_curves(curves, learning_curves)
                bar.advance(work.plot)
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


def _short(key: str) -> str:
    """A regressor's key without its GPU or cluster: ``linear1/fwd``, ``all_reduce/inter``."""
    return "/".join(key.split("/")[-2:])
