"""Annotated pydantic field types that accept unit strings ("80 GB", "900 GB/s", "5 us").

Every quantity is finite and within bounds no real hardware, price or run falls outside of:
a value past them (a denormal peak, a latency of a day, a price of 1e308 USD) can only
produce an infinite or meaningless prediction, so validation rejects it naming the user's value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated

from pydantic import BeforeValidator

from paraplan import units


def _bounded(parser: Callable[[object], float], low: float, high: float, what: str, *,
             low_open: bool = False) -> BeforeValidator:
    """Parse with ``parser`` and keep ``low <= value <= high`` (``low < value`` when
    ``low_open``); ``what`` says the range in words for the message."""

    def validate(value: object) -> object:
        if value is None:
            return value
        parsed = parser(value)
        if not math.isfinite(parsed) or parsed > high or parsed < low or (low_open and parsed == low):
            raise ValueError(f"{value!r} is out of range: expected {what}")
        return parsed

    return BeforeValidator(validate)


def _number(value: object) -> float:
    """A plain finite number (no unit), e.g. an efficiency curve's ``half_work``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a number, got {value!r}")
    try:
        return float(value)
    except (ValueError, OverflowError):
        raise ValueError(f"expected a number, got {value!r}") from None


Bytes = Annotated[float, _bounded(units.parse_bytes, 1e6, 1e15, "a memory size from 1 MB to 1 PB")]
Bandwidth = Annotated[float, _bounded(units.parse_bandwidth, 1e3, 1e16, "a bandwidth from 1 kB/s to 10 PB/s")]
FlopRate = Annotated[float, _bounded(units.parse_flops, 1e6, 1e19, "a peak from 1 MFLOPS to 10 EFLOPS")]
Seconds = Annotated[float, _bounded(units.parse_seconds, 0.0, 1.0, "a latency from 0 to 1 s")]
Usd = Annotated[float, _bounded(units.parse_usd, 0.0, 1e6, "a price per GPU-hour from 0 to 1M USD")]
Count = Annotated[float, _bounded(units.parse_count, 1.0, 1e18, "a count from 1 to 1e18")]
Fraction = Annotated[float, _bounded(_number, 1e-3, 1.0, "a fraction from 0.001 to 1")]
# an efficiency curve's half-work (FLOPs or bytes) or a collective's half-size (bytes)
HalfWork = Annotated[float, _bounded(_number, 0.0, 1e18, "a number from 0 to 1e18")]
