"""Parse quantities written with units ("80 GB", "900 GB/s", "989 TFLOPS", "5 us", "2.5 USD").

Decimal prefixes are powers of 1000 (GB = 1e9), binary prefixes powers of 1024 (GiB = 2**30);
the two are never mixed up. Bits are accepted for bandwidths ("200 Gb/s" = 25e9 bytes/s).
Every parser also accepts a plain number, taken to be in the base unit already.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "DTYPE_BYTES",
    "UnitError",
    "format_bytes",
    "format_count",
    "format_micro_batches",
    "format_rate",
    "format_seconds",
    "parse_bandwidth",
    "parse_bytes",
    "parse_count",
    "parse_flops",
    "parse_seconds",
    "parse_usd",
    "parse_watts",
]


class UnitError(ValueError):
    """A quantity could not be read; the message says what was expected."""


DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "tf32": 4.0,
    "fp16": 2.0,
    "bf16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
}

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_NUMBER = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"  # unambiguous: linear time
#: The longest quantity read ("80 GB" needs a few characters); longer text is refused unread.
_MAX_QUANTITY = 100
_QUANTITY = re.compile(r"^\s*" + _NUMBER + r"\s*([A-Za-z/$]*)\s*$")


def _shown(text: object) -> str:
    """What an error echoes of the user's value: a string or number cut short, else its type."""
    if isinstance(text, str):
        return repr(text) if len(text) <= 40 else repr(text[:37] + "...")
    if isinstance(text, int) and abs(text) >= 10**40:
        return f"an integer of about {int(text.bit_length() * 0.30103)} digits"
    if isinstance(text, (int, float)):
        return repr(text)
    return f"a value of type {type(text).__name__}"


def _split(text: object, what: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise UnitError(f"expected {what}, got {_shown(text)}")
    if isinstance(text, (int, float)):
        try:
            value = float(text)
        except OverflowError:  # an int beyond any float
            value = math.inf
        if not math.isfinite(value):
            raise UnitError(f"expected {what}, got {_shown(text)} (not a finite number)")
        return value, ""
    if not isinstance(text, str):
        raise UnitError(f"expected {what}, got {_shown(text)}")
    if len(text) > _MAX_QUANTITY:
        raise UnitError(f"cannot read {_shown(text)} as {what} (longer than {_MAX_QUANTITY} characters)")
    match = _QUANTITY.match(text)
    if match is None:
        raise UnitError(f"cannot read {_shown(text)} as {what}")
    value = float(match.group(1))
    if not math.isfinite(value):
        raise UnitError(f"cannot read {_shown(text)} as {what} (not a finite number)")
    return value, match.group(2)


def _prefix(prefix: str, text: object, what: str) -> float:
    if prefix in _DECIMAL:
        return _DECIMAL[prefix]
    if prefix in _BINARY:
        return _BINARY[prefix]
    raise UnitError(f"unknown unit prefix {prefix!r} in {_shown(text)} (expected {what})")


def parse_bytes(text: object) -> float:
    """'80 GB' -> 8e10; '80 GiB' -> 85899345920; a plain number is bytes."""
    value, unit = _split(text, "a size such as '80 GB' or '80 GiB'")
    if unit == "":
        return value
    if unit.endswith("B") and not unit.endswith("/B"):
        return value * _prefix(unit[:-1], text, "a size such as '80 GB'")
    if unit.endswith("b"):
        return value * _prefix(unit[:-1], text, "a size such as '80 GB'") / 8.0
    raise UnitError(f"cannot read {_shown(text)} as a size such as '80 GB' or '80 GiB'")


def parse_bandwidth(text: object) -> float:
    """'900 GB/s' -> 9e11 bytes/s; '200 Gb/s' and '200 Gbps' -> 2.5e10 bytes/s."""
    what = "a bandwidth such as '900 GB/s' or '200 Gb/s'"
    value, unit = _split(text, what)
    if unit == "":
        return value
    if unit.endswith("ps"):
        unit = unit[:-2] + "/s"
    if not unit.endswith("/s"):
        raise UnitError(f"cannot read {_shown(text)} as {what}")
    return parse_bytes(f"{value} {unit[:-2]}")


def parse_flops(text: object) -> float:
    """'989 TFLOPS' -> 9.89e14 FLOP/s ('TFLOP/s' and 'TF' are accepted too)."""
    what = "a compute rate such as '989 TFLOPS'"
    value, unit = _split(text, what)
    if unit == "":
        return value
    for suffix in ("FLOPS", "FLOP/s", "flops", "FLOPs", "F"):
        if unit.endswith(suffix):
            return value * _prefix(unit[: -len(suffix)], text, what)
    raise UnitError(f"cannot read {_shown(text)} as {what}")


_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "min": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
    "w": 604800.0,
    "wk": 604800.0,
}


def parse_seconds(text: object) -> float:
    """'5 us' -> 5e-6; '14d' -> 1209600; a plain number is seconds."""
    what = "a duration such as '5 us' or '14d'"
    if isinstance(text, str):
        text = text.replace("µ", "u")
    value, unit = _split(text, what)
    if unit == "":
        return value
    if unit not in _SECONDS:
        raise UnitError(f"cannot read {_shown(text)} as {what}")
    return value * _SECONDS[unit]


def parse_usd(text: object) -> float:
    """'2.5 USD', '$2.5', '500000USD', '1.2M USD' -> dollars."""
    what = "an amount such as '2.5 USD'"
    if isinstance(text, str):
        stripped = text.strip()
        if stripped.startswith("$"):
            text = stripped[1:] + " USD"
    value, unit = _split(text, what)
    if unit == "":
        return value
    for suffix in ("USD", "usd", "$"):
        if unit.endswith(suffix):
            return value * _prefix(unit[: -len(suffix)], text, what)
    raise UnitError(f"cannot read {_shown(text)} as {what}")


def parse_watts(text: object) -> float:
    """'700 W', '0.7 kW' -> watts; a plain number is watts (a GPU's power cap or TDP)."""
    what = "a power such as '700 W'"
    value, unit = _split(text, what)
    if unit == "":
        return value
    for suffix in ("W", "w"):
        if unit.endswith(suffix):
            return value * _prefix(unit[: -len(suffix)], text, what)
    raise UnitError(f"cannot read {_shown(text)} as {what}")


def parse_count(text: object) -> float:
    """'300e9', '2T', '1.5B' (billion) -> a number; used for token and parameter counts."""
    what = "a count such as '300e9' or '2T'"
    value, unit = _split(text, what)
    if unit == "":
        return value
    if unit == "B":  # billions, as in "7B" parameters or "300B" tokens
        return value * 1e9
    if unit in _DECIMAL:
        return value * _DECIMAL[unit]
    raise UnitError(f"cannot read {_shown(text)} as {what}")


def format_bytes(value: float) -> str:
    """Bytes as GiB/MiB with two decimals (memory is always reported in binary units)."""
    for name, scale in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {name}"
    return f"{value:.0f} B"


def format_count(value: float) -> str:
    """A count (parameters) with B/M/k so that a small model is not printed as "0.00 B"."""
    for name, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {name}"
    return f"{value:.0f}"


def format_tokens(value: float) -> str:
    """A token count as people write it and as job files take it: 1T, 300B, 1.5M, 2K."""
    for name, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{name}"
    return f"{value:.0f}"


def format_rate(tera: float) -> str:
    """TFLOP/s with one decimal, or three significant digits below 1 (a CPU's 0.0283)."""
    return f"{tera:.1f}" if abs(tera) >= 1 or tera == 0 else f"{tera:.3g}"


def format_micro_batches(count: int) -> str:
    """``1 micro-batch``, ``16 micro-batches``: a count of micro-batches, its noun agreeing."""
    return f"{count} micro-batch{'' if count == 1 else 'es'}"


def format_seconds(value: float) -> str:
    """A duration in the largest unit that keeps it readable."""
    if value >= 86400 * 2:
        return f"{value / 86400:.1f} d"
    if value >= 3600 * 2:
        return f"{value / 3600:.1f} h"
    if value >= 1:
        return f"{value:.3f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.2f} ms"
    return f"{value * 1e6:.1f} us"
