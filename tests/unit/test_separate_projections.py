"""Fused or separate input projections, as each framework's model code runs them: Megatron-Core's
one ``linear_qkv`` and one gated ``linear_fc1``, torchtitan's ``wq``/``wk``/``wv`` and
``w1``/``w3``, IBM fms' ``query``/``key``/``value`` and ``wg``/``w1`` (``qkv_fusion``,
``gate_up_fusion``; the presets' ``model_defaults``)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.catalog import load_cluster, resolve_job
from paraplan.costmodel.roofline import AnalyticalCostModel
from paraplan.inventory import count_job
from paraplan.inventory.layer import count_layer_ops, gemm, separate_gemms
from paraplan.inventory.ops import OpKind
from paraplan.inventory.shapes import shard_shape
from paraplan.prediction import predict
from paraplan.prediction.memory import activations_per_microbatch
from paraplan.specs import ConfigError, FP8Recipe, ModelSpec, Phase, Precision

LLAMA3_8B = {"name": "llama3-8b-like", "num_layers": 4, "hidden_size": 4096, "num_attention_heads": 32,
             "num_query_groups": 8, "ffn_hidden_size": 14336, "seq_length": 8192, "vocab_size": 128256,
             "activation": "swiglu", "normalization": "rmsnorm", "position_embedding": "rotary",
             "add_bias_linear": False}


def _job(framework, model=None, **parallel):
    plan = {"framework": framework, "tp": 2, "micro_batch_size": 1, "global_batch_size": 8, **parallel}
    return resolve_job({"model": {**LLAMA3_8B, **(model or {})}, "cluster": {"name": "dgx-h100", "num_nodes": 1},
                        "parallel": plan})


def _widths(job, name):
    return [dict(op.dims)["n"] for op in count_job(job).stages[0].layer_ops if op.name == name]


def test_torchtitan_0_1_runs_q_k_v_and_gate_up_each_as_a_gemm_of_its_own_width():
    job = _job("torchtitan-0.1")
    assert (job.model.qkv_fusion, job.model.gate_up_fusion) == (False, False)
    # tp 2: 32 heads of 128 -> 2048 columns per rank, 8 kv groups of 128 -> 512 each for K and V
    assert _widths(job, "linear1") == [2048, 512, 512]
    assert _widths(job, "linear3") == [7168, 7168]
    assert {"qkv_fusion": False, "gate_up_fusion": False}.items() <= job.preset.model_taken.items()


def test_torchtitan_0_3_fuses_q_k_v_but_runs_gate_and_up_apart():
    job = _job("torchtitan-0.3")
    assert _widths(job, "linear1") == [2048 + 512 + 512]
    assert _widths(job, "linear3") == [7168, 7168]


def test_fms_fsdp_of_2024_03_runs_every_projection_apart():
    job = _job("fms-fsdp", tp=1, global_batch_size=8)
    assert _widths(job, "linear1") == [4096, 1024, 1024]
    assert _widths(job, "linear3") == [14336, 14336]


@pytest.mark.parametrize("framework", ["megatron-core", "nemo-24.07", "megatron-bridge", "megatron"])
def test_megatron_stacks_keep_one_qkv_and_one_gate_up_gemm(framework):
    job = _job(framework)
    assert _widths(job, "linear1") == [3072]
    assert _widths(job, "linear3") == [2 * 7168]
    assert not any(op.name == "grad_sum" for op in count_job(job).stages[0].layer_ops)


def test_a_stated_projection_field_wins_over_the_preset_and_is_said():
    job = _job("torchtitan-0.1", model={"qkv_fusion": True})
    assert _widths(job, "linear1") == [3072] and _widths(job, "linear3") == [7168, 7168]
    assert job.preset.model_overridden == {"qkv_fusion": (True, False)}
    assert any("qkv_fusion true: your value, used (torchtitan-0.1 would set false)" in line
               for line in job.preset.lines())


def _layer(fused: bool, precision=Precision.BF16, tp=2, recipe=None):
    spec = ModelSpec(**{**LLAMA3_8B, "qkv_fusion": fused, "gate_up_fusion": fused})
    return count_layer_ops(spec, shard_shape(spec, tp, 1, True, 1, precision, fp8_recipe=recipe))


def test_splitting_keeps_flops_params_and_saved_bytes_and_adds_only_the_input_reads_and_gradient_sums():
    fused, split = _layer(True), _layer(False)
    gemms = {k: [op for op in ops if op.kind is OpKind.GEMM] for k, ops in (("f", fused), ("s", split))}
    for key in ("flops", "bwd_flops", "bwd_weight_flops", "params"):
        assert sum(getattr(op, key) for op in gemms["s"]) == pytest.approx(sum(getattr(op, key) for op in gemms["f"]))
    assert sum(op.saved_bytes for op in split) == pytest.approx(sum(op.saved_bytes for op in fused))
    tokens, h, e = 8192, 4096, 2  # sequence parallel: each GEMM reads the gathered [s, b, h] input
    extra_reads = (2 + 1) * e * tokens * h  # K and V read it again, and the up projection
    assert sum(op.bytes for op in gemms["s"]) - sum(op.bytes for op in gemms["f"]) == pytest.approx(extra_reads)
    sums = [op for op in split if op.name == "grad_sum"]
    assert [op.launches for op in sums] == [2, 1] and all(op.bytes == 0 and op.flops == 0 for op in sums)
    assert not any(op.name == "qkv_split" for op in split)


def test_activation_memory_is_the_same_fused_or_apart():
    fused, split = _job("torchtitan-0.1", model={"qkv_fusion": True, "gate_up_fusion": True}), _job("torchtitan-0.1")
    held = [activations_per_microbatch(inv, inv.stages[0])[0] for inv in (count_job(fused), count_job(split))]
    assert held[0] == pytest.approx(held[1])


def test_fp8_casts_each_separate_gemm_s_input_as_fp8_prices_it():
    fused, split = (next(op for op in _layer(f, Precision.FP8, recipe=FP8Recipe.CURRENT) if op.name == "fp8_cast")
                    for f in (True, False))
    assert fused.dims == (("gemms", 4),) and split.dims == (("gemms", 7),)
    assert split.bytes > fused.bytes and split.bwd_bytes == pytest.approx(fused.bwd_bytes)


def test_separate_projections_predict_slower_than_fused_ones():
    # the SwiGLU held to one fused kernel on both sides: eager silu*mul (torchtitan-0.1's own
    # setting) on a fused gate/up output reads its chunked halves with strided kernels, measured
    # slower on H100 than separate outputs' vectorized ones (inventory/kernel_mixes.py), which is
    # the activation's layout, not the projections
    swiglu = {"swiglu_fusion": True}
    fused = _job("torchtitan-0.1", model={"qkv_fusion": True, "gate_up_fusion": True, **swiglu})
    assert predict(_job("torchtitan-0.1", model=swiglu)).iteration_s > predict(fused).iteration_s


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 65536), k=st.sampled_from([512, 1024, 4096, 8192, 12288]),
       parts=st.lists(st.integers(1, 16384), min_size=2, max_size=3))
def test_splitting_a_gemm_never_lowers_its_time_on_the_gemm_curve(m, k, parts):
    cm = AnalyticalCostModel(load_cluster("dgx-h100", num_nodes=1), Precision.BF16)
    whole = gemm("linear1", "QKV projection", m, k, sum(parts), 2, bias=False, saved=0.0)
    split = separate_gemms("linear1", tuple((str(i), n) for i, n in enumerate(parts)), "summed", m, k, 2,
                           bias=False, saved=0.0, fp8=False)
    for phase in (Phase.FWD, Phase.BWD_INPUT, Phase.BWD_WEIGHT):
        assert sum(cm.estimate_op_s(op, phase) for op in split) >= cm.estimate_op_s(whole, phase)


def test_a_gelu_model_has_no_gate_to_run_apart_and_says_so():
    with pytest.raises(ConfigError, match="gate_up_fusion: only a gated MLP"):
        resolve_job({"model": {**LLAMA3_8B, "activation": "gelu", "gate_up_fusion": False},
                     "cluster": {"name": "dgx-h100", "num_nodes": 1}, "parallel": {"global_batch_size": 8}})


def test_torchtitan_s_experts_run_gate_and_up_as_two_grouped_gemms_with_the_same_work():
    from paraplan.inventory.moe import count_moe_layer_ops

    moe = {**LLAMA3_8B, "num_moe_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 2048,
           "moe_shared_expert_intermediate_size": 2048}
    ops = {}
    for fused in (True, False):
        spec = ModelSpec(**{**moe, "gate_up_fusion": fused})
        ops[fused] = count_moe_layer_ops(spec, shard_shape(spec, 1, 1, False, 1, Precision.BF16))
    for name, widths in (("expert_fc1", [2048, 2048]), ("shared_fc1", [2048, 2048])):
        split = [op for op in ops[False] if op.name == name]
        whole = [op for op in ops[True] if op.name == name]
        assert [dict(op.dims)["n"] for op in split] == widths and dict(whole[0].dims)["n"] == 4096
        assert sum(op.flops for op in split) == pytest.approx(whole[0].flops)
        assert sum(op.params for op in split) == pytest.approx(whole[0].params)
    assert sum(op.saved_bytes for op in ops[False]) == pytest.approx(sum(op.saved_bytes for op in ops[True]))
    assert [op.role for op in ops[False] if op.name == "grad_sum"] == [
        "experts' input gradients summed", "shared experts input gradients summed"]  # q, k, v stay fused
