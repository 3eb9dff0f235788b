"""Published run records become jobs by their words: framework family, GPU, network, batch."""

from __future__ import annotations

import copy

import pytest

from paraplan.catalog import resolve_job
from paraplan.validate.published import measured_iteration_s
from paraplan.validate.records import job_from_record, preset_of

_FSDP_RUN = {
    "id": "ibm-fsdp-llama2-7b-h100-96gpu",
    "gpu": "H100-SXM5-80GB",
    "num_gpus": 96,
    "gpus_per_node": 8,
    "interconnect": "800 Gbps inter-node",
    "model": {
        "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_kv_heads": 32,
        "ffn_hidden_size": 11008, "seq_length": 4096, "vocab_size": None, "activation": "swiglu",
    },
    "parallel": {
        "tp": 1, "pp": 1, "dp": 96, "cp": 1, "sp": None, "virtual_pipeline": None,
        "zero_stage": None, "micro_batch_size": None, "global_batch_size": 192,
    },
    "recompute": "none",
    "precision": "bf16 mixed precision",
    "framework": "IBM fms-fsdp (PyTorch FSDP + SDPA FlashAttention-2)",
    "measured": {"tokens_per_s_per_gpu": 7500},
}


def test_an_fsdp_record_becomes_a_full_shard_llama_job_on_the_stated_network():
    mapped = job_from_record(_FSDP_RUN)
    assert mapped.family == "fms-fsdp-2024.03"
    assert mapped.gpu == "H100-SXM5-80GB"
    job = resolve_job(mapped.mapping)
    assert job.parallel.zero_stage == 3
    assert job.parallel.micro_batch_size == 2  # 192 / 96, no gradient accumulation
    assert job.model.normalization == "rmsnorm" and job.model.position_embedding == "rotary"
    assert job.model.vocab_size == 32000  # Llama 2's tokenizer, from the id
    # 800 Gb/s per node of 8 GPUs = 12.5 GB/s per GPU
    assert job.cluster.inter_node.bandwidth_bytes_per_s == pytest.approx(12.5e9)
    assert job.cluster.num_nodes == 12
    assert any("vocab_size" in a for a in mapped.assumed)
    assert any("zero_stage 3" in a for a in mapped.assumed)


@pytest.mark.parametrize(
    ("framework", "eager"),
    [
        ("IBM fms-fsdp (PyTorch FSDP + SDPA FlashAttention-2)", True),  # fms LayerNormParameterized
        ("torchtitan (FSDP2)", True),  # torchtitan models/norms.py RMSNorm, norm_type "rmsnorm"
        ("NVIDIA NeMo 24.07 (Megatron-Core)", False),  # one fused kernel (Transformer Engine)
    ],
)
def test_the_frameworks_that_ran_rmsnorm_as_eager_pytorch_get_the_eager_norm_and_the_others_the_fused(
        framework, eager):
    run = copy.deepcopy(_FSDP_RUN)
    run["framework"] = framework
    model = resolve_job(job_from_record(run).mapping).model
    assert model.normalization == "rmsnorm"
    assert model.rmsnorm_fusion is not eager
    assert model.swiglu_fusion is not eager


@pytest.mark.parametrize(
    ("framework", "rope", "expand"),
    [
        ("IBM fms-fsdp (PyTorch FSDP + SDPA FlashAttention-2)", "rotation", "copy"),  # fms positions/attention
        ("torchtitan (FSDP2)", "complex", "copy"),  # 2024-08 apply_rotary_emb, repeat_kv before SDPA
        ("NVIDIA NeMo 24.07 (Megatron-Core)", "kernel", "none"),  # fused RoPE, grouped K/V to the kernel
    ],
)
def test_the_frameworks_that_ran_eager_attention_code_get_its_rope_and_kv_repeat(framework, rope, expand):
    run = copy.deepcopy(_FSDP_RUN)
    run["framework"] = framework
    run["model"] = {**run["model"], "num_kv_heads": 8}
    model = resolve_job(job_from_record(run).mapping).model
    assert (model.rope_impl, model.gqa_expand) == (rope, expand)


def test_a_record_without_a_network_takes_the_reference_node_and_says_so():
    run = copy.deepcopy(_FSDP_RUN)
    run["interconnect"] = None
    mapped = job_from_record(run)
    assert resolve_job(mapped.mapping).cluster.inter_node.bandwidth_bytes_per_s == pytest.approx(50e9)
    assert any("dgx-h100" in a for a in mapped.assumed)


@pytest.mark.parametrize(
    ("framework", "family"),
    [
        ("torchtitan (FSDP2)", "torchtitan-2024.08"),
        ("NVIDIA NeMo/Megatron-Core (MLPerf v3.0 submission)", "nemo-mlperf-3.0"),
        ("Megatron-LM (2022)", "megatron-lm-2022"),
        ("NVIDIA NeMo 24.07 (Megatron-Core)", "nemo-24.07"),
        ("MosaicML llm-foundry (Composer, FSDP)", "composer-0.17"),
        ("GPT-NeoX (DeepSpeed)", "deepspeed-0.14"),
        ("PyTorch FSDP", "pytorch-fsdp-2.4"),
        ("Megatron-LM / Megatron-Core (main 1e057005), distributed optimizer, Megatron-FSDP", "megatron-core-0.12"),
    ],
)
def test_the_framework_preset_is_read_from_the_record_words(framework, family):
    assert preset_of({"framework": framework}).id == family


def test_fp8_is_read_from_the_precision_words():
    run = copy.deepcopy(_FSDP_RUN)
    run["precision"] = "FP8 hybrid (Transformer Engine) + BF16 (megatron_amp_O2)"
    assert job_from_record(run).mapping["precision"] == "fp8"


def test_the_iteration_time_comes_from_throughput_when_not_printed():
    # 192 x 4096 tokens / (7500 tokens/s per GPU x 96 GPUs)
    assert measured_iteration_s(_FSDP_RUN) == pytest.approx(192 * 4096 / (7500 * 96))


def test_a_record_naming_no_known_family_gets_a_vocabulary_it_says_it_assumed():
    run = copy.deepcopy(_FSDP_RUN)
    run["id"] = "somebody-model-x"
    mapped = job_from_record(run)
    assert mapped.mapping["model"]["vocab_size"] == 32000
    assert any("names no known family" in a for a in mapped.assumed)


def test_unreadable_records_are_skipped_with_their_reason_and_the_rest_validated():
    from paraplan.validate import validate_runs

    bad_gpu = copy.deepcopy(_FSDP_RUN)
    bad_gpu["id"], bad_gpu["gpu"] = "bad-gpu", "Quantum-9000"
    no_time = copy.deepcopy(_FSDP_RUN)
    no_time["id"], no_time["measured"] = "no-time", {"mfu": 0.4}
    skipped: list[tuple[str, str]] = []
    results = validate_runs([_FSDP_RUN, bad_gpu, no_time], skipped=skipped)
    assert [r.run_id for r in results] == [_FSDP_RUN["id"]]
    reasons = dict(skipped)
    assert "Quantum-9000" in reasons["bad-gpu"]
    assert "iteration_time_s" in reasons["no-time"]


def test_a_mixture_of_experts_record_is_read_as_one_not_as_dense():
    run = copy.deepcopy(_FSDP_RUN)
    run["model"]["num_experts"] = 8
    run["parallel"]["ep"] = 2
    mapping = job_from_record(run).mapping
    assert mapping["model"]["num_moe_experts"] == 8
    assert mapping["parallel"]["expert_model_parallel_size"] == 2


@pytest.mark.parametrize(
    ("notes", "key", "value"),
    [
        ("FSDP HYBRID_SHARD across nodes", "data_parallel_shard_degree", 8),
        ("sharding FULL_SHARD", "data_parallel_shard_degree", None),
    ],
)
def test_settings_a_record_states_in_words_are_read(notes, key, value):
    run = copy.deepcopy(_FSDP_RUN)
    run["id"], run["notes"], run["model"]["params_billion"] = "llama2-70b-run", notes, 70
    assert job_from_record(run).mapping["parallel"].get(key) == value


def test_megatron_s_distributed_optimizer_in_the_notes_is_zero_1():
    run = copy.deepcopy(_FSDP_RUN)
    run["framework"], run["notes"] = "NVIDIA NeMo (Megatron-Core)", "distributed optimizer on"
    assert job_from_record(run).mapping["parallel"]["zero_stage"] == 1


def test_a_missing_dp_is_derived_from_the_gpus_and_the_other_degrees():
    run = copy.deepcopy(_FSDP_RUN)
    run["parallel"]["dp"] = None
    assert job_from_record(run).mapping["parallel"]["dp"] == 96


def test_a_published_record_becomes_a_measured_run_with_its_source_and_assumptions():
    from paraplan.validate import MeasuredRun, measured_from_record
    from paraplan.validate.published import measured_from_published

    run = measured_from_published(copy.deepcopy(_FSDP_RUN))
    assert isinstance(run, MeasuredRun)
    assert (run.kind, run.source, run.gpu) == ("published", "ibm", "H100-SXM5-80GB")
    assert run.measured_iteration_s == pytest.approx(192 * 4096 / (7500 * 96))
    assert run.components == () and run.assumed
    assert measured_from_record(copy.deepcopy(_FSDP_RUN)) == run


def test_the_fp8_recipe_a_record_states_is_read_and_keeps_the_delayed_recipes_amax_reduction_away():
    run = copy.deepcopy(_FSDP_RUN)
    run["framework"] = "Megatron-LM / Megatron-Core dev"
    run["gpu"] = "B200"
    run["precision"] = "MXFP8 (--fp8-recipe mxfp8, e4m3, fp8 param gather)"
    plan = resolve_job(job_from_record(run).mapping).parallel
    assert (plan.fp8_recipe.value, plan.fp8_amax_reduce) == ("mxfp8", "none")
    run["precision"] = "FP8 (--fp8-recipe tensorwise)"
    assert resolve_job(job_from_record(run).mapping).parallel.fp8_recipe.value == "current"
    run["precision"] = "FP8 hybrid (Transformer Engine)"
    plan = resolve_job(job_from_record(run).mapping).parallel
    assert (plan.fp8_recipe.value, plan.fp8_amax_reduce) == ("delayed", "tp_dp")
