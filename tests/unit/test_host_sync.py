"""A MoE dispatcher's host sync: after it the GPU waits for the host's kernel launches
(``prediction.host_sync``, ``ParallelPlan.moe_host_sync``, ``catalog/runtime/host.yaml``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from paraplan.catalog import load_host_launch, resolve_job
from paraplan.costmodel import AnalyticalCostModel
from paraplan.inventory import count_job
from paraplan.prediction import predict
from paraplan.prediction.host_sync import launch_bound_s
from paraplan.prediction.stages import CommCosts, LayerCost

REPO = Path(__file__).resolve().parents[2]
LAUNCH = 40e-6


def _fit_script():
    spec = importlib.util.spec_from_file_location("fit_host_launch", REPO / "benchmarks" / "fit_host_launch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_layer_whose_host_launch_time_exceeds_its_gpu_time_after_a_sync_takes_the_host_time():
    items = [(10e-6, 1)] * 20  # 20 kernels of 10 us, launched at 40 us each
    host, gpu = 20 * LAUNCH, 20 * 10e-6
    assert launch_bound_s(items, LAUNCH) == pytest.approx(host + 10e-6)  # the last kernel runs after its launch
    assert launch_bound_s(items, LAUNCH) > 3 * gpu


def test_a_layer_whose_gpu_time_exceeds_its_host_launch_time_loses_only_the_first_launch():
    items = [(1e-3, 1)] * 20
    assert launch_bound_s(items, LAUNCH) == pytest.approx(LAUNCH + 20 * 1e-3)


def test_halving_the_gpu_time_of_a_host_bound_layer_does_not_halve_its_time():
    items = [(20e-6, 1)] * 30
    half = [(t / 2, n) for t, n in items]
    assert launch_bound_s(half, LAUNCH) / launch_bound_s(items, LAUNCH) > 0.95


def _moe_job(sync: bool, seq: int):
    job = resolve_job({"model": "mixtral-8x7b", "cluster": {"name": "dgx-h100", "num_nodes": 1},
                       "parallel": {"tp": 1, "pp": 1, "ep": 8, "micro_batch_size": 1, "global_batch_size": 64,
                                    "zero_stage": 1, "moe_host_sync": sync}})
    return job.model_copy(update={"model": job.model.model_copy(update={"seq_length": seq})})


def _moe_layer(job):
    inv = count_job(job)
    cm = AnalyticalCostModel(job.cluster, job.precision)
    (block,) = [b for b in inv.stages[0].blocks if b.moe]
    return LayerCost.of(block, cm, CommCosts(inv, cm))


def test_a_short_sequence_moe_layer_waits_for_the_host_after_its_dispatcher_sync():
    layer = _moe_layer(_moe_job(True, 64))
    assert layer.host_fwd > 0
    assert layer.fwd_total == pytest.approx(sum(layer.fwd) + layer.host_fwd)
    assert layer.bwd_total == pytest.approx(sum(layer.bwd))  # the backward has no sync


def test_without_a_sync_nothing_changes():
    synced, free = _moe_layer(_moe_job(True, 64)), _moe_layer(_moe_job(False, 64))
    assert free.host_fwd == 0.0
    assert free.fwd == synced.fwd and free.bwd_total == synced.bwd_total
    assert free.fwd_total == pytest.approx(sum(free.fwd))
    assert free.fwd_total < synced.fwd_total
    assert predict(_moe_job(False, 64)).iteration_s < predict(_moe_job(True, 64)).iteration_s


def test_a_long_sequence_moe_layer_keeps_the_gpu_ahead_of_the_host():
    assert _moe_layer(_moe_job(True, 4096)).host_fwd == 0.0


def test_the_fit_script_reproduces_the_catalog_launch_cost_from_the_h100_trace():
    fit = _fit_script()
    if not fit.H100.exists():
        pytest.skip("the H100 trace is absent")
    median, launches = fit.median_launch_s(fit.H100)
    assert launches > 1000
    assert median == pytest.approx(load_host_launch().launch_s, abs=0.05e-6)


def test_the_fit_script_reproduces_the_catalog_spread_from_the_hta_traces():
    fit = _fit_script()
    if not fit.HTA.is_dir():
        pytest.skip("../shared/data/traces/hta is absent")
    spread = load_host_launch().spread_us
    got = {name: fit.median_launch_s(path) for name, path in fit.traces().items() if name.startswith("E1_")}
    (e1,) = got.values()
    (want,) = [v for k, v in spread.items() if k.startswith("E1_")]
    assert e1[0] * 1e6 == pytest.approx(want, abs=0.05)


def test_a_moe_prediction_says_its_host_launch_cost_was_measured_on_another_host():
    synced = predict(_moe_job(True, 2048))
    assert any("host launch cost 38.9 us" in note and "no measurement" in note for note in synced.uncalibrated)
    assert not any("host launch cost" in note for note in predict(_moe_job(False, 2048)).uncalibrated)
