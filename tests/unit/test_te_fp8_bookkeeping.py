"""Transformer Engine 0.x's per-module FP8 bookkeeping (``parallel.te_fp8_bookkeeping: te0``):
every FP8 module of a layer copies its reduced amax into its history, takes the history's max,
rolls it and computes its new scales in its forward and backward of every micro-batch, as small
kernels on the compute stream; NeMo's MLPerf v3.0 preset (TE release_v0.8) sets it, cited."""

from __future__ import annotations

import pytest

# MLPerf v3.0 GPT-3 175B on 512 H100, and its plan, as the amax reduction's tests state them
from test_fp8_amax_reduction import _MLPERF, _plan

from paraplan.catalog import load_model, resolve_job
from paraplan.catalog.presets import presets
from paraplan.costmodel import AnalyticalCostModel
from paraplan.inventory import count_layer_ops, local_shape
from paraplan.inventory.fp8 import TE0_MODULES_PER_LAYER, te0_meta_kernels, te0_meta_update
from paraplan.prediction import predict
from paraplan.specs import Phase, Precision


def _without(job):
    return job.model_copy(update={"parallel": job.parallel.model_copy(update={"te_fp8_bookkeeping": "none"})})


def test_each_te0_module_runs_four_update_kernels_and_a_copy_of_its_reduced_amax_per_direction():
    # torch.max, torch.roll, fill_, the fused scale computation; the copy only with reduce_amax
    assert te0_meta_kernels(_plan(te_fp8_bookkeeping="te0", fp8_amax_reduce="tp_dp_then_tp")) == 5
    assert te0_meta_kernels(_plan(te_fp8_bookkeeping="te0")) == 4
    assert te0_meta_kernels(_plan()) == 0


def test_a_layers_bookkeeping_launches_per_module_and_moves_its_histories_twice_for_the_roll():
    op = te0_meta_update(5)
    assert TE0_MODULES_PER_LAYER == 3 and op.launches == 15
    # forward: 2 history columns per GEMM (input, weight), backward 1 (output gradient)
    assert op.work(Phase.FWD)[1] == pytest.approx(2 * op.work(Phase.BWD_INPUT)[1])
    assert op.work(Phase.BWD_WEIGHT) == (0.0, 0.0)
    # 8 columns of 1024 fp32 rows read by the max, read and written by the roll: ~3 x 32 KiB
    assert op.bytes == pytest.approx(4 * 8 * (3 * 1024 + 6))
    assert te0_meta_update(5, history=1).bytes < op.bytes / 300
    assert not op.recomputable  # TE's recompute phase swaps stashed tensors instead


def test_the_bookkeeping_is_one_operator_at_the_end_of_a_te0_fp8_layer_and_absent_otherwise():
    model = load_model("gpt3-175b")
    on = count_layer_ops(model, local_shape(model, _plan(te_fp8_bookkeeping="te0"), Precision.FP8))
    off = count_layer_ops(model, local_shape(model, _plan(), Precision.FP8))
    assert on[-1].name == "fp8_meta_update" and on[:-1] == off
    assert "fp8_meta_update" not in {op.name for op in off}


def test_each_kernel_costs_the_cost_models_launch_floor_on_the_compute_stream():
    """Tiny kernels: the roofline's per-launch ramp (the memory curve's half_work) dominates their
    few KiB, plus H100's kernel_overhead_s (1.29 us, its trace's tiny kernels) for each of the 15 launches."""
    job = resolve_job(_MLPERF)
    cm = AnalyticalCostModel(job.cluster, job.precision)
    gpu = job.cluster.gpu
    floor = gpu.efficiency.memory.half_work / (gpu.hbm_bandwidth_bytes_per_s * gpu.efficiency.memory.max_fraction)
    op = te0_meta_update(5)
    fwd = cm.estimate_op_s(op, Phase.FWD)
    assert 15 * floor < fwd < 1.2 * 15 * floor + 15 * gpu.efficiency.kernel_overhead_s
    assert cm.estimate_op_s(op, Phase.BWD_INPUT) < fwd


def test_the_mlperf_preset_prices_te0_bookkeeping_with_fp8_delayed_and_cites_release_v0_8():
    default = {d.field: d for d in presets()["nemo-mlperf-3.0"].defaults}["te_fp8_bookkeeping"]
    assert (default.value, default.when) == ("te0", "fp8_delayed")
    assert "release_v0.8" in default.source and "amax_and_scale_update" in default.source
    assert resolve_job(_MLPERF).parallel.te_fp8_bookkeeping == "te0"
    assert resolve_job({**_MLPERF, "precision": "bf16"}).parallel.te_fp8_bookkeeping == "none"
    for later in ("megatron-core-0.12", "nemo-24.07"):
        assert "te_fp8_bookkeeping" not in {d.field for d in presets()[later].defaults}


def test_te0_bookkeeping_beside_a_recipe_without_histories_or_a_16_bit_job_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match=r"parallel\.te_fp8_bookkeeping: 'te0' .* fp8_recipe current"):
        _plan(te_fp8_bookkeeping="te0", fp8_recipe="current")
    bf16 = {**_MLPERF, "precision": "bf16", "parallel": {**_MLPERF["parallel"], "te_fp8_bookkeeping": "te0"}}
    with pytest.raises(ValueError, match=r"parallel\.te_fp8_bookkeeping: te0 .* precision is bf16"):
        resolve_job(bf16)


def test_the_mlperf_gpt3_prediction_slows_by_its_layers_bookkeeping_kernels():
    """128 micro-batches x 12 layers x (forward + backward) x 15 launches at the launch floor on
    the busiest stage: a few hundredths of a second, well under 1 % of the 11.5 s iteration."""
    job = resolve_job(_MLPERF)
    on, off = predict(job).iteration_s, predict(_without(job)).iteration_s
    op = te0_meta_update(5)
    cm = AnalyticalCostModel(job.cluster, job.precision)
    per_microbatch = 12 * (cm.estimate_op_s(op, Phase.FWD) + cm.estimate_op_s(op, Phase.BWD_INPUT))
    assert 0.8 < (on - off) / (128 * per_microbatch) < 1.2
    assert on / off < 1.01
