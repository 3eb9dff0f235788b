"""`paraplan predict`: one job in, iteration time / breakdown / memory / cost out."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from paraplan.cli.common import (
    JOB_FLAGS,
    Backend,
    Format,
    ModelsFile,
    OutputFormat,
    err,
    out,
    takes_flags,
    user_errors,
    write_text,
)
from paraplan.cli.loading import load_flagged_job, predict_flagged, prediction_data, runs_table

Opt = typer.Option


@takes_flags(JOB_FLAGS)
def predict_command(
    job_file: Annotated[Path | None, typer.Argument(help="Job file (YAML/JSON). Omit for the built-in demo job.")] = None,
    flags: dict[str, Any] | None = None,
    backend: Backend = "analytical",
    models: ModelsFile = None,
    output: Format = OutputFormat.table,
    explain: Annotated[bool, Opt("--explain", help="Also show the per-operator table of one layer.")] = False,
    plot: Annotated[list[Path] | None, Opt(
        help="Also draw a picture (.png/.svg/.pdf; repeatable): the kind the file name names "
        "(breakdown.png, run-timeline.svg, memory.pdf) or --plot-kind; a name with no kind "
        "(out.png) draws all three: out-breakdown.png, out-timeline.png, out-memory.png.")] = None,
    plot_kind: Annotated[str | None, Opt(help="breakdown | timeline | memory (for one --plot file).")] = None,
    force: Annotated[bool, Opt("--force", help="Replace existing --plot files.")] = False,
    interval: Annotated[float, Opt(
        "--interval", metavar="LEVEL",
        help="The level of the uncertainty interval on every time, rate and cost figure (0 < LEVEL < 1): "
        "split conformal on the measured errors of runs in the prediction's regime, widened for each "
        "setting the job left unstated.")] = 0.8,
    runs: Annotated[list[Path] | None, Opt(
        "--runs", help="Your measured runs (a file as `paraplan validate runs` reads; repeatable): their errors "
        "join the package's in their regimes for the interval (never the prediction).")] = None,
) -> None:
    """Predict one training iteration: time, breakdown, memory per GPU, MFU and cost."""
    from paraplan.report.formats import render_csv, render_json
    from paraplan.report.plots import check_plots, render_plot
    from paraplan.uncertainty import check_level

    with user_errors():
        check_level(interval)
        plots = check_plots(plot or [], plot_kind, overwrite=force)  # before the work, not after
        job, said = load_flagged_job(job_file, flags or {})
        pred, notes = predict_flagged(job, backend, models, keep_timeline=bool(plots))
        table, warnings = runs_table(runs, interval) if runs else (None, [])
        data, bounds = prediction_data(job, pred, interval, backend, models, table)
    for warning in warnings:
        err.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    for path, kind in plots:
        err.print(f"wrote {kind} picture to {render_plot(pred, kind, path, bounds)}", highlight=False)
    for note in ([said] if said else []) + [f"note: {n}" for n in notes]:
        err.print(note, highlight=False, soft_wrap=True)
    with user_errors():  # a non-finite number is an internal error (exit 3), never output
        if output is OutputFormat.json:
            if explain:
                from dataclasses import asdict

                data["layer_ops"] = [asdict(o) for o in pred.layer_ops]
                data["layer_collectives"] = [asdict(c) for c in pred.layer_collectives]
                data["stage_collectives"] = [asdict(c) for c in pred.stage_collectives]
            write_text(render_json(data))
        elif output is OutputFormat.csv:
            write_text(render_csv([{**pred.to_dict(), "interval": bounds.to_columns(pred)}]))
        else:
            from paraplan.report.tables import render_explain, render_prediction

            out.print(f"seq_length {pred.job.model.seq_length:,} tokens per sequence", highlight=False)
            out.print(render_prediction(pred, bounds))
            if explain:
                out.print(render_explain(pred))
