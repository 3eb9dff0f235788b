"""The `paraplan` command."""

from __future__ import annotations

import typer

from paraplan.cli.catalog import catalog_command
from paraplan.cli.predict import predict_command
from paraplan.cli.validate import validate_command

app = typer.Typer(
    name="paraplan",
    help="Predict LLM training iteration time, memory and cost for a parallel plan.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("predict")(predict_command)
app.command("catalog")(catalog_command)
app.command("validate")(validate_command)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
) -> None:
    if version:
        from paraplan import __version__

        typer.echo(f"paraplan {__version__}")
        raise typer.Exit()


def main() -> None:
    app()
