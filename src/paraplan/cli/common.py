"""What every command shares: output consoles, formats, and turning bad input into exit 2."""

from __future__ import annotations

import contextlib
import enum
import sys
from collections.abc import Iterator
from typing import Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from paraplan.specs import ConfigError, InternalError, format_validation_error
from paraplan.specs.extras import missing_extra_message
from paraplan.units import UnitError

# --help as click prints it: option names whole at any width (rich's help panels cut long option
# names to "…" at 80 columns) and boolean flags as --flag or --flag / --no-flag, never "<bool>".
# Every Typer app of the command passes these.
HELP_SETTINGS: dict[str, Any] = {"rich_markup_mode": None}

# every command's --help ends with this; the README's table says the same
EXIT_CODES = ("Exit codes: 0 an answer; 1 a valid question with no answer (search, sharding: no plan fits "
              "or meets the bounds; the nearest plan is named); 2 bad input (one line naming the field); "
              "3 internal error (an impossible result: a bug to report).")

out = Console(soft_wrap=False)
err = Console(stderr=True)


class OutputFormat(str, enum.Enum):
    table = "table"
    json = "json"
    csv = "csv"


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Bad input ends with one line on stderr naming the field and the reason, exit code 2;
    an impossible prediction (a bug) with one line and exit code 3; an optional module that is
    not installed, with one line naming the extra that installs it, exit code 2."""
    try:
        yield
    except ModuleNotFoundError as exc:
        message = missing_extra_message(exc)
        if message is None:
            raise
        _fail(message)
    except InternalError as exc:
        err.print(f"[bold red]{escape(str(exc))}[/]", highlight=False, soft_wrap=True)
        raise typer.Exit(code=3) from None
    except ConfigError as exc:
        _fail(str(exc))
    except ValidationError as exc:
        _fail(format_validation_error(exc))
    except UnitError as exc:
        _fail(str(exc))


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


def usage_error(message: str) -> None:
    """A command line click refused: one line on stderr, exit code 2 (outside a command, so
    by ``sys.exit`` rather than ``typer.Exit``)."""
    err.print(f"[bold red]error:[/] {escape(' '.join(message.split()))}", highlight=False, soft_wrap=True)
    sys.exit(2)


def write_text(text: str) -> None:
    """Machine-readable output goes to stdout untouched by rich."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
