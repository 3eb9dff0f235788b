"""Annotated pydantic field types: quantities that accept unit strings ("80 GB", "900 GB/s",
"5 us"), and numbers and truth values that are never coerced from another kind of value."""

from __future__ import annotations

import operator
from typing import Annotated

from pydantic import BeforeValidator, Field

from paraplan import units
from paraplan.specs.errors import short_repr


def _wrap(parser):
    def validate(value: object) -> object:
        if value is None:
            return value
        return parser(value)

    return validate


#: The largest count a field takes: every integer up to it is exact as a float (the cost model
#: computes in floats).
MAX_INT = 2**53


def _whole_number(value: object) -> object:
    """An int (or a NumPy integer) of at most :data:`MAX_INT`, never a bool, a float such as
    2.0 or a string such as "2"."""
    if value is None:
        return value
    if not isinstance(value, bool) and not isinstance(value, float | str):
        try:
            number = operator.index(value)
        except TypeError:
            pass
        else:
            if abs(number) > MAX_INT:
                raise ValueError(f"expected a whole number of at most 2**53, got {short_repr(number)}")
            return number
    hint = f" (write {int(value)})" if isinstance(value, float) and value.is_integer() else ""
    raise ValueError(f"expected a whole number, got {short_repr(value)}{hint}")


def _truth_value(value: object) -> object:
    """True or False (or a NumPy bool), never 1, 0 or a string."""
    if value is None or isinstance(value, bool):
        return value
    if type(value).__name__ == "bool" and type(value).__module__ == "numpy":
        return bool(value)
    raise ValueError(f"expected true or false, got {short_repr(value)}")


def _real_number(value: object) -> object:
    """A number, or a string that reads as one (PyYAML reads 1e9 as a string), never a bool."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {short_repr(value)}")
    return value


Int = Annotated[int, BeforeValidator(_whole_number)]
Bool = Annotated[bool, BeforeValidator(_truth_value)]
Float = Annotated[float, BeforeValidator(_real_number)]

Bytes = Annotated[float, BeforeValidator(_wrap(units.parse_bytes)), Field(ge=0)]
Bandwidth = Annotated[float, BeforeValidator(_wrap(units.parse_bandwidth)), Field(gt=0)]
FlopRate = Annotated[float, BeforeValidator(_wrap(units.parse_flops)), Field(gt=0)]
Seconds = Annotated[float, BeforeValidator(_wrap(units.parse_seconds)), Field(ge=0)]
Usd = Annotated[float, BeforeValidator(_wrap(units.parse_usd)), Field(ge=0)]
Count = Annotated[float, BeforeValidator(_wrap(units.parse_count)), Field(gt=0)]
