"""`paraplan catalog gpus|models|clusters|frameworks`: what the shipped catalog knows."""

from __future__ import annotations

import enum
from typing import Annotated

import typer

from paraplan.cli.common import OutputFormat, out, user_errors, write_text


class Kind(str, enum.Enum):
    gpus = "gpus"
    models = "models"
    clusters = "clusters"
    frameworks = "frameworks"


def catalog_command(
    kind: Annotated[Kind, typer.Argument(help="gpus | models | clusters | frameworks")],
    output: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """List the catalog's GPUs, models or clusters with their key numbers, or its framework
    presets (``--framework``) with what each sets and the repositories its sources cite."""
    from paraplan.report.catalog import catalog_rows, render_catalog
    from paraplan.report.formats import render_csv, render_json

    rows = catalog_rows(kind.value)
    if output is OutputFormat.json:
        with user_errors():  # a non-finite number is an internal error (exit 3), never output
            write_text(render_json(rows))
    elif output is OutputFormat.csv:
        with user_errors():
            write_text(render_csv(rows))
    else:
        out.print(render_catalog(kind.value, rows))
