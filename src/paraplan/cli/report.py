"""`paraplan report JOB -o report.html`: one prediction as one self-contained HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from paraplan.cli.common import JOB_FLAGS, Backend, ModelsFile, err, takes_flags, user_errors
from paraplan.cli.loading import interval_of, load_flagged_job, predict_flagged

Opt = typer.Option


@takes_flags(JOB_FLAGS)
def report_command(
    job_file: Annotated[Path | None, typer.Argument(help="Job file (YAML/JSON). Omit for the built-in demo job.")] = None,
    flags: dict[str, Any] | None = None,
    out_file: Annotated[Path, Opt("--out", "-o", help="HTML file to write.")] = Path("report.html"),
    gemms: Annotated[Path | None, Opt(help="Also write one layer's GEMM shapes per pass (M, K, N) to this .csv.")] = None,
    backend: Backend = "analytical",
    models: ModelsFile = None,
    force: Annotated[bool, Opt("--force", help="Replace existing output files.")] = False,
    interval: Annotated[float, Opt(
        "--interval", metavar="LEVEL", help="The level of the uncertainty interval on every time, rate and cost "
        "figure (0 < LEVEL < 1), as predict's.")] = 0.8,
) -> None:
    """Write one HTML page with the summary, the breakdown per stage, the pipeline timeline,
    memory per stage, the operators of one layer and its GEMMs (pictures inlined; needs the
    plot extra). The job flags are predict's."""
    from paraplan.files.pictures import load_pyplot
    from paraplan.report.gemms import render_gemms_csv
    from paraplan.report.html import render_html
    from paraplan.specs import ConfigError
    from paraplan.uncertainty import check_level

    with user_errors():
        check_level(interval)
        # every output is checked before predicting, not after
        _check_out(out_file, ".html", force, "report file")
        if gemms is not None:
            _check_out(gemms, ".csv", force, "GEMM file")
            if gemms.resolve() == out_file.resolve():
                raise ConfigError(f"{gemms}: --gemms and --out name the same file")
        load_pyplot()
        job, said = load_flagged_job(job_file, flags or {})
        pred, notes = predict_flagged(job, backend, models, keep_timeline=True)
        bounds = interval_of(job, pred, interval, backend, models)
    for note in ([said] if said else []) + [f"note: {n}" for n in notes]:
        err.print(note, highlight=False, soft_wrap=True)
    out_file.write_text(render_html(pred, bounds), encoding="utf-8")
    err.print(f"wrote {out_file}", highlight=False)
    if gemms is not None:
        gemms.write_text(render_gemms_csv(pred), encoding="utf-8")
        err.print(f"wrote {gemms}", highlight=False)


def _check_out(path: Path, suffix: str, force: bool, what: str) -> None:
    from paraplan.files.atomic import check_output_path
    from paraplan.specs import ConfigError

    if path.suffix.lower() != suffix:
        raise ConfigError(f"{path}: a {what} name ends in {suffix}")
    check_output_path(path, overwrite=force, flag="--force", what=what)
