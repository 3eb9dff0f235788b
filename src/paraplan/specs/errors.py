"""One-line configuration errors that name the field and the reason."""

from __future__ import annotations

import re
import reprlib

from pydantic import ValidationError

# Messages raised by paraplan's own validators start with the full field path ("parallel.tp: ").
_OWN_MESSAGE = re.compile(r"^[A-Za-z_][\w.]*: ")


#: The most characters of a user's value an error message echoes.
MAX_ECHO = 60

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 2, 4, 4, 3, 4
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = MAX_ECHO, MAX_ECHO, MAX_ECHO


def short_repr(value: object) -> str:
    """``repr(value)`` cut to about :data:`MAX_ECHO` characters, without building the full
    repr of a large value (an error message echoes what the user gave, never all of it)."""
    if isinstance(value, int) and value.bit_length() > 200:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    try:
        text = _REPR.repr(value)
    except ValueError:  # a nested int of more than 4,300 digits
        return f"a {type(value).__name__} too large to show"
    return text if len(text) <= MAX_ECHO else text[: MAX_ECHO - 3] + "..."


class ConfigError(ValueError):
    """Bad user input. ``str(err)`` is one line: ``field: reason``."""


class InternalError(RuntimeError):
    """A result paraplan must not give (a utilisation above 100 %, a step faster than the GPUs'
    peak allows): a bug, never an answer. ``str(err)`` is one line."""


def format_validation_error(err: ValidationError) -> str:
    """The first error of a pydantic ValidationError as ``field.path: reason``."""
    first = err.errors(include_url=False)[0]
    loc = ".".join(str(part) if len(str(part)) <= MAX_ECHO else short_repr(part) for part in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if _OWN_MESSAGE.match(msg):
        # a nested spec's own message names its field from the spec ("vocab_size: ..."):
        # prefix where the spec sits in the job unless the message already starts there
        return msg if not loc or msg.startswith(loc) else f"{loc}.{msg}"
    if first["type"] == "extra_forbidden":
        msg = "unknown key (check the spelling; docs/job-file.md lists the job file's keys)"
    elif first["type"] == "missing":
        msg = "required but missing"
    elif first["type"] != "value_error":
        msg = f"{msg} (got {short_repr(first['input'])})"
    return f"{loc}: {msg}" if loc else msg


def positive_value(flag: str, text: str | None, parse, what: str) -> float | None:
    """A flag's ``text`` read by ``parse`` (a ``paraplan.units`` reader: '4 min', '2.5 USD'),
    refused in one line naming the flag unless it is above zero; None stays None."""
    from paraplan.units import UnitError

    if text is None:
        return None
    try:
        value = parse(text)
    except UnitError as exc:
        raise ConfigError(f"{flag}: {exc}") from None
    if not value > 0:
        raise ConfigError(f"{flag}: expected a positive {what}, got {short_repr(text)}")
    return value
