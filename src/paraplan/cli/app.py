"""The `paraplan` command."""

from __future__ import annotations

import typer

from paraplan.cli.calibrate import calibrate_app
from paraplan.cli.catalog import catalog_command
from paraplan.cli.export import export_command
from paraplan.cli.fit import fit_command
from paraplan.cli.predict import predict_command
from paraplan.cli.report import report_command
from paraplan.cli.samples import samples_app
from paraplan.cli.search import search_command
from paraplan.cli.sharding import sharding_command
from paraplan.cli.trace import trace_app
from paraplan.cli.validate import validate_command

app = typer.Typer(
    name="paraplan",
    help="Predict LLM training iteration time, memory and cost for a parallel plan.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("predict")(predict_command)
app.command("report")(report_command)
app.command("catalog")(catalog_command)
app.command("validate")(validate_command)
app.add_typer(samples_app, name="samples")
app.command("fit")(fit_command)
app.add_typer(calibrate_app, name="calibrate")
app.command("search")(search_command)
app.command("export")(export_command)
app.command("sharding")(sharding_command)
app.add_typer(trace_app, name="trace")


def _print_version(value: bool) -> None:
    if value:
        from paraplan import __version__

        typer.echo(f"paraplan {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", help="Print the version and exit.", callback=_print_version, is_eager=True
    ),
) -> None:
    """Predict LLM training iteration time, memory and cost for a parallel plan."""


def main() -> None:
    app()
