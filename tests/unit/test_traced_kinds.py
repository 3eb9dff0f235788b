"""Operator kinds of their own for state-space and linear-attention layers (inventory.scan_kinds,
costmodel.scan_rooflines), and traced models with more than one layer kind predicted stage by
stage (inventory.job.kinds_per_stage)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paraplan.costmodel.scan_rooflines import SCAN_KINDS, scan_gaps, scan_op_s
from paraplan.inventory.ops import Op, OpKind
from paraplan.inventory.scan_kinds import (
    causal_conv1d_work,
    gated_delta_work,
    selective_scan_work,
    ssd_scan_work,
)
from paraplan.specs import Phase

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Traces go to the test's own directory, never the user's cache (nothing here imports torch
    before a test needs it)."""
    from paraplan.inventory import hftrace, traced

    monkeypatch.setenv("PARAPLAN_CACHE_DIR", str(tmp_path / "cache"))
    for cached in (hftrace._cached, traced.traced_layers):
        cached.cache_clear()


def _gpu():
    from paraplan.catalog.loader import load_gpu

    return load_gpu("H100-SXM5-80GB")


# ---------------------------------------------------------------- the cited formulas


def test_a_causal_conv1d_does_two_flops_per_tap_and_moves_its_input_and_output_once():
    w = causal_conv1d_work(b=2, s=8, channels=16, width=4, e=2)
    assert w.flops == 2 * 2 * 8 * 16 * 4
    assert w.bytes == 2 * (2 * 8 * 16 * 2) + 16 * 4 * 2
    assert w.bwd_flops == 2 * w.flops


def test_the_ssd_scan_counts_the_four_chunked_products_of_mamba_2():
    b, s, h, p, n, g, q = 1, 64, 8, 64, 16, 2, 32
    w = ssd_scan_work(b, s, h, p, n, g, q, e=2)
    # C B^T per group, (L o C B^T) X per head, B^T X and C h per head (Dao & Gu 2024, section 6)
    assert w.flops == 2 * s * q * n * g + 2 * s * q * p * h + 2 * 2 * s * n * p * h
    states = 4 * 4 * (s // q) * h * n * p
    assert w.bytes == s * (2 * h * p + 2 * g * n + h) * 2 + states
    assert w.bwd_flops == 2 * w.flops


def test_the_selective_scan_is_nine_flops_per_channel_state_and_token():
    w = selective_scan_work(b=1, s=64, channels=512, state=16, e=2)
    assert w.flops == 9 * 64 * 512 * 16
    assert w.bytes == 64 * (4 * 512 + 2 * 16) * 2


def test_gated_deltanet_chunks_count_the_wy_products_the_solve_and_the_state_work():
    b, s, h, hk, dk, dv, q = 1, 128, 4, 2, 32, 32, 64
    w = gated_delta_work(b, s, h, hk, dk, dv, q, e=2)
    assert w.flops == pytest.approx(2 * s * h * (3 * q * dk + 2 * q * dv + q * q / 3 + 3 * dk * dv))
    assert w.bwd_flops == 2 * w.flops


# ---------------------------------------------------------------- their roofline


def _op(kind: OpKind, flops: float, traffic: float) -> Op:
    return Op(name="x", kind=kind, role="uncalibrated: x", flops=flops, bytes=traffic, bwd_flops=0.0, bwd_bytes=0.0)


def test_a_chunked_scan_runs_on_the_tensor_cores_and_a_selective_scan_on_the_cuda_cores():
    gpu = _gpu()
    peak = gpu.peak_flops[next(p for p in gpu.peak_flops if p.value == "bf16")]
    big = 1e13  # compute-bound: the bytes are negligible
    ssd = scan_op_s(_op(OpKind.SSM_SCAN, big, 1.0), Phase.FWD, gpu, peak)
    scan = scan_op_s(_op(OpKind.SELECTIVE_SCAN, big, 1.0), Phase.FWD, gpu, peak)
    fp32 = gpu.peak_flops[next(p for p in gpu.peak_flops if p.value == "fp32")]
    assert scan / ssd == pytest.approx(peak / fp32, rel=1e-3)


def test_a_causal_convolution_is_timed_by_its_bytes_whatever_its_flops():
    gpu = _gpu()
    one = scan_op_s(_op(OpKind.CAUSAL_CONV1D, 1e9, 1e9), Phase.FWD, gpu, 1e15)
    more = scan_op_s(_op(OpKind.CAUSAL_CONV1D, 1e12, 1e9), Phase.FWD, gpu, 1e15)
    assert one == more > 0


def test_every_new_kind_says_it_is_uncalibrated_and_names_its_formula():
    notes = scan_gaps(_gpu(), [_op(kind, 1e9, 1e9) for kind in SCAN_KINDS])
    assert len(notes) == len(SCAN_KINDS)
    assert all("no measured kernel" in n for n in notes)
    assert any("Dao & Gu 2024" in n for n in notes) and any("Yang et al. 2025" in n for n in notes)


# ---------------------------------------------------------------- recognised in a trace

TINY_MAMBA2 = {"model_type": "mamba2", "vocab_size": 1000, "hidden_size": 256, "num_hidden_layers": 2,
               "num_heads": 8, "head_dim": 64, "n_groups": 2, "state_size": 16, "expand": 2, "conv_kernel": 4,
               "chunk_size": 32, "time_step_rank": 16, "tie_word_embeddings": False}


def _kinds(config: dict, seq: int = 64):
    from paraplan.inventory.hftrace import trace_model
    from paraplan.inventory.traced import layer_ops_from_trace

    trace = trace_model(config, 1, seq)
    return [layer_ops_from_trace(layer) for layer in trace.layers], trace


def test_a_traced_mamba_2_mixer_is_a_causal_conv1d_and_an_ssd_scan_with_the_papers_work():
    pytest.importorskip("transformers")
    (ops,), trace = _kinds(TINY_MAMBA2)
    by_kind = {op.kind: op for op in ops}
    conv, scan = by_kind[OpKind.CAUSAL_CONV1D], by_kind[OpKind.SSM_SCAN]
    # intermediate 2 x 256 = 512 plus B and C (2 groups x 16): 576 channels, width 4
    assert conv.flops == causal_conv1d_work(1, 64, 576, 4, 2).flops
    assert dict(scan.dims) == {"b": 1, "s": 64, "heads": 8, "head_dim": 64, "state": 16, "groups": 2, "chunk": 32}
    assert scan.flops == ssd_scan_work(1, 64, 8, 64, 16, 2, 32, 2).flops
    assert scan.role.startswith("uncalibrated:") and conv.role.startswith("uncalibrated:")
    # no parameter is lost: the mixer's A_log, D, dt_bias and its Conv1d's weights go to the scan
    assert sum(op.params for op in ops) == trace.layers[0].params


def test_a_traced_gated_deltanet_is_a_causal_conv1d_and_a_linear_attention_chunk_kernel():
    pytest.importorskip("transformers")
    config = json.loads((FIXTURES / "qwen3-next-80b-a3b.json").read_text())
    config.update(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                  linear_key_head_dim=32, linear_value_head_dim=32, num_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=64, shared_expert_intermediate_size=64, vocab_size=1000)
    layers, _ = _kinds(config)
    linear = next(ops for ops in layers if any(op.kind is OpKind.LINEAR_ATTENTION for op in ops))
    op = next(op for op in linear if op.kind is OpKind.LINEAR_ATTENTION)
    assert dict(op.dims) == {"b": 1, "s": 64, "heads": 4, "key_heads": 2, "dk": 32, "dv": 32, "chunk": 64}
    assert op.flops == pytest.approx(gated_delta_work(1, 64, 4, 2, 32, 32, 64, 2).flops)


def test_jambas_mamba_1_mixer_is_a_selective_scan():
    pytest.importorskip("transformers")
    config = json.loads((FIXTURES / "jamba-v0.1.json").read_text())
    config.update(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, vocab_size=1000, mamba_d_state=16,
                  mamba_dt_rank=16, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                  expert_layer_offset=1)
    layers, _ = _kinds(config)
    scans = [op for ops in layers for op in ops if op.kind is OpKind.SELECTIVE_SCAN]
    assert [dict(op.dims) for op in scans] == [{"b": 1, "s": 64, "channels": 512, "state": 16}]


# ---------------------------------------------------------------- more than one layer kind


def _job(fixture: str, pp: int = 1, ep: int = 1, **model):
    from paraplan.catalog.jobs import resolve_job

    spec = {"hf_config": str(FIXTURES / fixture), "seq_length": 1024, "inventory": "traced", **model}
    return resolve_job({"name": "t", "model": spec, "cluster": {"name": "aws-p5.48xlarge", "num_nodes": 1},
                        "parallel": {"pp": pp, "ep": ep, "micro_batch_size": 1, "global_batch_size": 16},
                        "precision": "bf16"})


def _blocks(inv):
    return [{b.kind: b.num_layers for b in st.blocks} for st in inv.stages]


@pytest.mark.parametrize(("fixture", "kinds", "params"), [
    # Gemma 2: sliding-window and full attention alternate, 13 of each
    ("gemma-2-2b.json", {"sliding_attention-dense@0": 13, "full_attention-dense@1": 13}, 2_614_341_888),
    # Codestral Mamba: 64 Mamba-2 layers
    ("mamba-codestral-7b.json", {"linear_attention-dense@0": 64}, 7_285_403_648),
    # Nemotron-H 8B: 24 Mamba-2, 24 MLP and 4 attention layers (its hybrid_override_pattern)
    ("nemotron-h-8b.json", {"linear_attention-dense@0": 24, "mlp-dense@1": 24, "full_attention-dense@7": 4}, None),
])
def test_a_traced_hybrid_predicts_each_stage_from_the_layers_it_holds(fixture, kinds, params):
    pytest.importorskip("transformers")
    from paraplan.inventory import count_job
    from paraplan.prediction.entry import predict_any

    one, two = count_job(_job(fixture)), count_job(_job(fixture, pp=2))
    assert _blocks(one) == [kinds]
    # two stages hold the layers in order, each kind counted per stage, all of them once
    assert {k: sum(s.get(k, 0) for s in _blocks(two)) for k in kinds} == kinds
    assert one.params_total == pytest.approx(two.params_total)
    if params is not None:
        assert one.params_total == params
    pred = predict_any(_job(fixture))
    assert pred.iteration_s > 0
    if "mamba" in fixture or "nemotron" in fixture:
        assert any("Mamba-2 SSD" in n for n in pred.uncalibrated)


def test_a_traced_hybrid_with_experts_holds_each_kind_and_spreads_the_experts_over_ep():
    pytest.importorskip("transformers")
    from paraplan.inventory import count_job
    from paraplan.inventory.ops import ParallelDim

    # Jamba v0.1: attention every 8th layer from 4, experts every 2nd from 1 (its config)
    inv = count_job(_job("jamba-v0.1.json", ep=8))
    blocks = {b.kind: b for b in inv.stages[0].blocks}
    assert {k: (b.num_layers, b.moe) for k, b in blocks.items()} == {
        "linear_attention-dense@0": (12, False), "linear_attention-moe@1": (16, True),
        "full_attention-dense@4": (4, False)}
    assert any(c.dim is ParallelDim.EP for c in blocks["linear_attention-moe@1"].collectives)
    assert not any(c.dim is ParallelDim.EP for c in blocks["full_attention-dense@4"].collectives)


def test_more_layers_never_take_less_time():
    pytest.importorskip("transformers")
    from paraplan.prediction.entry import predict_any

    config = json.loads((FIXTURES / "nemotron-h-8b.json").read_text())
    times = []
    for pattern in ("M-M*", "M-M*M-", "M-M*M-M-M*", "M-M*M-M-M*M-M-"):
        times.append(_time_of(dict(config, num_hidden_layers=len(pattern), hybrid_override_pattern=pattern),
                              predict_any))
    assert times == sorted(times) and len(set(times)) == len(times)


def _time_of(config: dict, predict_any) -> float:
    import tempfile

    from paraplan.catalog.jobs import resolve_job

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.json"
        path.write_text(json.dumps(config))
        job = resolve_job({"name": "t", "model": {"hf_config": str(path), "seq_length": 1024, "inventory": "traced"},
                           "cluster": {"name": "aws-p5.48xlarge", "num_nodes": 1},
                           "parallel": {"micro_batch_size": 1, "global_batch_size": 16}, "precision": "bf16"})
        return predict_any(job).iteration_s


# ---------------------------------------------------------------- attention variants


def test_chunked_attention_executes_a_causal_triangle_per_chunk():
    from paraplan.inventory.traced import _chunk_fraction

    assert _chunk_fraction(8192, 8192, 8192) == 0.5  # one chunk: the causal half
    assert _chunk_fraction(8192, 8192, 2048) == pytest.approx(4 * 2048**2 / (2 * 8192**2))  # an eighth
    assert _chunk_fraction(5000, 5000, 2048) == pytest.approx((2 * 2048**2 + 904**2) / (2 * 5000**2))


def test_soft_capped_and_sink_attention_say_they_are_timed_as_plain_flash_attention():
    from paraplan.costmodel.scan_rooflines import attention_variant_gaps

    def core(role: str) -> Op:
        return Op(name="flash_atten", kind=OpKind.ATTENTION, role=role, flops=1e9, bytes=1e6, bwd_flops=0.0,
                  bwd_bytes=0.0)

    notes = attention_variant_gaps(_gpu(), [core("traced attention core (flash, soft cap 50.0, causal)"),
                                            core("traced attention core (flash, sinks, causal)")])
    assert len(notes) == 2 and all("timed as plain flash attention" in n for n in notes)
    assert attention_variant_gaps(_gpu(), [core("traced attention core (flash, sliding window 4096, causal)")]) == ()


def test_gemma_2s_sliding_layers_execute_only_their_window_and_the_prediction_names_the_soft_cap():
    pytest.importorskip("transformers")
    from paraplan.inventory import count_job
    from paraplan.prediction.entry import predict_any

    job = _job("gemma-2-2b.json", seq_length=8192)
    cores = {b.kind: next(op for op in b.ops if op.kind is OpKind.ATTENTION) for b in count_job(job).stages[0].blocks}
    sliding, full = cores["sliding_attention-dense@0"], cores["full_attention-dense@1"]
    # a window of 4,096 keys over 8,192 queries: 3/8 of the square, against the causal half
    assert sliding.exec_fraction == pytest.approx((4096 * 8192 - 4096 * 4095 / 2) / 8192**2)
    assert full.exec_fraction == 0.5
    assert any("soft-capping" in n for n in predict_any(job).uncalibrated)


def test_a_stage_holds_the_kinds_of_the_layers_it_holds_not_an_even_share_of_each():
    pytest.importorskip("transformers")
    from paraplan.inventory import count_job

    # Gemma 2 9B: 42 layers alternating sliding (even) and full (odd): 21 per stage of two
    inv = count_job(_job("gemma-2-9b.json", pp=2))
    assert _blocks(inv) == [{"sliding_attention-dense@0": 11, "full_attention-dense@1": 10},
                            {"sliding_attention-dense@0": 10, "full_attention-dense@1": 11}]
