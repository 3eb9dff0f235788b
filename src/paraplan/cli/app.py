"""The `paraplan` command."""

from __future__ import annotations

import typer

from paraplan.cli.calibrate import calibrate_app
from paraplan.cli.catalog import catalog_command
from paraplan.cli.common import HELP_SETTINGS
from paraplan.cli.export import export_command
from paraplan.cli.fit import fit_command
from paraplan.cli.predict import predict_command
from paraplan.cli.report import report_command
from paraplan.cli.samples import samples_app
from paraplan.cli.search import search_command
from paraplan.cli.sharding import sharding_command
from paraplan.cli.validate import validate_command

app = typer.Typer(
    name="paraplan",
    help="Predict LLM training iteration time, memory and cost for a parallel plan.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    **HELP_SETTINGS,
)
# The one-line summaries `paraplan --help` lists (each whole at 80 columns; the commands' own
# --help has their full text).
app.command("predict", short_help="Predict one iteration's time, breakdown, memory and cost.")(predict_command)
app.command("report", short_help="Write one HTML page of a prediction: pictures, tables, GEMMs.")(report_command)
app.command("catalog", short_help="List the catalog's GPUs, models or clusters.")(catalog_command)
app.command("validate", short_help="Predict measured runs; print the errors.")(validate_command)
app.add_typer(samples_app, name="samples", short_help="Import measured operator and collective timings.")
app.command("fit", short_help="Fit the learned backend's regressors to samples.")(fit_command)
app.add_typer(calibrate_app, name="calibrate", short_help="Fit efficiency curves and links to measurements.")
app.command("search", short_help="Search the parallel plans of a model on a cluster.")(search_command)
app.command("export", short_help="Write the launch recipe of a job's plan.")(export_command)
app.command("sharding", short_help="Plan the sharding of a JAX step function.")(sharding_command)


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
