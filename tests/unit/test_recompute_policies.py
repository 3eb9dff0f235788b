"""Recompute as frameworks offer it (inventory.recompute): Megatron-LM's granularity, method and
number of layers (megatron/core/transformer/transformer_config.py), torchtitan's selective layer
and op policies (torchtitan/models/llama/parallelize_llama.py) and fms-fsdp's every n-th block."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.catalog import resolve_job
from paraplan.inventory import OpKind, count_job
from paraplan.prediction import predict
from paraplan.specs import ConfigError

MODEL = {"name": "llama-2-7b", "seq_length": 4096, "num_layers": 8}


def job(recompute="none", framework="megatron", **parallel):
    plan = {"micro_batch_size": 1, "global_batch_size": 8, "recompute": recompute, "framework": framework, **parallel}
    return resolve_job({"model": MODEL, "cluster": {"name": "dgx-a100"}, "parallel": plan})


def seconds(j):
    p = predict(j)
    return p.stages[0].forward_mb_s, p.stages[0].recompute_mb_s, p.memory[0].activations


def test_megatron_block_recomputes_only_its_first_layers():
    _, full_rc, _ = seconds(job("full"))
    _, block_rc, _ = seconds(job("full", recompute_method="block", recompute_num_layers=2))
    assert block_rc == pytest.approx(full_rc * 2 / 8, rel=1e-9)


def test_megatron_uniform_groups_keep_one_input_per_group_and_recompute_every_layer():
    _, rc1, mem1 = seconds(job("full"))
    _, rc4, mem4 = seconds(job("full", recompute_method="uniform", recompute_num_layers=4))
    assert rc4 == pytest.approx(rc1)
    inv = count_job(job("full"))
    x = inv.shape
    layer_input = x.e * x.b * x.s_norm * x.h
    layer_saved = sum(op.saved_bytes for op in inv.stages[0].layer_ops)
    # 8 inputs + 1 layer's activations vs 2 inputs + 4 layers' activations
    assert mem4 - mem1 == pytest.approx((2 - 8) * layer_input + (4 - 1) * layer_saved, rel=1e-9)


def test_torchtitan_layer_policy_recomputes_every_nth_layer():
    _, full_rc, _ = seconds(job("full", "fsdp"))
    _, half_rc, _ = seconds(job("layer", "fsdp"))
    _, third_rc, _ = seconds(job("layer", "fsdp", recompute_every=4))
    assert half_rc == pytest.approx(full_rc / 2)
    assert third_rc == pytest.approx(full_rc / 4)


def test_torchtitan_op_policy_reruns_half_the_matmuls_and_all_elementwise_kernels_but_not_attention():
    j = job("op", "fsdp")
    p = predict(j)
    ops = {o.name: o for o in p.layer_ops}
    gemms = sum(o.fwd_s for o in p.layer_ops if o.kind == OpKind.GEMM.value)
    elementwise = sum(o.fwd_s for o in p.layer_ops if o.kind not in ("gemm", "attention", "bmm", "softmax"))
    per_layer = sum(o.recompute_s for o in p.layer_ops)
    assert ops["flash_atten"].recompute_s == 0.0
    assert per_layer == pytest.approx(0.5 * gemms + elementwise)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([("none", {}), ("op", {}), ("layer", {"recompute_every": 2}), ("layer", {"recompute_every": 3})]))
def test_no_policy_recomputes_more_than_full_or_keeps_more_than_none(case):
    policy, extra = case
    _, rc, mem = seconds(job(policy, "fsdp", **extra))
    _, rc_full, mem_full = seconds(job("full", "fsdp"))
    _, rc_none, mem_none = seconds(job("none", "fsdp"))
    assert rc_none <= rc <= rc_full + 1e-12
    assert mem_full <= mem + 1e-6 and mem <= mem_none + 1e-6


def test_hardware_flops_count_what_each_policy_recomputes():
    model_flops = predict(job("none", "fsdp")).model_flops_per_iteration
    hw = {p: count_job(job(p, "fsdp")).hardware_flops_per_iteration for p in ("none", "layer", "full")}
    assert model_flops < hw["none"] < 1.05 * model_flops  # FlashAttention's backward recompute
    assert hw["layer"] - hw["none"] == pytest.approx((hw["full"] - hw["none"]) / 2)


@pytest.mark.parametrize(
    ("framework", "policy", "choices"),
    [("megatron", "op", "none, selective, full"), ("fsdp", "selective", "none, full, layer, op")],
)
def test_a_policy_the_framework_lacks_is_refused_with_its_choices(framework, policy, choices):
    with pytest.raises(ConfigError, match=f"has no '{policy}' recompute \\(it has: {choices}\\)"):
        job(policy, framework)


def test_megatron_method_needs_full_recompute():
    with pytest.raises(ConfigError, match="recompute_method"):
        job("selective", recompute_method="block", recompute_num_layers=2)
