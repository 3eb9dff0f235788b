"""FP8 as Transformer Engine runs it: only the transformer layers' linear GEMMs in FP8, with
the casts and transposes they need; attention, the LM head, norms and the optimizer stay in
BF16/FP32 (TE docs, "Using FP8 with Transformer Engine"; Megatron-Core wraps only the
transformer block in ``fp8_autocast``)."""

from __future__ import annotations

import pytest

from paraplan.catalog import resolve_job
from paraplan.costmodel import AnalyticalCostModel
from paraplan.inventory import OpKind, count_job
from paraplan.inventory.fp8 import amax_history_bytes
from paraplan.prediction import predict
from paraplan.specs import ConfigError, Phase, Precision

LLAMA = {"name": "llama-3-8b", "seq_length": 4096}


def job(precision="fp8", **parallel):
    plan = {"tp": 1, "micro_batch_size": 1, "global_batch_size": 32, **parallel}
    return resolve_job({"model": LLAMA, "cluster": {"name": "dgx-h100", "num_nodes": 1}, "parallel": plan,
                        "precision": precision})


def test_only_the_four_linear_gemms_of_a_layer_run_in_fp8():
    inv = count_job(job())
    st = inv.stages[0]
    assert sorted(op.name for op in st.layer_ops if op.fp8) == ["linear1", "linear2", "linear3", "linear4"]
    assert not any(op.fp8 for op in st.end_ops)  # LM head and embedding stay BF16
    attention = [op for op in st.layer_ops if op.kind is OpKind.ATTENTION]
    assert attention and not attention[0].fp8


def test_a_bf16_job_has_no_fp8_gemms_and_no_casts():
    st = count_job(job("bf16")).stages[0]
    assert not any(op.fp8 for op in st.layer_ops)
    assert not any(op.name.startswith("fp8_") for op in st.layer_ops)


def test_an_fp8_gemm_reads_one_byte_operands_and_writes_a_16_bit_output():
    fp8 = next(op for op in count_job(job()).stages[0].layer_ops if op.name == "linear2")
    m, k, n = (dict(fp8.dims)[d] for d in "mkn")
    assert fp8.bytes == pytest.approx(1 * (m * k + k * n) + 2 * m * n)
    assert fp8.saved_bytes == pytest.approx(m * k)  # the FP8 copy of the input, kept for dW


def test_the_casts_move_the_bytes_derived_by_hand():
    """Forward: cast+transpose of the inputs of linear2 and linear4 (read 2, write 1 + 1 bytes
    per element) and the transpose of the norm-written FP8 inputs of linear1 and linear3
    (read 1, write 1). Backward: cast+transpose of every output gradient (read 2, write 2)."""
    ops = {op.name: op for op in count_job(job()).stages[0].layer_ops}
    mk = {name: dict(ops[name].dims)["m"] * dict(ops[name].dims)["k"] for name in ("linear1", "linear2", "linear3", "linear4")}
    mn = {name: dict(ops[name].dims)["m"] * dict(ops[name].dims)["n"] for name in mk}
    cast = ops["fp8_cast"]
    assert cast.bytes == pytest.approx(2 * (mk["linear1"] + mk["linear3"]) + 4 * (mk["linear2"] + mk["linear4"]))
    assert cast.bwd_bytes == pytest.approx(4 * sum(mn.values()))


def test_the_weights_are_cast_once_per_iteration_and_shared_by_its_micro_batches():
    few, many = (next(op for op in count_job(job(global_batch_size=g)).stages[0].layer_ops
                      if op.name == "fp8_weight_cast") for g in (8, 32))
    assert few.bytes == pytest.approx(4 * many.bytes)  # 1 vs 4 micro-batches per rank


def test_fp8_gemms_run_at_the_fp8_peak_and_the_rest_at_bf16():
    j = job()
    cm = AnalyticalCostModel(j.cluster, j.precision)
    ops = {op.name: op for op in count_job(j).stages[0].layer_ops}
    bf16 = {op.name: op for op in count_job(job("bf16")).stages[0].layer_ops}
    gemm_fp8, gemm_bf16 = cm.estimate_op_s(ops["linear3"], Phase.FWD), cm.estimate_op_s(bf16["linear3"], Phase.FWD)
    assert gemm_fp8 < gemm_bf16
    assert cm.estimate_op_s(ops["flash_atten"], Phase.FWD) == pytest.approx(
        AnalyticalCostModel(j.cluster, Precision.BF16).estimate_op_s(bf16["flash_atten"], Phase.FWD)
    )


def test_an_fp8_iteration_is_faster_than_bf16_but_not_twice_as_fast():
    fp8, bf16 = predict(job()), predict(job("bf16"))
    assert bf16.iteration_s / 2 < fp8.iteration_s < bf16.iteration_s


def test_fp8_weight_copies_add_two_bytes_per_fp8_parameter_besides_the_amax_histories():
    fp8, bf16 = predict(job()), predict(job("bf16"))
    inv = count_job(job())
    per_layer = sum(op.params for op in inv.stages[0].layer_ops if op.fp8)
    gemms = sum(op.fp8 for op in inv.stages[0].layer_ops)
    histories = inv.stages[0].num_layers * amax_history_bytes(gemms, None)
    extra = fp8.memory[0].weights - bf16.memory[0].weights
    assert extra - histories == pytest.approx(2 * per_layer * inv.stages[0].num_layers)
    assert 0 < histories < 1e-3 * extra


def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_an_error_naming_the_field():
    with pytest.raises(ConfigError, match="precision: GPU A100-SXM4-80GB has no fp8 peak"):
        resolve_job({"model": LLAMA, "cluster": {"name": "dgx-a100"}, "precision": "fp8"})
