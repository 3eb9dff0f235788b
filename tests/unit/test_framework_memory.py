"""What the frameworks keep beyond weights, gradients and optimizer states (issue 24, item 3):
the workspaces allocated once (PyTorch's cuBLAS workspace; under Megatron Transformer Engine's
and the dummy weight gradients it caches), Megatron-Core's fused cross entropy's extra fp32 copy
of the logits, and torchtitan's compiled loss, which keeps none. Sources in
``catalog/runtime/memory.yaml`` and ``prediction/framework_memory.py``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.catalog import resolve_job
from paraplan.inventory import count_job
from paraplan.prediction import predict
from paraplan.prediction.framework_memory import dummy_wgrad_bytes, loss_logits_bytes, workspace_bytes
from paraplan.prediction.memory import MOMENTS, StageMemory, moment_totals, step_memory
from paraplan.specs import ConfigError

MIB = 2**20
# Llama 3.2 1B's weight shapes (k, n): q/k/v, attention output, gate+up, down, and the LM head
LLAMA32_1B_WEIGHTS = ((2048, 3072), (2048, 2048), (2048, 16384), (8192, 2048), (2048, 128256))
LLAMA32_1B = {"num_layers": 16, "hidden_size": 2048, "num_attention_heads": 32, "num_query_groups": 8,
              "kv_channels": 64, "ffn_hidden_size": 8192, "seq_length": 1024, "vocab_size": 128256,
              "activation": "swiglu", "normalization": "rmsnorm", "position_embedding": "rotary",
              "untie_embeddings_and_output_weights": False, "add_bias_linear": False, "attention": "flash"}


def _job(gpu="H100-SXM5-80GB", **parallel):
    plan = {"framework": "megatron", "zero_stage": 1, "micro_batch_size": 1, "global_batch_size": 64, **parallel}
    return resolve_job({"model": LLAMA32_1B, "cluster": {"gpu": gpu, "num_nodes": 1, "gpus_per_node": 8},
                        "parallel": plan, "precision": "bf16"})


def _stage_bytes(job, function, stage=-1):
    inv = count_job(job)
    return function(inv, inv.stages[stage])


def test_megatron_keeps_one_16_bit_dummy_weight_gradient_per_distinct_weight_shape_lm_head_included():
    expected = 2 * sum(k * n for k, n in LLAMA32_1B_WEIGHTS)
    assert _stage_bytes(_job(), dummy_wgrad_bytes) == expected


def test_the_dummy_weight_gradients_are_of_the_tensor_parallel_shard_and_the_lm_head_only_on_the_last_stage():
    whole = 2 * sum(k * n for k, n in LLAMA32_1B_WEIGHTS)
    assert _stage_bytes(_job(tp=2), dummy_wgrad_bytes) == whole / 2
    head = 2 * 2048 * 128256
    assert _stage_bytes(_job(pp=2), dummy_wgrad_bytes, stage=0) == whole - head
    assert _stage_bytes(_job(pp=2), dummy_wgrad_bytes, stage=-1) == whole


def test_without_gradient_accumulation_fusion_megatron_keeps_only_the_two_cublas_workspaces():
    assert _stage_bytes(_job(gradient_accumulation_fusion=False), workspace_bytes) == 64 * MIB


@pytest.mark.parametrize(("gpu", "mib"), [("H100-SXM5-80GB", 32), ("A100-SXM4-80GB", 8.125), ("MI300X", 128)])
def test_every_framework_keeps_pytorch_s_cublas_workspace_of_the_gpu_architecture_s_size(gpu, mib):
    assert _stage_bytes(_job(gpu=gpu, framework="fsdp", zero_stage=3), workspace_bytes) == mib * MIB


def test_megatron_s_fused_cross_entropy_holds_6_bytes_per_logit_beyond_its_saved_softmax_the_unfused_2():
    logits = 1024 * 128256
    assert _stage_bytes(_job(cross_entropy_loss_fusion=True), lambda inv, s: loss_logits_bytes(inv.job, s)) == 6 * logits
    assert _stage_bytes(_job(), lambda inv, s: loss_logits_bytes(inv.job, s)) == 2 * logits
    tp2 = _job(tp=2, cross_entropy_loss_fusion=True)
    assert _stage_bytes(tp2, lambda inv, s: loss_logits_bytes(inv.job, s)) == 6 * logits / 2


@settings(max_examples=40, deadline=None)
@given(workspaces=st.floats(0, 4e9), activations=st.floats(0, 4e10), frag=st.floats(0, 0.5))
def test_workspaces_add_to_allocated_and_reserved_memory_byte_for_byte_as_tensors_kept_all_run(workspaces, activations,
                                                                                                frag):
    base = StageMemory(stage=0, weights=1e9, gradients=2e9, optimizer_states=3e9, activations=activations, buffers=0.0,
                       in_flight_microbatches=1.0, fragmentation_share=frag)
    with_ws = StageMemory(**{**{f: getattr(base, f) for f in base.__dataclass_fields__}, "workspaces": workspaces})
    assert with_ws.allocated - base.allocated == pytest.approx(workspaces, rel=1e-9, abs=1e-3)
    assert with_ws.reserved - base.reserved == pytest.approx(workspaces, rel=1e-9, abs=1e-3)


def test_a_megatron_prediction_shows_the_workspaces_and_a_larger_loss_with_the_fused_cross_entropy():
    fused, plain = predict(_job(cross_entropy_loss_fusion=True)).memory, predict(_job()).memory
    assert fused.workspaces == plain.workspaces == pytest.approx(64 * MIB + 2 * sum(k * n for k, n in LLAMA32_1B_WEIGHTS))
    assert fused.logits - plain.logits == pytest.approx(4 * 1024 * 128256)
    assert fused.to_dict()["workspaces_bytes"] == fused.workspaces


def test_a_megatron_export_of_a_job_with_the_fused_cross_entropy_asks_for_it_and_the_parser_accepts_the_flag():
    from framework_parsers import megatron_parser
    from paraplan.export.megatron import megatron_args

    args = megatron_args(_job(cross_entropy_loss_fusion=True))
    assert "--cross-entropy-loss-fusion" in args and megatron_parser().parse_args(args).cross_entropy_loss_fusion
    assert "--cross-entropy-loss-fusion" not in megatron_args(_job())


def test_torchtitan_s_compiled_loss_keeps_no_fp32_copy_of_the_logits_beyond_the_four_bytes_the_inventory_saves():
    def loss_bytes(job):
        return _stage_bytes(job, lambda inv, s: loss_logits_bytes(inv.job, s))

    logits = 1024 * 128256
    assert loss_bytes(_job(framework="fsdp", zero_stage=3)) == 8 * logits
    assert loss_bytes(_job(framework="fsdp", zero_stage=3, compile_loss=True)) == 0.0


@pytest.mark.parametrize(("framework", "field"), [("megatron", "compile_loss"), ("fsdp", "cross_entropy_loss_fusion"),
                                                  ("deepspeed", "cross_entropy_loss_fusion")])
def test_a_loss_option_of_another_framework_is_refused_naming_the_field(framework, field):
    from paraplan.specs import ParallelPlan

    with pytest.raises(ValueError, match=f"parallel.{field}: "):
        ParallelPlan(framework=framework, **{field: True})


@pytest.mark.parametrize("framework", ["megatron", "deepspeed"])
def test_the_kept_pipeline_outputs_on_a_plan_of_another_framework_are_refused_in_one_line(framework):
    from paraplan.specs import ConfigError

    with pytest.raises(ConfigError, match=r"parallel\.pipeline_keeps_outputs: ") as err:
        _job(framework=framework, pp=2, pipeline_keeps_outputs=False)
    assert "\n" not in str(err.value) and "fsdp" in str(err.value)


def test_a_torchtitan_recipe_of_a_compiled_loss_job_compiles_the_loss_alone_and_torchtitan_parses_it(tmp_path,
                                                                                                   monkeypatch):
    from framework_parsers import titan_parse
    from paraplan.export.torchtitan import render_torchtitan

    job = resolve_job({"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 1},
                       "parallel": {"framework": "fsdp", "zero_stage": 3, "global_batch_size": 8, "compile_loss": True}})
    text = render_torchtitan(job)
    assert 'compile=CompileConfig(enable=True, components=["loss"])' in text
    config = titan_parse(text, tmp_path, monkeypatch, name="recipe_compiled_loss")
    assert config.compile.enable and list(config.compile.components) == ["loss"]


@pytest.mark.parametrize(("compile_loss", "components"), [(None, '["model"]'), (True, '["model", "loss"]')])
def test_a_torchtitan_fp8_recipe_compiles_the_loss_only_where_the_prediction_did(compile_loss, components):
    from paraplan.export.torchtitan import render_torchtitan

    job = resolve_job({"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 1}, "precision": "fp8",
                       "parallel": {"framework": "fsdp", "zero_stage": 3, "global_batch_size": 8,
                                    "fp8_recipe": "rowwise", "compile_loss": compile_loss}})
    assert f"compile=CompileConfig(enable=True, components={components})" in render_torchtitan(job)


def test_a_megatron_bridge_job_takes_the_fused_cross_entropy_from_its_preset_and_megatron_lm_s_does_not():
    def job(framework):
        return resolve_job({"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 1},
                            "parallel": {"framework": framework, "global_batch_size": 64}})

    assert job("megatron-bridge").parallel.cross_entropy_loss_fusion is True
    assert "cross_entropy_loss_fusion" in job("megatron-bridge").preset.taken
    assert not job("megatron-core").parallel.cross_entropy_loss_fusion


def _titan_8b(**plan):
    return resolve_job({"model": {"name": "llama-3-8b", "seq_length": 8192}, "precision": "bf16",
                        "cluster": {"name": "dgx-h100", "num_nodes": 1},
                        "parallel": {"framework": "torchtitan-0.1", "micro_batch_size": 1, "global_batch_size": 8,
                                     **plan}})


def test_torchtitan_s_chunked_loss_holds_one_chunk_s_logits_beside_an_fp32_accumulator_and_the_chunk_copies():
    whole, chunked = _titan_8b(), _titan_8b(loss_chunks=8)
    iw, ic = count_job(whole), count_job(chunked)
    x, last_w, last_c = iw.shape, iw.stages[-1], ic.stages[-1]
    saved = {name: next(op.saved_bytes for op in stage.end_ops if op.name == "cross_entropy")
             for name, stage in (("whole", last_w), ("chunked", last_c))}
    assert saved["chunked"] == pytest.approx(saved["whole"] / 8 + (x.e + 4.0) * x.b * x.s * x.h)
    assert loss_logits_bytes(chunked, last_c) == pytest.approx(loss_logits_bytes(whole, last_w) / 8)
    # Llama-3-8B at 8192 tokens: 3.9 GiB of fp32 softmax and 7.8 GiB of loss copies, whole; at
    # the loss (the chunked job's step then peaks at the backward's start, without the logits)
    gib, loss = 2**30, MOMENTS.index("loss")
    at_loss = {name: moment_totals(*step_memory(inv, inv.stages[0]))[loss] for name, inv in (("w", iw), ("c", ic))}
    assert (at_loss["w"] - at_loss["c"]) / gib > 8.0
    assert predict(chunked).iteration_s == predict(whole).iteration_s  # the same FLOPs


def test_loss_chunks_needs_torchtitan_s_engine_and_one_chunk_is_the_whole_loss():
    assert predict(_titan_8b(loss_chunks=1)).memory[0].total == predict(_titan_8b()).memory[0].total
    with pytest.raises(ConfigError, match=r"^parallel\.loss_chunks: torchtitan's ChunkedLossWrapper needs framework "
                                          r"fsdp, not 'megatron'"):
        resolve_job({"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 1}, "precision": "bf16",
                     "parallel": {"framework": "megatron", "micro_batch_size": 1, "global_batch_size": 8,
                                  "loss_chunks": 8}})
