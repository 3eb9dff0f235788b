"""The itemised inventory against published numbers (each test cites its source)."""

import pytest

from paraplan.catalog import load_model, resolve_job
from paraplan.inventory import count_job, count_layer_ops, count_params, shard_shape
from paraplan.specs import ModelSpec, Precision


def _job(model, **parallel):
    plan = {"micro_batch_size": 1, "global_batch_size": 8, **parallel}
    return resolve_job({"model": model, "cluster": {"name": "dgx-a100", "num_nodes": 1}, "parallel": plan})


@pytest.mark.parametrize(
    ("model", "published", "rtol", "source"),
    [
        ("gpt3-175b", 175e9, 0.01, "Brown et al. 2020, table 2.1: 175.0B"),
        ("llama-2-7b", 6.74e9, 0.005, "Touvron et al. 2023 / HF model card: 6,738,415,616 parameters"),
        ("llama-3-70b", 70.55e9, 0.005, "Meta Llama 3 70B: 70,553,706,496 parameters (HF safetensors)"),
        ("gpt-neox-20b", 20.55e9, 0.005, "Black et al. 2022, table 1: 20,554,567,680 parameters"),
    ],
)
def test_parameter_counts_match_the_published_totals(model, published, rtol, source):
    assert count_params(_job(model)) == pytest.approx(published, rel=rtol), source


def test_gpt_neox_20b_counts_exactly_its_published_parameters():
    # Black et al. 2022, table 1 and the GPT-NeoX log: 20,554,567,680 parameters.
    assert count_params(_job("gpt-neox-20b")) == 20_554_567_680


def test_llama_2_7b_counts_exactly_its_checkpoint_parameters():
    # meta-llama/Llama-2-7b-hf: 6,738,415,616 parameters.
    assert count_params(_job("llama-2-7b")) == 6_738_415_616


@pytest.mark.parametrize("name", ["megatron-18b", "megatron-145b", "megatron-1t", "gpt3-175b"])
def test_hardware_flops_with_full_recompute_match_narayanan_eq3(name):
    """Narayanan et al. SC'21, eq. 3: F = 96 B s l h^2 (1 + s/6h + V/16lh) per iteration,
    counting the recomputed forward pass (full activation checkpointing), with the unfused
    attention of 2021 that computes the whole score square and masks it."""
    model = load_model(name).model_copy(update={"attention": "unfused"})
    job = resolve_job({"model": model, "cluster": {"name": "dgx-a100", "num_nodes": 1},
                       "parallel": {"micro_batch_size": 1, "global_batch_size": 16, "recompute": "full"}})
    inv = count_job(job)
    b, s, l, h = 16, model.seq_length, model.num_layers, model.hidden_size  # noqa: E741 (the paper's names)
    v = model.vocab_for(1)
    eq3 = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    assert inv.hardware_flops_per_iteration == pytest.approx(eq3, rel=0.01)


def test_model_flops_per_token_are_six_n_plus_the_causal_attention_term():
    """Kaplan et al. 2020 / PaLM appendix B: 6N + 12 l s h FLOPs per token (N = non-embedding
    parameters) for training without recompute, with causal attention's unmasked half of the
    score square (6 l s h), as Megatron-LM counts it."""
    job = _job("gpt3-175b", global_batch_size=8)
    m = job.model
    inv = count_job(job)
    non_embedding = 12 * m.num_layers * m.hidden_size**2
    per_token = inv.model_flops_per_iteration / (8 * m.seq_length)
    lm_head = 6 * m.hidden_size * m.vocab_for(1)
    expected = 6 * non_embedding + 6 * m.num_layers * m.seq_length * m.hidden_size + lm_head
    assert per_token == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("attention", ["flash", "unfused"])
def test_model_flops_are_megatrons_72_bslh2_whatever_the_attention_kernel(attention):
    """Model FLOPs as Megatron-LM prints MFU with (``num_floating_point_operations`` in
    megatron/training/training.py: "only half of the attention matrix is non-zero"):
    72 B s l h^2 (1 + s/12h + V/12lh). Hardware FLOPs are what the kernel runs: unfused
    attention computes the whole square (Narayanan et al. SC'21, eq. 3 without the recomputed
    forward pass: 72 B s l h^2 (1 + s/6h + V/12lh)); flash attention the causal half, plus the
    scores it recomputes in its backward pass."""
    model = load_model("gpt3-175b").model_copy(update={"attention": attention})
    job = resolve_job({"model": model, "cluster": {"name": "dgx-a100", "num_nodes": 1},
                       "parallel": {"micro_batch_size": 1, "global_batch_size": 16}})
    inv = count_job(job)
    b, s, l, h = 16, model.seq_length, model.num_layers, model.hidden_size  # noqa: E741 (the paper's names)
    v = model.vocab_for(1)
    megatron = 72 * b * s * l * h * h * (1 + s / (12 * h) + v / (12 * l * h))
    assert inv.model_flops_per_iteration == pytest.approx(megatron, rel=1e-9)
    square = 4 * b * s * s * h * l  # forward FLOPs of QK^T and PV over the whole square
    if attention == "unfused":
        narayanan = 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
        assert inv.hardware_flops_per_iteration == pytest.approx(narayanan, rel=1e-9)
    else:  # half of forward (1) + backward (2) + the backward's recomputed scores (0.5)
        assert inv.hardware_flops_per_iteration == pytest.approx(megatron - 1.5 * square + 0.5 * 3.5 * square, rel=1e-9)


def _korthikanti_model(a=96, h=12288, s=2048):
    # GPT-3 175B shape, dropout on and unfused attention, as in Korthikanti et al. 2022.
    return ModelSpec(
        num_layers=96, hidden_size=h, num_attention_heads=a, seq_length=s, vocab_size=51200,
        attention="unfused", attention_dropout=0.1, hidden_dropout=0.1,
    )


@pytest.mark.parametrize("tp", [1, 2, 8])
@pytest.mark.parametrize("sp", [False, True])
def test_activation_bytes_per_layer_match_korthikanti_table_2(tp, sp):
    """Korthikanti et al. 2022, table 2 (bytes of activations per layer):
    no parallelism 34sbh + 5as^2b; tensor parallel sbh(10 + 24/t + 5as/(ht));
    tensor + sequence parallel sbh(34/t + 5as/(ht))."""
    model = _korthikanti_model()
    b, s, h, a = 1, model.seq_length, model.hidden_size, model.num_attention_heads
    x = shard_shape(model, tp, 1, sp and tp > 1, b, Precision.FP16)
    saved = sum(op.saved_bytes for op in count_layer_ops(model, x))
    if tp == 1:
        expected = s * b * h * 34 + 5 * a * s * s * b
    elif sp:
        expected = s * b * h * (34 / tp + 5 * a * s / (h * tp))
    else:
        expected = s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))
    assert saved == pytest.approx(expected, rel=1e-9)


def test_selective_recompute_keeps_34sbh_over_t_korthikanti_table_2():
    """Korthikanti et al. 2022, table 2: selective recompute + sequence parallel = 34 sbh / t."""
    model = _korthikanti_model()
    tp = 8
    x = shard_shape(model, tp, 1, True, 1, Precision.FP16)
    kept = sum(op.kept_under_selective for op in count_layer_ops(model, x))
    assert kept == pytest.approx(model.seq_length * model.hidden_size * 34 / tp, rel=1e-9)
