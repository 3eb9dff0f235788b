"""`paraplan export`: a job's plan as a launch recipe (Megatron-LM, DeepSpeed, torchtitan, SLURM)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from paraplan.cli.common import err, user_errors, write_text

Opt = typer.Option


def export_command(
    target: Annotated[str, typer.Argument(help="megatron | deepspeed | torchtitan | slurm")],
    job_file: Annotated[Path, typer.Argument(help="Job file (YAML/JSON) holding the plan to launch.")],
    out: Annotated[Path | None, Opt("--out", "-o", help="Write here instead of stdout (torchtitan: a module "
                                    "name such as paraplan_job.py, for --module).")] = None,
    force: Annotated[bool, Opt("--force", help="Overwrite --out if it exists.")] = False,
) -> None:
    """Write the launch recipe for a job's plan; what the target cannot express is noted on stderr."""
    from paraplan.catalog import load_job
    from paraplan.export import TARGETS, export_notes, render
    from paraplan.prediction.entry import predict_any
    from paraplan.specs import ConfigError

    with user_errors():
        render_target = target.lower()
        if render_target not in TARGETS:
            raise ConfigError(f"target: unknown export target {target!r} (one of: {', '.join(TARGETS)})")
        if out is not None and out.exists() and not force:
            raise ConfigError(f"out: {out} already exists; pass --force to overwrite it")
        job = load_job(job_file)
        prediction = predict_any(job)
        job = prediction.job  # node groups: the same arguments on every node, in node order
        text = render(render_target, job, prediction)
        notes = export_notes(render_target, job, prediction)
        if out is not None:
            try:
                with out.open("w" if force else "x", encoding="utf-8") as handle:
                    handle.write(text)
            except FileExistsError:
                raise ConfigError(f"out: {out} already exists; pass --force to overwrite it") from None
            except OSError as exc:
                raise ConfigError(f"out: cannot write {out} ({exc.strerror})") from None
    if out is None:
        write_text(text)
    else:
        err.print(f"wrote {out}", highlight=False, markup=False)
    for note in notes:
        err.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
