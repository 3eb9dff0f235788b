"""`paraplan report JOB -o report.html`: one prediction as one self-contained HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from paraplan.cli.common import err, user_errors

Opt = typer.Option


def report_command(
    job_file: Annotated[Path | None, typer.Argument(help="Job file (YAML/JSON). Omit for the built-in demo job.")] = None,
    out_file: Annotated[Path, Opt("--out", "-o", help="HTML file to write.")] = Path("report.html"),
    gemms: Annotated[Path | None, Opt(help="Also write one layer's GEMM shapes per pass (M, K, N) to this .csv.")] = None,
    backend: Annotated[str, Opt(help="Cost model: analytical | learned (needs --models).")] = "analytical",
    models: Annotated[Path | None, Opt(help="Models file from `paraplan fit` (learned backend).")] = None,
    force: Annotated[bool, Opt("--force", help="Replace existing output files.")] = False,
) -> None:
    """Write one HTML page with the summary, the breakdown per stage, the pipeline timeline,
    memory per stage, the operators of one layer and its GEMMs (pictures inlined; needs the
    plot extra)."""
    from paraplan.catalog.jobs import demo_job_mapping, read_job_file, resolve_job
    from paraplan.prediction import predict
    from paraplan.prediction.backends import BACKENDS, load_model_file, make_cost_model
    from paraplan.regress.plot import load_pyplot
    from paraplan.report.gemms import render_gemms_csv
    from paraplan.report.html import render_html
    from paraplan.specs import ConfigError, HeteroJob

    with user_errors():
        # every output is checked before predicting, not after
        _check_out(out_file, ".html", force, "report file")
        if gemms is not None:
            _check_out(gemms, ".csv", force, "GEMM file")
            if gemms.resolve() == out_file.resolve():
                raise ConfigError(f"{gemms}: --gemms and --out name the same file")
        load_pyplot()
        if backend not in BACKENDS:
            raise ConfigError(f"backend: unknown backend {backend!r} (available: {', '.join(BACKENDS)})")
        raw = read_job_file(job_file) if job_file is not None else demo_job_mapping()
        job = resolve_job(raw, base_dir=job_file.parent if job_file is not None else Path("."))
        if isinstance(job, HeteroJob):
            if backend != "analytical" or models is not None:
                raise ConfigError("backend: a cluster with node groups of different GPUs is predicted analytically")
            from paraplan.prediction.hetero import predict_hetero

            pred = predict_hetero(job, keep_timeline=True)
        else:
            fitted = load_model_file(models) if models is not None else None
            pred = predict(job, make_cost_model(job, backend, fitted), keep_timeline=True)
    out_file.write_text(render_html(pred), encoding="utf-8")
    err.print(f"wrote {out_file}", highlight=False)
    if gemms is not None:
        gemms.write_text(render_gemms_csv(pred), encoding="utf-8")
        err.print(f"wrote {gemms}", highlight=False)


def _check_out(path: Path, suffix: str, force: bool, what: str) -> None:
    from paraplan.regress.store import check_output_path
    from paraplan.specs import ConfigError

    if path.suffix.lower() != suffix:
        raise ConfigError(f"{path}: a {what} name ends in {suffix}")
    check_output_path(path, overwrite=force, flag="--force", what=what)
