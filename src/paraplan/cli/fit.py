"""`paraplan fit SAMPLES... --out MODELS`: fit the learned backend's regressors."""

from __future__ import annotations

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
    from paraplan.cli.progress import StagedProgress
    from paraplan.costmodel.fit_request import FitRequest
    from paraplan.costmodel.fitting import PLOT_WORK
    from paraplan.regress.select import MIN_DISTINCT_SAMPLES
    from paraplan.report.fitting import fit_rows, render_fit, render_learning_curves
    from paraplan.samples.merge import load_many

    def kept_analytical(key: str, distinct: int) -> None:
        err.print(f"[yellow]kept analytical:[/] {key}: {distinct} distinct samples (a regressor "
                  f"needs {MIN_DISTINCT_SAMPLES})", highlight=False, soft_wrap=True)

    with user_errors():
        request = FitRequest.from_flags(samples_files, out_file=out_file, cluster_files=cluster_files, quick=quick,
                                        force=force, learning_curves=learning_curves, seed=seed)
        # one bar over every stage, its ETA from the first stage to the last
        with StagedProgress(err, "reading samples") as bar:
            result = request.run(load_many, progress=bar, kept_analytical=kept_analytical)
            models, curves = result.models, result.curves
            if curves is not None and learning_curves is not None:
                bar.stage("plotting curves")
                from paraplan.report.learning_curves import plot_learning_curves

                plot_learning_curves(curves, learning_curves)
                bar.advance(PLOT_WORK)
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

