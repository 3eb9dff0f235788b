"""GPUModeling operator rows map onto the inventory operators with the right shapes."""

from __future__ import annotations

import math

import pytest

from paraplan.inventory import OpKind
from paraplan.inventory.samples import SAMPLE_TAGS, op_for_sample
from paraplan.specs import Phase

E = 2  # fp16 bytes per element


def _vp(mp: int) -> int:
    """Vocab rows per rank as the sampler padded GPT-2's vocabulary."""
    return math.ceil(50257 / (128 * mp)) * 128


@pytest.mark.parametrize(
    ("tag", "row", "mkn"),
    [
        # QKV: [l*b, dim] x [dim, 3*dim/mp]
        ("linear1", {"mp": 2.0, "b": 4.0, "l": 2048.0, "dim": 4096.0}, (8192, 4096, 6144)),
        # attention output: [l*b, dim/mp] x [dim/mp, dim]
        ("linear2", {"mp": 4.0, "b": 2.0, "l": 1024.0, "dim": 4096.0}, (2048, 1024, 4096)),
        # MLP up: [l*b, dim] x [dim, 4*dim/mp]
        ("linear3", {"mp": 2.0, "b": 2.0, "l": 1536.0, "dim": 5120.0}, (3072, 5120, 10240)),
        # MLP down: [l*b, 4*dim/mp] x [4*dim/mp, dim]
        ("linear4", {"mp": 8.0, "b": 8.0, "l": 1024.0, "dim": 4096.0}, (8192, 2048, 4096)),
        # LM head: [l*b, dim] x [dim, Vp]
        ("linear_final", {"mp": 4.0, "b": 2.0, "l": 2048.0, "dim": 3072.0}, (4096, 3072, _vp(4))),
    ],
)
def test_linear_rows_are_the_sampled_gemms(tag, row, mkn):
    m, k, n = mkn
    op = op_for_sample(tag, row)
    assert op.name == tag and op.kind is OpKind.GEMM
    assert dict(op.dims) == {"m": m, "k": k, "n": n}
    assert op.work(Phase.FWD)[0] == 2.0 * m * k * n
    # backward = input gradient + weight gradient, one GEMM of the same size each
    assert op.work(Phase.BWD_INPUT)[0] == 2.0 * m * k * n
    assert op.work(Phase.BWD_WEIGHT)[0] == 2.0 * m * k * n


def test_linear1_has_bias_and_the_others_do_not():
    row = {"mp": 2.0, "b": 4.0, "l": 2048.0, "dim": 4096.0}
    assert op_for_sample("linear1", row).params == 4096 * 6144 + 6144
    assert op_for_sample("linear3", row).params == 4096 * 8192


def test_vp_column_overrides_the_padded_vocabulary():
    row = {"mp": 2.0, "b": 2.0, "l": 1024.0, "dim": 2048.0, "Vp": 25344.0}
    assert dict(op_for_sample("linear_final", row).dims)["n"] == 25344
    assert dict(op_for_sample("embedding", row).dims)["vocab"] == 25344
    assert dict(op_for_sample("linear_final", {k: v for k, v in row.items() if k != "Vp"}).dims)["n"] == _vp(
        2
    )


def test_unfused_attention_rows():
    b, h, seq, dim, mp = 4, 32, 2048, 4096, 2
    row = {"mp": mp, "b": b, "h": h, "l": seq, "dim": dim}
    d, heads = dim // h, h // mp
    for tag in ("baddbmm", "bmm"):
        op = op_for_sample(tag, row)
        assert op.kind is OpKind.BMM
        # [b*h/mp, l, d] x [b*h/mp, d, l] (and P V): 2*b*(h/mp)*l*l*d each
        assert op.work(Phase.FWD)[0] == 2.0 * b * heads * seq * seq * d
    scores = b * heads * seq * seq
    soft = op_for_sample("softmax", {"mp": mp, "b": b, "h": h, "l": seq})
    assert soft.kind is OpKind.SOFTMAX
    assert soft.work(Phase.FWD)[1] == E * scores * 2  # read and write [b, h/mp, l, l]
    fused = op_for_sample("ScaledUpperTriangMaskedSoftmax", {"mp": 1.0, "b": 2.0, "h": 16.0, "l": 1024.0})
    assert fused.name == "softmax" and fused.work(Phase.FWD)[1] == E * 2 * 16 * 1024 * 1024 * 2


def test_flash_attention_row_is_non_causal():
    b, h, seq, dim, mp = 4, 16, 1536, 3072, 2
    op = op_for_sample("flash_atten", {"mp": mp, "b": b, "h": h, "l": seq, "dim": dim})
    full = 4.0 * b * (h // mp) * seq * seq * (dim // h)  # QK^T and PV over the full square
    assert op.kind is OpKind.ATTENTION and op.exec_fraction == 1.0
    assert op.work(Phase.FWD)[0] == full
    assert op.work(Phase.BWD_INPUT)[0] == 2.5 * full


def test_memory_bound_rows():
    b, h, seq, dim, mp = 4, 16, 2048, 4096, 4
    rope = op_for_sample("RoPE", {"mp": mp, "b": b, "h": h, "l": seq, "dim": dim})
    assert rope.work(Phase.FWD)[1] == E * 2 * (seq * b * 2 * (h // mp) * (dim // h))  # q and k, read + write
    gelu = op_for_sample("gelu", {"mp": mp, "b": b, "l": seq, "dim": dim})
    assert dict(gelu.dims)["ffn"] == 4 * dim // mp
    assert gelu.work(Phase.FWD)[1] == E * 2 * (seq * b * 4 * dim // mp)
    # norms and the residual add are not split by TP (the rows have no mp column)
    ln = op_for_sample("layernorm", {"b": 2.0, "l": 1024.0, "dim": 5632.0})
    rms = op_for_sample("RMSlayernorm", {"b": 2.0, "l": 1024.0, "dim": 5632.0})
    assert ln.work(Phase.FWD)[0] == 5.0 * 2 * 1024 * 5632
    assert rms.name == "RMSlayernorm" and rms.params == 5632
    add = op_for_sample("res_add", {"b": 2.0, "l": 1024.0, "dim": 5632.0})
    assert add.work(Phase.FWD)[1] == E * 3 * 2 * 1024 * 5632  # two reads, one write
    ce = op_for_sample("parallel_cross_entropy_128", {"mp": 2.0, "b": 8.0, "l": 4096.0})
    assert ce.name == "cross_entropy" and ce.kind is OpKind.LOSS
    assert ce.work(Phase.FWD)[0] == 5.0 * 8 * 4096 * _vp(2)
    emb = op_for_sample("embedding", {"mp": 8.0, "b": 2.0, "l": 1024.0, "dim": 2048.0})
    assert dict(emb.dims) == {"tokens": 2048, "vocab": _vp(8), "dim": 2048}


def test_every_tag_maps_to_its_inventory_operator():
    row = {"mp": 2.0, "b": 4.0, "h": 16.0, "l": 1024.0, "dim": 2048.0}
    renamed = {"ScaledUpperTriangMaskedSoftmax": "softmax", "parallel_cross_entropy_128": "cross_entropy",
               "flash_atten_causal": "flash_atten"}
    for tag in SAMPLE_TAGS:
        assert op_for_sample(tag, row).name == renamed.get(tag, tag)


def test_a_sample_timed_in_fp32_moves_twice_the_bytes_of_the_same_shape_in_fp16():
    from paraplan.specs import Precision

    row = {"b": 4.0, "l": 256.0, "dim": 256.0}
    for tag in ("layernorm", "gelu"):
        half, full = op_for_sample(tag, row), op_for_sample(tag, {**row, "mp": 1.0}, Precision.FP32)
        assert full.work(Phase.FWD)[1] == pytest.approx(2 * half.work(Phase.FWD)[1], rel=0.01)


def test_paraplans_flash_attention_samples_are_causal_and_gpumodelings_are_not():
    row = {"mp": 1.0, "b": 4.0, "h": 8.0, "l": 256.0, "dim": 256.0}
    assert op_for_sample("flash_atten", row).exec_fraction == 1.0  # flash_attn_func's default
    assert op_for_sample("flash_atten_causal", row).exec_fraction == 0.5  # as a GPT layer runs it


def test_unknown_tags_and_bad_rows_raise_value_error():
    with pytest.raises(ValueError, match="unknown GPUModeling operator tag"):
        op_for_sample("fillmask", {"mp": 1.0, "b": 4.0, "h": 16.0, "l": 1024.0, "dim": 2048.0})
    with pytest.raises(ValueError):
        op_for_sample("baddbmm", {"mp": 1.0, "b": 4.0, "h": 24.0, "l": 1024.0, "dim": 2048.0})  # dim % h
    with pytest.raises(ValueError):
        op_for_sample("linear1", {"mp": 1.0, "b": 4.0, "l": 1024.5, "dim": 2048.0})
    with pytest.raises(ValueError, match="no 'dim' column"):
        op_for_sample("linear1", {"mp": 1.0, "b": 4.0, "l": 1024.0})
