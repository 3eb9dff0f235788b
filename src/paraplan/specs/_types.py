"""Annotated pydantic field types: quantities that accept unit strings ("80 GB", "900 GB/s",
"5 us"), and numbers and truth values that are never coerced from another kind of value.

Every quantity is finite and within bounds no real hardware, price or run falls outside of:
a value past them (a denormal peak, a latency of a day, a price of 1e308 USD) can only
produce an infinite or meaningless prediction, so validation rejects it naming the user's value.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Annotated

from pydantic import BeforeValidator

from paraplan import units
from paraplan.specs.errors import short_repr


def _bounded(parser: Callable[[object], float], low: float, high: float, what: str, *,
             low_open: bool = False) -> BeforeValidator:
    """Parse with ``parser`` and keep ``low <= value <= high`` (``low < value`` when
    ``low_open``); ``what`` says the range in words for the message."""

    def validate(value: object) -> object:
        if value is None:
            return value
        parsed = parser(value)
        if not math.isfinite(parsed) or parsed > high or parsed < low or (low_open and parsed == low):
            raise ValueError(f"{short_repr(value)} is out of range: expected {what}")
        return parsed

    return BeforeValidator(validate)


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


def _number(value: object) -> float:
    """A plain finite number (no unit), e.g. an efficiency curve's ``half_work``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a number, got {short_repr(value)}")
    try:
        return float(value)
    except (ValueError, OverflowError):
        raise ValueError(f"expected a number, got {short_repr(value)}") from None


Bytes = Annotated[float, _bounded(units.parse_bytes, 1e6, 1e15, "a memory size from 1 MB to 1 PB")]
Bandwidth = Annotated[float, _bounded(units.parse_bandwidth, 1e3, 1e16, "a bandwidth from 1 kB/s to 10 PB/s")]
FlopRate = Annotated[float, _bounded(units.parse_flops, 1e6, 1e19, "a peak from 1 MFLOPS to 10 EFLOPS")]
Seconds = Annotated[float, _bounded(units.parse_seconds, 0.0, 1.0, "a latency from 0 to 1 s")]
Usd = Annotated[float, _bounded(units.parse_usd, 0.0, 1e6, "a price per GPU-hour from 0 to 1M USD")]
# a GPU's board power: its TDP, or the cap a cluster runs it at (the largest board in the catalog draws 1.4 kW)
Watts = Annotated[float, _bounded(units.parse_watts, 0.0, 3000.0, "a board power above 0 W and at most 3000 W",
                                  low_open=True)]
Count = Annotated[float, _bounded(units.parse_count, 1.0, 1e18, "a count from 1 to 1e18")]
Fraction = Annotated[float, _bounded(_number, 1e-3, 1.0, "a fraction from 0.001 to 1")]
# the share of a GPU's memory a plan must leave free (``Job.memory_headroom``)
Headroom = Annotated[float, _bounded(_number, 0.0, 0.5, "a fraction of the GPU's memory from 0 to 0.5")]
# an efficiency curve's half-work (FLOPs or bytes) or a collective's half-size (bytes)
HalfWork = Annotated[float, _bounded(_number, 0.0, 1e18, "a number from 0 to 1e18")]
