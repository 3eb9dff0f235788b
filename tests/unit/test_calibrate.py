"""paraplan.calibrate: the operator fit recovers known efficiency curves from synthetic samples.

The samples are real inventory operators (``op_for_sample``) whose "measured" times come from
``estimate_op_s`` with a known ``EfficiencySpec``; fitting them must give that spec back.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("scipy")
pytest.importorskip("pandas")

from paraplan.calibrate import (
    OpSamples,
    ParamLayout,
    efficiency_yaml,
    fit_efficiency,
    op_curve_keys,
    predict_ops,
    replace_efficiency_block,
)
from paraplan.catalog import load_gpu
from paraplan.inventory.samples import op_for_sample
from paraplan.specs import EfficiencyCurve, EfficiencySpec, GpuSpec, Precision


def _rows(tag: str, n: int, rng: np.random.Generator) -> list[dict[str, float]]:
    """``n`` buildable grid points of the GPUModeling grid for ``tag``."""
    out: list[dict[str, float]] = []
    while len(out) < n:
        row = {
            "mp": float(rng.choice([1, 2, 4, 8])),
            "b": float(rng.choice([2, 4, 8])),
            "h": float(rng.choice([16, 32, 64])),
            "l": float(rng.choice(np.arange(1024, 5121, 512))),
            "dim": float(rng.choice(np.arange(2048, 8193, 1024))),
        }
        try:
            op_for_sample(tag, row)
        except ValueError:
            continue
        out.append(row)
    return out


TRUTH = EfficiencySpec(
    gemm=EfficiencyCurve(max_fraction=0.82, half_work=3e9),
    attention=EfficiencyCurve(max_fraction=0.5, half_work=4e9),
    # the kind-level memory curve is fitted on gelu (a default-memory tag), so gelu's own curves
    # equal it in the synthetic truth
    memory=EfficiencyCurve(max_fraction=0.7, half_work=4e6),
    ops={
        "gelu:fwd": EfficiencyCurve(max_fraction=0.7, half_work=4e6),
        "gelu:bwd": EfficiencyCurve(max_fraction=0.7, half_work=4e6),
        "RMSlayernorm:fwd": EfficiencyCurve(max_fraction=0.15, half_work=2e7),
        "RMSlayernorm:bwd": EfficiencyCurve(max_fraction=0.05, half_work=1e7),
        "bmm:fwd": EfficiencyCurve(max_fraction=0.55, half_work=4e9),
        "bmm:bwd": EfficiencyCurve(max_fraction=0.45, half_work=8e9),
    },
    kernel_overhead_s=3e-6,
    source="synthetic truth",
)


def _synthetic(gpu: GpuSpec, peak: float, n: int = 60):
    rng = np.random.default_rng(1)
    truth_gpu = gpu.model_copy(update={"efficiency": TRUTH})
    samples = OpSamples()
    for tag in ("gelu", "RMSlayernorm", "bmm", "linear1"):
        for row in _rows(tag, n, rng):
            op = op_for_sample(tag, row)
            for phase in ("fwd", "bwd"):
                samples.add(tag, phase, op, (tag, *row.values()), 1.0)
    samples.measured = list(predict_ops(samples, truth_gpu, peak))
    return samples


def test_operator_fit_recovers_known_curves():
    gpu = load_gpu("A100-SXM4-80GB")
    peak = gpu.flops_for(Precision.FP16)
    samples = _synthetic(gpu, peak)
    keys = op_curve_keys(samples, "memory+bmm", 40)
    assert set(keys) == set(TRUTH.ops)
    assert keys["bmm:fwd"] is True and keys["gelu:fwd"] is False
    layout = ParamLayout.for_keys(keys)
    # the overhead trades one for one with each curve's fixed time; keep it at the truth so
    # that every half_work is identified
    start = EfficiencySpec(kernel_overhead_s=TRUTH.kernel_overhead_s)
    spec, _ = fit_efficiency(
        samples, gpu, peak, start, loss="linear", max_nfev=200, layout=layout, fix_overhead=True
    )
    fitted = gpu.model_copy(update={"efficiency": spec})
    pred = predict_ops(samples, fitted, peak)
    assert np.max(np.abs(np.log(pred / np.asarray(samples.measured)))) < 1e-3
    for name in ("gemm", "memory"):
        got, want = getattr(spec, name), getattr(TRUTH, name)
        assert got.max_fraction == pytest.approx(want.max_fraction, rel=0.01), name
    for key, want in TRUTH.ops.items():
        got = spec.ops[key]
        assert got.max_fraction == pytest.approx(want.max_fraction, rel=0.01), key
        assert got.half_work == pytest.approx(want.half_work, rel=0.1), key
    # no flash-attention samples: the attention curve stays where it started
    assert spec.attention.max_fraction == start.attention.max_fraction
    assert spec.attention.half_work == pytest.approx(start.attention.half_work)


def test_op_curve_keys_modes_and_thresholds():
    gpu = load_gpu("A100-SXM4-80GB")
    samples = _synthetic(gpu, gpu.flops_for(Precision.FP16), n=30)
    assert op_curve_keys(samples, "none", 1) == {}
    assert op_curve_keys(samples, "memory+bmm", 31) == {}
    memory = op_curve_keys(samples, "memory", 10)
    assert set(memory) == {"gelu:fwd", "gelu:bwd", "RMSlayernorm:fwd", "RMSlayernorm:bwd"}
    everything = op_curve_keys(samples, "all", 10)
    assert {"linear1:fwd", "linear1:bwd", "bmm:fwd", "bmm:bwd"} <= set(everything)
    assert "gelu:fwd" not in op_curve_keys(samples, "all", 10, excluded_tags=("gelu",))


def test_efficiency_block_round_trips_through_the_catalog_yaml(tmp_path):
    src = (
        Path(__file__).resolve().parents[2] / "src" / "paraplan" / "catalog" / "gpus" / "a100-sxm4-80gb.yaml"
    )
    path = tmp_path / "gpu.yaml"
    path.write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
    before = path.read_text(encoding="utf-8").splitlines()
    block = efficiency_yaml(TRUTH, flops_keys=["bmm:fwd", "bmm:bwd"])
    replace_efficiency_block(path, block)
    after = path.read_text(encoding="utf-8").splitlines()
    # every line outside the efficiency block is unchanged
    start = next(i for i, ln in enumerate(before) if ln.startswith("efficiency:"))
    assert after[:start] == before[:start]
    gpu = GpuSpec.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    assert gpu.efficiency.ops == TRUTH.ops
    assert gpu.efficiency.memory == TRUTH.memory
    assert gpu.efficiency.kernel_overhead_s == pytest.approx(TRUTH.kernel_overhead_s)
