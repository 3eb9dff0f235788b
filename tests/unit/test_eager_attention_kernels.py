"""The attention-side kernels eager framework model code runs that a fused stack does not: the
rotary embedding in float32 (torchtitan's complex multiply, IBM fms' 2 x 2 rotation matrices)
and grouped K and V repeated to every query head before the attention kernel (torchtitan 2024's
``repeat_kv``, fms' ``expand(...).flatten(1, 2)``). Sources: pytorch/torchtitan
models/llama/model.py of 2024-08 and 0.3.0's models/common/rope.py; ibm-fms 0.0.3 / 0.0.4
fms/modules/positions.py and attention.py."""

import pytest

from paraplan.catalog import resolve_job
from paraplan.catalog.presets import _preset, find_preset
from paraplan.costmodel.roofline import AnalyticalCostModel, op_curves
from paraplan.inventory import count_job
from paraplan.inventory.layer import EAGER_ROPE
from paraplan.prediction.memory import activations_per_microbatch
from paraplan.specs import ConfigError, Phase

SEQ, MBS = 4096, 2


def layer(model="llama-3-8b", **fields):
    job = resolve_job({"model": {"name": model, "seq_length": SEQ, **fields}, "cluster": {"name": "dgx-a100"},
                       "parallel": {"framework": "fsdp", "micro_batch_size": MBS, "global_batch_size": 16}})
    inv = count_job(job)
    return job, inv, {op.name: op for op in inv.stages[0].layer_ops}


def rotated(model):
    """q's and k's elements one micro-batch rotates in a layer."""
    job, _, _ = layer(model)
    m = job.model
    return SEQ * MBS * (m.num_attention_heads + m.num_query_groups) * (m.hidden_size // m.num_attention_heads)


def test_torchtitans_complex_rope_moves_a_float32_cast_a_complex_multiply_and_a_cast_back_per_tensor():
    _, _, ops = layer(rope_impl="complex")
    rope = ops[EAGER_ROPE["complex"]]
    assert "RoPE" not in ops
    n = rotated("llama-3-8b")
    # bf16: cast (2 + 4), multiply (4 + 4), cast back (4 + 2) each way; three kernels per tensor
    assert rope.bytes == pytest.approx(20 * n) and rope.bwd_bytes == pytest.approx(20 * n)
    assert rope.launches == 6 and rope.saved_bytes == 0  # the multiply keeps a view of the freqs_cis buffer


def test_fms_rotation_rope_doubles_each_pair_in_float32_and_keeps_the_gathered_matrices():
    _, _, ops = layer("llama-2-7b", rope_impl="rotation")
    rope = ops[EAGER_ROPE["rotation"]]
    n, head = rotated("llama-2-7b"), 128
    matrices = 4 * 2 * head * SEQ * MBS  # float32 [b, s, d/2, 2, 2]
    # bf16: cast (2 + 4), multiply into 2 x 2 (4 + 8), sum (8 + 4), cast back (4 + 2)
    assert rope.bytes == pytest.approx(36 * n + 2 * matrices) and rope.bwd_bytes == pytest.approx(36 * n)
    assert rope.saved_bytes == pytest.approx(matrices) and rope.launches == 9


@pytest.mark.parametrize("impl", ["complex", "rotation"])
def test_an_eager_rope_is_timed_by_its_bytes_on_the_memory_curve_never_on_the_sampled_rope_curve(impl):
    job, _, ops = layer(rope_impl=impl)
    gpu, cm = job.cluster.gpu, AnalyticalCostModel(job.cluster, job.precision)
    rope = ops[EAGER_ROPE[impl]]
    for phase in (Phase.FWD, Phase.BWD_INPUT):
        _, memory, special = op_curves(rope, phase, gpu.efficiency)
        assert not special and memory is gpu.efficiency.memory
        expected = (rope.work(phase)[1] + rope.launches * memory.half_work) / (
            gpu.hbm_bandwidth_bytes_per_s * memory.max_fraction) + rope.launches * gpu.efficiency.kernel_overhead_s
        assert cm.estimate_op_s(rope, phase) == pytest.approx(expected)


def test_repeating_grouped_kv_copies_them_forward_sums_them_backward_and_the_kernel_keeps_every_head():
    _, grouped_inv, grouped = layer()
    _, copied_inv, copied = layer(gqa_expand="copy")
    assert "kv_repeat" not in grouped
    repeat, heads, groups, d = copied["kv_repeat"], 32, 8, 128
    tokens = SEQ * MBS
    assert repeat.bytes == pytest.approx(2 * 2 * tokens * (groups + heads) * d) == repeat.bwd_bytes
    assert repeat.saved_bytes == 0 and repeat.launches == 2
    extra = 2 * 2 * tokens * (heads - groups) * d  # K and V at every head, bf16
    assert copied["flash_atten"].saved_bytes - grouped["flash_atten"].saved_bytes == pytest.approx(extra)
    held = activations_per_microbatch(grouped_inv, grouped_inv.stages[0])[0]
    assert activations_per_microbatch(copied_inv, copied_inv.stages[0])[0] > held


def test_a_model_without_grouped_queries_copies_nothing_whatever_gqa_expand_says():
    _, _, plain = layer("llama-2-7b")
    _, _, copied = layer("llama-2-7b", gqa_expand="copy")
    assert "kv_repeat" not in copied and copied["flash_atten"] == plain["flash_atten"]


def test_the_defaults_keep_one_fused_rope_and_grouped_kv():
    _, _, ops = layer()
    assert "RoPE_fused" in ops and "RoPE" not in ops and "kv_repeat" not in ops
    assert not set(EAGER_ROPE.values()) & set(ops)


@pytest.mark.parametrize(("preset", "rope", "expand"), [
    ("fms-fsdp-2024.03", "rotation", "copy"), ("torchtitan-0.1", "complex", "copy"), ("torchtitan-0.3", "complex", None),
    ("megatron-core-0.12", None, None), ("nemo-24.07", None, None)])
def test_each_preset_says_how_its_model_code_rotates_and_repeats_with_a_source(preset, rope, expand):
    defaults = {d.field: d for d in find_preset(preset).model_defaults}
    assert (defaults["rope_impl"].value if "rope_impl" in defaults else None) == rope
    assert (defaults["gqa_expand"].value if "gqa_expand" in defaults else None) == expand
    assert all(len(defaults[f].source) > 40 for f in ("rope_impl", "gqa_expand") if f in defaults)


def test_a_preset_giving_rope_impl_a_value_the_model_has_not_is_refused_naming_it():
    raw = {"name": "x", "version": "1", "engine": "fsdp", "label": "x",
           "model_defaults": {"rope_impl": {"value": "fused", "source": "somewhere long enough"}}}
    with pytest.raises(ConfigError, match=r"x.yaml: model_defaults.rope_impl: .*not one of its values"):
        _preset(raw, "x.yaml")


def test_an_eager_rope_on_a_model_without_rotary_embeddings_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"rope_impl: only rotary position embeddings .*position_embedding is learned"):
        resolve_job({"model": {"name": "gpt3-125m", "rope_impl": "complex"}, "cluster": {"name": "dgx-a100"},
                     "parallel": {"global_batch_size": 8}})
