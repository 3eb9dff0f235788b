"""A MoE dispatcher's host sync: after it the GPU waits for the host's kernel launches
(``prediction.host_sync``, ``ParallelPlan.moe_host_sync``, ``catalog/runtime/host.yaml``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from paraplan.catalog import load_host_launch, resolve_job
from paraplan.costmodel import AnalyticalCostModel
from paraplan.inventory import count_job
from paraplan.prediction import predict
from paraplan.prediction.components import components_of
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


# --- the breakdown: waiting for the host is its own component, never compute ---------------


def test_a_host_bound_moe_layers_wait_is_host_launch_wait_not_forward_compute():
    synced, free = predict(_moe_job(True, 64)), predict(_moe_job(False, 64))
    wait = synced.breakdown.host_wait_s
    assert wait > 0.02 * synced.iteration_s  # a short sequence: the host's launches hold the GPU (4.8 %)
    # the kernels take as long either way; the iteration's growth is the wait, all of it
    assert synced.breakdown.forward_compute_s == pytest.approx(free.breakdown.forward_compute_s, rel=1e-12)
    assert wait == pytest.approx(synced.iteration_s - free.iteration_s, rel=1e-9)
    assert free.breakdown.host_wait_s == 0.0
    assert synced.breakdown.total_s == pytest.approx(synced.iteration_s, rel=1e-9)
    (stage,) = synced.stages
    m = synced.job.parallel.num_microbatches
    assert m * stage.host_wait_mb_s == pytest.approx(wait, rel=1e-12)
    moe_layers = sum(b.num_layers for b in count_job(synced.job).stages[0].blocks if b.moe)
    assert stage.host_wait_mb_s == pytest.approx(moe_layers * _moe_layer(synced.job).host_fwd, rel=1e-12)
    assert "host launch wait" in [c.label for c in components_of(synced.job)]


def test_a_host_launch_wait_is_named_in_the_table_the_json_and_the_csv():
    from rich.console import Console

    from paraplan.report.formats import render_csv
    from paraplan.report.tables import render_prediction

    pred = predict(_moe_job(True, 64))
    console = Console(width=80, record=True)
    console.print(render_prediction(pred))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    (row,) = [line for line in text.splitlines() if "host launch wait" in line]
    assert f"{pred.breakdown.host_wait_s:.4f}" in row
    data = json.loads(json.dumps(pred.to_dict()))
    assert data["breakdown"]["host_wait_s"] == pytest.approx(pred.breakdown.host_wait_s)
    header = render_csv([pred.to_dict()]).splitlines()[0].split(",")
    assert "breakdown.host_wait_s" in header


def test_a_pipelined_moe_stages_host_wait_is_neither_compute_nor_bubble():
    from paraplan.report.stagebars import stage_bars

    job = resolve_job({"model": {"name": "mixtral-8x7b", "seq_length": 64},
                       "cluster": {"name": "dgx-h100", "num_nodes": 2},
                       "parallel": {"tp": 1, "pp": 2, "ep": 8, "micro_batch_size": 1, "global_batch_size": 64,
                                    "zero_stage": 1}})
    pred = predict(job, keep_timeline=True)
    m = job.parallel.num_microbatches
    waits = [m * t.host_wait_mb_s for t in pred.stages]
    assert min(waits) > 0
    for bar in stage_bars(pred):  # every stage's bar names its own wait and adds up to the iteration
        assert bar.as_dict()["host launch wait"] == pytest.approx(waits[bar.stage], rel=1e-9)
        assert bar.total_s == pytest.approx(pred.iteration_s, rel=1e-9)
        if bar.critical:
            assert pred.breakdown.host_wait_s == pytest.approx(waits[bar.stage], rel=1e-9)


def test_a_dense_job_has_no_host_launch_wait_component():
    dense = resolve_job({"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 1},
                         "parallel": {"tp": 2, "micro_batch_size": 1, "global_batch_size": 64}})
    assert dense.parallel.moe_host_sync  # the flag is on; a dense model has no dispatcher to sync
    pred = predict(dense)
    assert pred.breakdown.host_wait_s == 0.0
    assert all(t.host_wait_mb_s == 0.0 for t in pred.stages)
    assert "host_wait_s" not in [c.field for c in components_of(dense)]
    assert "host_wait_s" not in [c.field for c in components_of(_moe_job(False, 64))]


def test_an_operator_with_no_forward_time_launches_nothing_after_the_sync():
    from types import SimpleNamespace

    from paraplan.prediction.host_sync import sync_items

    def _op(name, launches):  # sync_items reads an operator's name and forward launches only
        return SimpleNamespace(name=name, forward_host_launches=launches)

    ops = [_op("attention", 2), _op("moe_permute", 1), _op("qkv_split", 3), _op("expert_fc1", 4)]
    items = sync_items(ops, [1e-3, 1e-4, 0.0, 2e-3])
    assert items == [(1e-4, 0), (0.0, 0), (2e-3, 4), (1e-3, 2), (0.0, 1)]


def test_partial_cuda_graphs_stated_for_a_dense_model_are_said_to_be_ignored_and_a_moes_are_not():
    def dense(**parallel):
        return resolve_job({"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 1},
                            "parallel": {"tp": 2, "micro_batch_size": 1, "global_batch_size": 8, **parallel}})

    def ignored(job):
        return [n for n in predict(job).ignored_settings if n.startswith("parallel.cuda_graph_scope")]

    graphed = predict(dense(cuda_graph_scope=["attn"]))
    assert not any("cuda_graph_scope" in n for n in graphed.uncalibrated)  # a setting, not a calibration gap
    assert [n for n in graphed.ignored_settings if n.startswith("parallel.cuda_graph_scope")] == [
        "parallel.cuda_graph_scope attn: a dense model's kernel launches run ahead of the GPU (no "
        "dispatcher sync waits for them), so a graph saves no priced time"]
    assert graphed.iteration_s == predict(dense()).iteration_s  # what the note says
    assert ignored(dense()) == []
    moe = _moe_job(True, 64)
    assert ignored(moe.model_copy(update={"parallel": moe.parallel.model_copy(
        update={"cuda_graph_scope": ("attn", "moe_router")})})) == []
