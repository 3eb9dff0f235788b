"""The operator inventory traced from a Hugging Face model's own code (inventory.hftrace,
inventory.traced), and its agreement with the hand-written inventory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paraplan.inventory.traced import _window_fraction
from paraplan.specs import ConfigError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Traces go to the test's own directory, never the user's cache."""
    monkeypatch.setenv("PARAPLAN_CACHE_DIR", str(tmp_path / "cache"))
    try:
        from paraplan.inventory import hftrace
    except ImportError:  # pragma: no cover
        return
    hftrace._cached.cache_clear()


def _hand(path: Path, seq: int, **extra):
    from paraplan.catalog.hf import model_from_hf_config
    from paraplan.inventory import count_layer_ops, shard_shape
    from paraplan.specs import ModelSpec, Precision

    model = ModelSpec(**model_from_hf_config(path, {"seq_length": seq, **extra}))
    return count_layer_ops(model, shard_shape(model, 1, 1, False, 1, Precision.BF16))


def test_a_causal_kernel_executes_half_the_square_and_a_window_only_its_band():
    assert _window_fraction(4096, 4096, None, True) == 0.5
    assert _window_fraction(4096, 4096, 8192, True) == 0.5
    assert _window_fraction(4096, 4096, None, False) == 1.0
    # 1024 keys behind each of 4096 queries: (1024*4096 - 1024*1023/2) / 4096^2
    assert _window_fraction(4096, 4096, 1024, True) == pytest.approx((1024 * 4096 - 1024 * 1023 / 2) / 4096**2)


def test_a_tiny_llama_traced_from_its_code_agrees_with_the_hand_written_layer(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from paraplan.inventory.hftrace import trace_model
    from paraplan.inventory.traced import compare_layer, layer_ops_from_trace

    trace = trace_model(TINY_LLAMA, 1, 128)
    assert [layer.count for layer in trace.layers] == [3]  # three equal layers: one kind, traced once
    # 3 layers x (attention 256*(256+2*128)+256*256, MLP 3*256*512, norms 2*256), embedding, head, final norm
    layer = 256 * 512 + 256 * 256 + 3 * 256 * 512 + 2 * 256
    assert trace.layers[0].params == layer
    assert trace.total_params == 3 * layer + 2 * 1000 * 256 + 256
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    rows = {r.quantity: r for r in compare_layer(layer_ops_from_trace(trace.layers[0]), _hand(path, 128))}
    assert rows["parameters"].traced == rows["parameters"].hand
    assert rows["GEMM FLOPs (fwd)"].traced == rows["GEMM FLOPs (fwd)"].hand
    assert rows["attention FLOPs (fwd)"].traced == rows["attention FLOPs (fwd)"].hand
    assert abs(rows["backward FLOPs"].relative) < 0.01


@pytest.mark.slow
def test_llama_3_8b_traced_has_its_published_parameters_and_the_hand_written_flops():
    """The golden comparison of issue 28 for Llama: parameters exact (8,030,261,248, the count
    Meta publishes), FLOPs within 1 %; saved activations differ by what HF's eager code keeps
    and Megatron's fused kernels do not: LlamaRMSNorm's float32 copy of its input (4 bytes an
    element, two norms) and the rotary cos/sin tables."""
    pytest.importorskip("transformers")
    from paraplan.inventory.hftrace import read_config, trace_layer_ops
    from paraplan.inventory.traced import compare_layer, layer_ops_from_trace

    path = FIXTURES / "llama-3-8b.json"
    trace = trace_layer_ops(read_config(path), 1, 4096)
    assert trace.total_params == 8_030_261_248
    rows = {r.quantity: r for r in compare_layer(layer_ops_from_trace(trace.layers[0]),
                                                 _hand(path, 4096, swiglu_fusion=False))}
    assert rows["parameters"].relative == 0
    for quantity in ("forward FLOPs", "backward FLOPs", "GEMM FLOPs (fwd)", "attention FLOPs (fwd)"):
        assert abs(rows[quantity].relative) < 0.01, quantity
    tokens, hidden, d = 4096, 4096, 128
    eager_extra = 2 * 4 * tokens * hidden + 2 * 2 * tokens * d  # fp32 norm inputs; cos and sin
    norm_rsqrt = 2 * 4 * tokens  # each norm's float32 1/rms, which a fused kernel keeps as well
    assert rows["saved activations"].traced - rows["saved activations"].hand == eager_extra + norm_rsqrt


@pytest.mark.slow
def test_the_hand_written_layer_with_eager_rmsnorm_and_swiglu_saves_what_hf_llama_saves():
    """``rmsnorm_fusion: false`` and ``swiglu_fusion: false`` describe Hugging Face's eager
    LlamaDecoderLayer (run by ATorch's DeepSpeed pipeline, by HF Trainer): the saved bytes then
    differ from the traced layer's only by the rotary cos/sin tables and each norm's float32
    1/rms (per token), which the hand-written inventory leaves out either way."""
    pytest.importorskip("transformers")
    from paraplan.inventory.hftrace import read_config, trace_layer_ops
    from paraplan.inventory.traced import compare_layer, layer_ops_from_trace

    path = FIXTURES / "llama-3-8b.json"
    trace = trace_layer_ops(read_config(path), 1, 4096)
    rows = {r.quantity: r for r in compare_layer(layer_ops_from_trace(trace.layers[0]),
                                                 _hand(path, 4096, swiglu_fusion=False, rmsnorm_fusion=False))}
    tokens, d = 4096, 128
    assert rows["saved activations"].traced - rows["saved activations"].hand == 2 * 2 * tokens * d + 2 * 4 * tokens


def test_a_model_type_transformers_cannot_build_is_refused_in_one_line():
    pytest.importorskip("transformers")
    from paraplan.inventory.hftrace import trace_model

    with pytest.raises(ConfigError, match=r"model_type 'no-such-model'.*cannot build") as info:
        trace_model({"model_type": "no-such-model", "hidden_size": 8}, 1, 8)
    assert "\n" not in str(info.value)


def test_a_config_that_needs_remote_code_is_refused_unless_the_user_says_so():
    pytest.importorskip("transformers")
    from paraplan.inventory.hftrace import trace_model

    config = {**TINY_LLAMA, "auto_map": {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}}
    with pytest.raises(ConfigError, match=r"auto_map.*--trust-remote-code"):
        trace_model(config, 1, 8)


def test_a_trace_is_kept_on_disk_and_read_back_unchanged(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from paraplan.inventory import hftrace

    monkeypatch.setenv("PARAPLAN_CACHE_DIR", str(tmp_path))
    first = hftrace.trace_layer_ops(TINY_LLAMA, 2, 64)
    files = list((tmp_path / "hftrace").glob("*.json"))
    assert len(files) == 1
    hftrace._cached.cache_clear()
    monkeypatch.setattr(hftrace, "trace_model", lambda *a, **k: pytest.fail("traced again"))
    assert hftrace.trace_layer_ops(TINY_LLAMA, 2, 64) == first


def test_a_sliding_window_model_records_its_window_on_the_attention_core():
    pytest.importorskip("transformers")
    from paraplan.inventory.hftrace import trace_model
    from paraplan.inventory.ops import OpKind
    from paraplan.inventory.traced import layer_ops_from_trace

    config = {**TINY_LLAMA, "model_type": "mistral", "sliding_window": 32}
    ops = layer_ops_from_trace(trace_model(config, 1, 128).layers[0])
    core = next(op for op in ops if op.kind is OpKind.ATTENTION)
    assert "sliding window 32" in core.role
    assert core.exec_fraction == pytest.approx(_window_fraction(128, 128, 32, True))


def test_inventory_trace_prints_the_operators_at_80_columns_and_compares_them(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from typer.testing import CliRunner

    from paraplan.cli.app import app

    monkeypatch.setenv("COLUMNS", "80")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    result = CliRunner().invoke(app, ["inventory", "trace", str(path), "-s", "128", "--compare"])
    assert result.exit_code == 0, result.output
    assert "self_attn.q_proj" in result.output and "flash_atten" in result.output
    assert "traced vs hand-written" in result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80


def test_inventory_trace_of_an_unbuildable_model_type_is_one_line_with_exit_code_2(tmp_path):
    pytest.importorskip("transformers")
    from typer.testing import CliRunner

    from paraplan.cli.app import app

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "no-such-model"}))
    result = CliRunner().invoke(app, ["inventory", "trace", str(path)])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "model_type 'no-such-model'" in result.output


def test_tracing_a_mamba_model_prints_none_of_transformers_own_warnings_and_keeps_its_verbosity(capfd):
    pytest.importorskip("transformers")
    from transformers.utils import logging

    from paraplan.inventory.hftrace import trace_model

    config = json.loads((FIXTURES / "mamba-codestral-7b.json").read_text())
    config["num_hidden_layers"] = 1
    before = logging.get_verbosity()
    trace_model(config, 1, 64)
    out, err = capfd.readouterr()
    assert "falling back" not in out + err and "[transformers]" not in out + err
    assert logging.get_verbosity() == before
