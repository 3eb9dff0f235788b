"""`paraplan samples import gpumodeling DIR... --out FILE`: measured timings -> one samples file."""

from __future__ import annotations

import contextlib
import enum
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from paraplan.cli.common import HELP_SETTINGS, err, out, user_errors, write_text
from paraplan.specs import ConfigError

samples_app = typer.Typer(
    name="samples",
    help="Sample records: measured operator and collective timings for the learned backend.",
    no_args_is_help=True,
    **HELP_SETTINGS,
)
import_app = typer.Typer(help="Import timings measured by another tool.", no_args_is_help=True, **HELP_SETTINGS)
samples_app.add_typer(import_app, name="import")


class SummaryFormat(str, enum.Enum):
    table = "table"
    json = "json"


@contextlib.contextmanager
def _progress(total: int, delay_s: float = 1.0) -> Iterator[Callable[[Path], None]]:
    """A per-file callback that shows a progress bar on stderr once ``delay_s`` has passed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    start, done = time.perf_counter(), 0
    bar: Progress | None = None
    task = None

    def advance(path: Path) -> None:
        nonlocal done, bar, task
        done += 1
        if bar is None and time.perf_counter() - start > delay_s:
            bar = Progress(
                TextColumn("importing"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=err,
                transient=True,
            )
            bar.start()
            task = bar.add_task("", total=total, completed=done - 1)
        if bar is not None and task is not None:
            bar.update(task, advance=1, description=path.name)

    try:
        yield advance
    finally:
        if bar is not None:
            bar.stop()


def _tables(summary: dict[str, Any], out_file: Path, seconds: float) -> list[Any]:
    """Records kept (one row per operator/collective and phase, one column per device) and
    records excluded (per folder and reason)."""
    from paraplan.report.layout import ReadableTable

    devices = sorted({r["device"] for r in summary["kept"]})
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for r in summary["kept"]:
        label = r["name"] + (f" [{r['variant']}]" if r["variant"] else "")
        counts.setdefault((label, r["phase"]), {})[r["device"]] = r["records"]
    kept = ReadableTable(f"Records kept ({summary['records']})")
    kept.add_column("operator / collective [variant]", wrap=True)
    kept.add_column("phase")
    for device in devices:
        kept.add_column(device, number=True)
    for (label, phase), per_device in counts.items():
        kept.add_row(label, phase, *(str(per_device.get(d, "-")) for d in devices))
    excluded = ReadableTable(f"Records excluded ({sum(summary['excluded_total'].values())})")
    excluded.add_column("folder")
    excluded.add_column("reason", wrap=True)
    excluded.add_column("records", number=True)
    for r in summary["excluded"]:
        excluded.add_row(r["folder"], r["reason"], str(r["records"]))
    dup = sum(summary["duplicates"].values())
    footer = f"wrote {summary['records']} records to {out_file} in {seconds:.1f} s"
    if dup:
        footer += f"; {dup} grid points measured more than once were kept"
    return [kept, excluded, footer]


@import_app.command("gpumodeling", short_help="Import GPUModeling25 operator and NCCL timings.")
def import_gpumodeling_command(
    dirs: Annotated[
        list[Path],
        typer.Argument(help="GPUModeling25 CSV folders (operators_* and/or nccl_*).", show_default=False),
    ],
    out_file: Annotated[Path, typer.Option("--out", "-o", help="The samples file to write (Parquet).")],
    force: Annotated[bool, typer.Option("--force", help="Replace --out when it exists.")] = False,
    output: Annotated[SummaryFormat, typer.Option("--format", "-f")] = SummaryFormat.table,
) -> None:
    """Import GPUModeling25 operator and NCCL timings into one samples file.

    Rows that break a data-quality rule are excluded and counted per reason (docs/samples.md).
    """
    t0 = time.perf_counter()
    with user_errors():
        from paraplan.samples.store import check_samples_path

        # the checks save_samples makes, before the import rather than after it
        check_samples_path(out_file, overwrite=force, flag="--force")
        try:
            from paraplan.samples.gpumodeling import gpumodeling_files, import_gpumodeling, summarize_import
            from paraplan.samples.store import save_samples
        except ImportError as exc:
            raise ConfigError(
                f"samples need pandas and pyarrow ({exc}); pip install 'paraplan[learned]'"
            ) from None
        files = gpumodeling_files(dirs)
        with _progress(len(files)) as advance:
            result = import_gpumodeling(dirs, progress=advance)
        save_samples(result.samples, out_file, result.metadata(), overwrite=force)
        summary = summarize_import(result)
    seconds = time.perf_counter() - t0
    if output is SummaryFormat.json:
        write_text(json.dumps({"out": str(out_file), "seconds": round(seconds, 3), **summary}, indent=2))
    else:
        for part in _tables(summary, out_file, seconds):
            out.print(part)
