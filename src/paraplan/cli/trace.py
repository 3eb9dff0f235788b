"""`paraplan trace summarize DIR|FILES` and `paraplan trace record`: read profiler traces."""

from __future__ import annotations

import enum
import io
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from paraplan.cli.common import EXIT_CODES, HELP_SETTINGS, err, out, user_errors, write_text
from paraplan.specs import ConfigError

trace_app = typer.Typer(
    name="trace",
    help="Read PyTorch profiler (Kineto) traces: iterations, components, communication.",
    no_args_is_help=True,
    **HELP_SETTINGS,
)


class TraceFormat(str, enum.Enum):
    table = "table"
    json = "json"


@trace_app.command("summarize", short_help="Iterations, their noise, and where each rank's time went.",
                   epilog=EXIT_CODES)
def summarize_command(
    paths: Annotated[list[Path], typer.Argument(help="A directory of rank traces, or trace files (.json, .json.gz).")],
    output: Annotated[TraceFormat, typer.Option("--format", "-f")] = TraceFormat.table,
    to: Annotated[Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
    force: Annotated[bool, typer.Option(help="Write over an existing --output.")] = False,
) -> None:
    """Iterations, their time statistics and noise, and per rank where the time went: compute by
    class, communication by parallel dimension (exposed and overlapped), idle."""
    from paraplan.report.formats import render_json
    from paraplan.report.traces import render_trace_summary, trace_record
    from paraplan.traces.summary import summarize

    with user_errors():
        if to is not None and to.exists() and not force:
            raise ConfigError(f"{to}: exists (use --force to write over it)")
        summary = summarize(paths)
    for path, reason in summary.skipped:
        err.print(f"[yellow]skipped:[/] {path}: {reason}", highlight=False, soft_wrap=True)
    if to is None:
        if output is TraceFormat.json:
            write_text(render_json(trace_record(summary)))
        else:
            out.print(render_trace_summary(summary))
        return
    if output is TraceFormat.json:
        text = render_json(trace_record(summary)) + "\n"
    else:
        from rich.console import Console

        console = Console(width=80, soft_wrap=False, record=True, file=io.StringIO())
        console.print(render_trace_summary(summary))
        text = console.export_text()
    _write_atomically(to, text)


def _write_atomically(target: Path, text: str) -> None:
    """A reader never sees half a file: write beside it, then rename over it."""
    from paraplan.files.atomic import sweep_stale, temp_path

    sweep_stale(target)
    tmp = temp_path(target)
    try:
        tmp.write_text(text)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


@trace_app.command("record", short_help="Record traces of a tiny GPT trained on the CPU.", epilog=EXIT_CODES)
def record_command(
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for rank*.json.gz and timers.json.")],
    mode: Annotated[str, typer.Option(help="ddp | fsdp | pipeline")] = "ddp",
    nproc: Annotated[int, typer.Option(help="Processes (gloo, on the CPU).")] = 2,
    active: Annotated[int, typer.Option(help="Profiled iterations.")] = 5,
    layers: Annotated[int, typer.Option(help="Transformer layers of the tiny GPT (examples/tiny-cpu describes 2).")] = 2,
    hidden: Annotated[int, typer.Option(help="Hidden size.")] = 64,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = 4,
    seq: Annotated[int, typer.Option(help="Sequence length.")] = 64,
    micro_batch: Annotated[int, typer.Option(help="Micro-batch size (per rank).")] = 4,
    profile: Annotated[bool, typer.Option(help="Profile (traces); --no-profile only times the iterations.")] = True,
    force: Annotated[bool, typer.Option(help="Write over a non-empty --out.")] = False,
) -> None:
    """Train a tiny GPT on the CPU over a few processes and record a profiler trace per rank
    (needs torch: pip install 'paraplan[profile]')."""
    from paraplan.traces.tinyrun import TinyRunCrashed, record_run

    with user_errors():
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ConfigError("trace record: needs torch (pip install 'paraplan[profile]')") from None
        model = {"hidden_size": hidden, "num_attention_heads": heads, "seq_length": seq, "micro_batch_size": micro_batch}
        try:
            done = record_run(mode, out_dir, nproc=nproc, active=active, num_layers=layers, force=force,
                              profile=profile, model=model)
        except TinyRunCrashed as crash:  # not bad input: one line, exit code 1
            err.print(f"[bold red]error:[/] {escape(str(crash))}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=1) from None
    err.print(f"wrote {done}/rank*.json.gz and {done}/timers.json" if profile else f"wrote {done}/timers.json",
              highlight=False)
