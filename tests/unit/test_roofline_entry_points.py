"""The roofline's two entry points are one arithmetic (``roofline.roofline_s``): the module's
``estimate_op_s`` (burst, what calibration fits through) and ``AnalyticalCostModel.estimate_op_s``
(the prediction's, its lookups kept) give the same seconds at burst, to the bit."""

from __future__ import annotations

import dataclasses

import pytest

from paraplan.catalog import resolve_job
from paraplan.costmodel import AnalyticalCostModel, estimate_op_s
from paraplan.costmodel.roofline import attention_tile_s, compute_precision, sustained_gemm_factor
from paraplan.inventory import Op, OpKind, count_job
from paraplan.inventory.scan_kinds import causal_conv1d_work, selective_scan_work, ssd_scan_work
from paraplan.specs import AttentionKernel, EfficiencyCurve, Phase, Precision

PHASES = (Phase.FWD, Phase.BWD_INPUT, Phase.BWD_WEIGHT, Phase.RECOMPUTE, Phase.OPTIMIZER)


def _job():
    """Llama-3-8B in FP8 on a DGX H100 with cuDNN attention: FP8 GEMMs, BF16 GEMMs (the LM
    head), attention priced by its tiles (head dim 128), norms and casts on the memory curve."""
    plan = {"tp": 2, "micro_batch_size": 1, "global_batch_size": 32, "attention_kernel": "cudnn"}
    return resolve_job({"model": {"name": "llama-3-8b", "seq_length": 4096},
                        "cluster": {"name": "dgx-h100", "num_nodes": 1}, "parallel": plan, "precision": "fp8"})


def _scan(kind: OpKind, work) -> Op:
    return Op(name=kind.value, kind=kind, role="uncalibrated: test", flops=work.flops, bytes=work.bytes,
              bwd_flops=work.bwd_flops, bwd_bytes=work.bwd_bytes)


def _sample() -> list[Op]:
    st = count_job(_job()).stages[0]
    ops = [*st.layer_ops, *st.end_ops, st.optimizer]
    grouped = next(op for op in ops if op.name == "linear3")
    ops.append(dataclasses.replace(grouped, name="grouped", launches=8))  # eight equal kernels
    ops += [_scan(OpKind.SSM_SCAN, ssd_scan_work(2, 4096, 64, 64, 128, 8, 256, 2)),
            _scan(OpKind.SELECTIVE_SCAN, selective_scan_work(2, 4096, 8192, 16, 2)),
            _scan(OpKind.CAUSAL_CONV1D, causal_conv1d_work(2, 4096, 8192, 4, 2))]
    return ops


def test_the_sample_holds_every_kind_of_pricing_the_roofline_has():
    ops = _sample()
    kinds = {op.kind for op in ops}
    assert {OpKind.GEMM, OpKind.ATTENTION, OpKind.SSM_SCAN, OpKind.SELECTIVE_SCAN, OpKind.CAUSAL_CONV1D} <= kinds
    assert any(op.fp8 for op in ops) and any(op.kind is OpKind.GEMM and not op.fp8 for op in ops)
    assert any(op.launches > 1 for op in ops)
    attention = next(op for op in ops if op.kind is OpKind.ATTENTION)
    gpu = AnalyticalCostModel(_job().cluster, Precision.FP8, attention_kernel=AttentionKernel.CUDNN).gpu
    assert attention_tile_s(attention, Phase.FWD, attention.work(Phase.FWD)[0], 1e15, gpu.efficiency.attention)


@pytest.mark.parametrize("sustained", [False, True], ids=["burst", "held by a GPU with no held factors"])
def test_the_module_and_the_cost_model_give_the_same_seconds_at_burst(sustained):
    job = _job()
    cluster = job.cluster
    if sustained:  # a GPU whose catalog measures no held clock: the held model runs at burst too
        eff = cluster.gpu.efficiency.model_copy(update={"sustained": None})
        cluster = cluster.model_copy(update={"gpu": cluster.gpu.model_copy(update={"efficiency": eff})})
        assert sustained_gemm_factor(cluster, Precision.FP8) == 1.0
    model = AnalyticalCostModel(cluster, job.precision, sustained=sustained, attention_kernel=AttentionKernel.CUDNN)
    checked = 0
    for op in _sample():
        precision = compute_precision(op, job.precision)  # the module is told the op's precision
        for phase in PHASES:
            burst = estimate_op_s(op, phase, model.gpu, model.gpu.flops_for(precision), precision)
            assert model.estimate_op_s(op, phase) == burst, (op.name, phase)
            checked += burst > 0.0
    assert checked > 40


def test_the_held_cost_model_divides_only_a_gemms_compute_side_by_its_factor():
    job = _job()
    model = AnalyticalCostModel(job.cluster, job.precision, attention_kernel=AttentionKernel.CUDNN)
    factor = sustained_gemm_factor(job.cluster, Precision.FP8)
    assert factor < 1.0
    gemm = next(op for op in _sample() if op.name == "linear3")
    burst = estimate_op_s(gemm, Phase.FWD, model.gpu, model.gpu.flops_for(Precision.FP8), Precision.FP8)
    overhead = gemm.launches * model.gpu.efficiency.kernel_overhead_s  # the launches' overhead is not slowed
    assert model.estimate_op_s(gemm, Phase.FWD) == pytest.approx((burst - overhead) / factor + overhead, rel=1e-12)
    norm = next(op for op in _sample() if op.kind is OpKind.NORM)
    assert model.estimate_op_s(norm, Phase.FWD) == estimate_op_s(norm, Phase.FWD, model.gpu, model.peak_flops,
                                                                 Precision.BF16)


def test_a_calibration_trial_with_other_curves_is_priced_on_its_own_curves():
    """The burst entry point keeps each GPU's lookups: a trial GPU (a copy with another GEMM
    curve, as calibration builds one per step) must not be priced on the first GPU's curves."""
    gpu = _job().cluster.gpu
    gemm = next(op for op in _sample() if op.name == "linear_final")
    peak = gpu.flops_for(Precision.BF16)
    before = estimate_op_s(gemm, Phase.FWD, gpu, peak)
    slower = EfficiencyCurve(max_fraction=gpu.efficiency.gemm.max_fraction / 2, half_work=gpu.efficiency.gemm.half_work)
    trial = gpu.model_copy(update={"efficiency": gpu.efficiency.model_copy(update={"gemm": slower})})
    assert estimate_op_s(gemm, Phase.FWD, trial, peak) > 1.9 * before
    assert estimate_op_s(gemm, Phase.FWD, gpu, peak) == before
