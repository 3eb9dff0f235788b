"""One-line configuration errors that name the field and the reason."""

from __future__ import annotations

import re

from pydantic import ValidationError

# Messages raised by paraplan's own validators start with the full field path ("parallel.tp: ").
_OWN_MESSAGE = re.compile(r"^[A-Za-z_][\w.]*: ")


class ConfigError(ValueError):
    """Bad user input. ``str(err)`` is one line: ``field: reason``."""


def format_validation_error(err: ValidationError) -> str:
    """The first error of a pydantic ValidationError as ``field.path: reason``."""
    first = err.errors(include_url=False)[0]
    loc = ".".join(str(part) for part in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if _OWN_MESSAGE.match(msg):
        return msg
    if first["type"] == "extra_forbidden":
        msg = "unknown key (check the spelling; the README lists the job file's keys)"
    elif first["type"] == "missing":
        msg = "required but missing"
    elif first["type"] != "value_error":
        msg = f"{msg} (got {first['input']!r})"
    return f"{loc}: {msg}" if loc else msg
