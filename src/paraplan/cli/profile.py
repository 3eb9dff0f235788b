"""`paraplan profile ops`: time operators on this machine into a samples file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from paraplan.cli.common import EXIT_CODES, HELP_SETTINGS, OutputFormat, err, out, user_errors, write_text
from paraplan.cli.profile_comm import comm_command
from paraplan.specs import ConfigError

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
    job_file: Annotated[Path | None, typer.Option("--for", help="Sample the shapes this job and its "
                                                  "neighbour plans (tp, micro-batch x2, /2) need.")] = None,
    neighbours: Annotated[bool, typer.Option(help="With --for: also the neighbour plans.")] = True,
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")] = "cpu",
    dtype: Annotated[list[str] | None, typer.Option("--dtype", help="fp32, fp16, bf16, fp8 (repeatable; "
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
    from paraplan.profile.grid import grid_for_job, load_grid, split
    from paraplan.report.profile import render_sweep, sweep_record
    from paraplan.samples.store import check_samples_path

    with user_errors():
        check_samples_path(out_file, overwrite=force, flag="--force")
        if not grid and job_file is None:
            raise ConfigError("give --grid FILE or --for JOB (the shapes to sample)")
        points, job_dtype = [], None
        if grid:
            points += load_grid(grid)
        if job_file is not None:
            from paraplan.catalog.jobs import load_job

            job = load_job(job_file)
            if not hasattr(job, "parallel"):
                raise ConfigError(f"{job_file}: --for takes a job of one GPU type")
            points += grid_for_job(job, neighbours=neighbours)
            job_dtype = job.precision.value
        points = split(list(dict.fromkeys(points)), parts, part)
        settings = ops.SweepSettings(device=device, device_name=device_name or ops.default_device_name(device),
                                     dtypes=tuple(dict.fromkeys(dtype or [job_dtype or "fp32"])), threads=threads)
        info = ops.device_info(device)
        header = ops.sweep_header(points, settings, info, (parts, part))
        with records.RecordStore(records.journal_path(out_file), header) as store:
            todo = ops.pending(points, settings, store)
            with StagedProgress(err, f"{todo} points to measure") as bar:
                bar.add_work(todo)
                result = ops.run_sweep(points, settings, store,
                                       progress=lambda key, outcome: (bar.stage(key), bar.advance(1)))
            grid_name = ", ".join(str(g) for g in grid or []) + (f" --for {job_file}" if job_file else "")
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


profile_app.command("comm", short_help="Time collectives over a size sweep (here, torchrun or SLURM).",
                    epilog=EXIT_CODES)(comm_command)
