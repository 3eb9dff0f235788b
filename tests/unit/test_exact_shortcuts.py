"""Shortcuts taken for speed give the floats the long way gives, bit for bit."""

from __future__ import annotations

from dataclasses import asdict, fields

from paraplan.prediction.result import Breakdown


def test_a_breakdowns_total_is_the_sum_of_its_parts_in_field_order_to_the_bit():
    # parts whose sum depends on the order they are added in
    parts = [1e16, 1.0, -1e16, 3.0, 0.1, 0.2, 0.3, 1e-17, 7.0, 2.5e-3, 1e8, 1.0 / 3.0]
    b = Breakdown(*parts)
    assert len(parts) == len(fields(Breakdown))
    assert b.total_s == sum(asdict(b).values())
    assert b.total_s != sum(sorted(parts))  # the order matters for these parts: the test can tell
