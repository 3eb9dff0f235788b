"""benchmarks/gemm_bins.py: the GEMM pricing scored against every measured GEMM, by FLOP bin and
shape class, and the candidate forms compared on held-out table rows (docs/calibration.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("scipy")
pytest.importorskip("pandas")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gemm_bins.py"


def _script():
    spec = importlib.util.spec_from_file_location("gemm_bins", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bins(rows) -> dict[str, tuple[int, float, float]]:
    return {name: (count, signed, absolute) for name, count, signed, absolute in rows}


def test_gemms_are_binned_by_flops_and_by_shape_class_with_signed_and_absolute_medians():
    bins = _script()
    shapes = bins.shape_class(np.array([256, 4096, 4096]), np.array([4096, 4096, 4096]), np.array([4096, 256, 4096]))
    assert list(shapes) == ["narrow", "skinny-k", "square"]
    err = np.array([-0.2, 0.1, 0.3])
    table = _bins(bins.binned(err, np.array([5e8, 5e9, 5e11]), shapes))
    assert table["<1e9"] == (1, pytest.approx(-20.0), pytest.approx(20.0))
    assert table["square"] == (1, pytest.approx(30.0), pytest.approx(30.0))
    assert table["all"] == (3, pytest.approx(10.0), pytest.approx(20.0))
    assert "1e10-1e11" not in table  # an empty bin is left out, not shown as 0


def test_h100_prices_small_and_narrow_table_gemms_no_faster_than_measured(xla_tables_dir):
    bins = _script()
    err, flops, shapes, rows = bins.table_errors("sm_90", "H100-SXM5-80GB")
    assert len(rows) == 375  # every bf16 row, not only the >= 1e10 FLOPs the curve was fitted on
    table = _bins(bins.binned(err, flops, shapes))
    for name in ("<1e9", "1e9-1e10", "narrow", "skinny-k"):
        _, signed, absolute = table[name]
        assert signed > -5.0, name  # not systematically under-priced (MoE's -14.5 % is not here)
        assert absolute < 10.0, name


def test_a_fill_term_for_gemms_with_fewer_tiles_than_sms_does_not_beat_the_flop_curve_held_out(xla_tables_dir):
    forms = _script().fitted_forms("sm_90", "H100-SXM5-80GB", seeds=2)
    curve, fill = _bins(forms["curve >= 1e10"][1]), _bins(forms["fill, all"][1])
    assert fill["all"][2] >= curve["all"][2]  # median |err| on the held-out rows
    params, _ = forms["fill >= 1e10"]
    assert params[2] == pytest.approx(0.0, abs=0.02)  # fitted where training GEMMs live, alpha is 0
