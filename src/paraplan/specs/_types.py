"""Annotated pydantic field types that accept unit strings ("80 GB", "900 GB/s", "5 us")."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field

from paraplan import units


def _wrap(parser):
    def validate(value: object) -> object:
        if value is None:
            return value
        return parser(value)

    return validate


Bytes = Annotated[float, BeforeValidator(_wrap(units.parse_bytes)), Field(ge=0)]
Bandwidth = Annotated[float, BeforeValidator(_wrap(units.parse_bandwidth)), Field(gt=0)]
FlopRate = Annotated[float, BeforeValidator(_wrap(units.parse_flops)), Field(gt=0)]
Seconds = Annotated[float, BeforeValidator(_wrap(units.parse_seconds)), Field(ge=0)]
Usd = Annotated[float, BeforeValidator(_wrap(units.parse_usd)), Field(ge=0)]
Count = Annotated[float, BeforeValidator(_wrap(units.parse_count)), Field(gt=0)]
