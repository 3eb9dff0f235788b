"""The `paraplan` command."""

from __future__ import annotations

import sys

import typer
from typer.exceptions import TyperException

from paraplan.cli.calibrate import calibrate_app
from paraplan.cli.catalog import catalog_command
from paraplan.cli.common import EXIT_CODES, HELP_SETTINGS, usage_error
from paraplan.cli.compare import compare_command
from paraplan.cli.export import export_command
from paraplan.cli.fit import fit_command
from paraplan.cli.inventory import inventory_app
from paraplan.cli.predict import predict_command
from paraplan.cli.profile import profile_app
from paraplan.cli.report import report_command
from paraplan.cli.samples import samples_app
from paraplan.cli.search import search_command
from paraplan.cli.serve import serve_command
from paraplan.cli.sharding import sharding_command
from paraplan.cli.trace import trace_app
from paraplan.cli.validate import validate_app
from paraplan.specs.extras import missing_extra_message

app = typer.Typer(
    name="paraplan",
    help="Predict LLM training iteration time, memory and cost for a parallel plan.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    **HELP_SETTINGS,
)
# The one-line summaries `paraplan --help` lists (each whole at 80 columns; the commands' own
# --help has their full text, then the exit codes).
for _name, _command, _summary in (
    ("predict", predict_command, "Predict one iteration's time, breakdown, memory and cost."),
    ("compare", compare_command, "Predict two jobs or plans side by side, with B - A."),
    ("report", report_command, "Write one HTML page of a prediction: pictures, tables, GEMMs."),
    ("catalog", catalog_command, "List the catalog's GPUs, models, clusters or framework presets."),
    ("fit", fit_command, "Fit the learned backend's regressors to samples."),
    ("search", search_command, "Search the parallel plans of a model on a cluster."),
    ("export", export_command, "Write the launch recipe of a job's plan."),
    ("sharding", sharding_command, "Plan the sharding of a JAX step function."),
    ("serve", serve_command, "Serve a local web page to predict, search and compare plans."),
):
    app.command(_name, short_help=_summary, epilog=EXIT_CODES)(_command)
# groups (Typer lists them after the commands)
app.add_typer(samples_app, name="samples", short_help="Import measured operator and collective timings.",
              epilog=EXIT_CODES)
app.add_typer(calibrate_app, name="calibrate", short_help="Fit efficiency curves and links to measurements.",
              epilog=EXIT_CODES)
app.add_typer(validate_app, name="validate", short_help="Predict measured runs or a traced job; print the errors.",
              epilog=EXIT_CODES)
app.add_typer(profile_app, name="profile", short_help="Time operators and collectives on your hardware into samples.",
              epilog=EXIT_CODES)
app.add_typer(inventory_app, name="inventory", short_help="Trace a Hugging Face model's operators from its code.",
              epilog=EXIT_CODES)
app.add_typer(trace_app, name="trace", short_help="Read PyTorch profiler traces: iterations, components.",
              epilog=EXIT_CODES)


def _print_version(value: bool) -> None:
    if value:
        from paraplan._version import __version__

        typer.echo(f"paraplan {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", help="Print the version and exit.", callback=_print_version, is_eager=True
    ),
) -> None:
    """Predict LLM training iteration time, memory and cost for a parallel plan."""


def main(argv: list[str] | None = None) -> None:
    """The ``paraplan`` script. A command line click refuses (a value of the wrong type, an
    unknown option, a missing value) ends, like paraplan's own errors, in one line naming the
    flag and the reason with exit code 2, instead of click's usage box."""
    try:
        code = app(args=argv, prog_name="paraplan", standalone_mode=False)
    except TyperException as exc:  # click's exceptions (typer vendors click) but Exit and Abort
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if not message.strip():  # no arguments: the help is on the screen already
            sys.exit(getattr(exc, "exit_code", 2))
        message = message.replace("Value error, ", "")
        ctx = getattr(exc, "ctx", None)
        usage_error(f"{message} (see {ctx.command_path} --help)" if ctx is not None else message)
    except typer.Abort:
        sys.exit(130)
    except ModuleNotFoundError as exc:  # an optional module imported outside a command's user_errors
        message = missing_extra_message(exc)
        if message is None:
            raise
        usage_error(message)
    sys.exit(code if isinstance(code, int) else 0)
