"""Whether data-parallel gradient reduction overlaps the backward is the framework's default, read
from its code (issue 27): Megatron-LM 2021-22 and Megatron-Core 0.12 reduce after the pipeline
drains unless told; NeMo's recipes and MLPerf v3.0 overlap; a bare megatron engine keeps its own
default (overlap), and a record's or user's explicit words win."""

from __future__ import annotations

import copy

import pytest

from paraplan.catalog import resolve_job
from paraplan.catalog.presets import find_preset
from paraplan.inventory.job import grad_bytes
from paraplan.prediction.entry import predict_any
from paraplan.validate.records import job_from_record

_JOB = {
    "model": "llama-2-7b",
    "cluster": {"name": "dgx-h100", "num_nodes": 4},
    "parallel": {"framework": "megatron", "tp": 2, "pp": 2, "global_batch_size": 64},
    "precision": "bf16",
}

# Narayanan et al. 2021's 39.1B run as a record states it (Megatron-LM's local DDP, fp16)
_GPT_39B = dict(num_layers=48, hidden_size=8192, num_attention_heads=64, num_kv_heads=64, ffn_hidden_size=32768,
                seq_length=2048, vocab_size=51200, activation="gelu")
_PLAN_39B = dict(tp=8, pp=2, dp=32, cp=1, sp=False, virtual_pipeline=1, zero_stage=0, micro_batch_size=4,
                 global_batch_size=1536)
_RECORD = dict(id="megatron-gpt-39b-512gpu", gpu="A100-SXM4-80GB", num_gpus=512, gpus_per_node=8, model=_GPT_39B,
               parallel=_PLAN_39B, recompute="full", precision="fp16", framework="Megatron-LM (2021; DDP-impl=local)")


def _job(framework: str, **parallel):
    return resolve_job({**_JOB, "parallel": {**_JOB["parallel"], "framework": framework, **parallel}})


@pytest.mark.parametrize(("framework", "overlaps"), [
    ("megatron-lm-2022", False), ("megatron-core-0.12", False),
    ("nemo-24.07", True), ("megatron-bridge-0.1", True), ("nemo-mlperf-3.0", True),
])
def test_each_megatron_preset_states_whether_it_overlaps_the_gradient_reduction(framework, overlaps):
    job = _job(framework)
    assert job.preset.taken["overlap_grad_reduce"] is overlaps
    assert job.parallel.overlaps_grad_reduce is overlaps
    assert any(f"overlap_grad_reduce {str(overlaps).lower()}" in line for line in job.preset.lines())


def test_a_bare_megatron_job_keeps_the_engine_s_overlapped_gradient_reduction():
    job = _job("megatron")
    assert job.preset is None and job.parallel.overlap_grad_reduce is None
    assert job.parallel.overlaps_grad_reduce
    stated_on = predict_any(_job("megatron", overlap_grad_reduce=True)).iteration_s
    stated_off = predict_any(_job("megatron", overlap_grad_reduce=False)).iteration_s
    assert predict_any(job).iteration_s == stated_on < stated_off


def test_megatron_core_s_default_predicts_what_stating_no_overlap_predicts():
    preset = predict_any(_job("megatron-core-0.12")).iteration_s
    assert preset == predict_any(_job("megatron-core-0.12", overlap_grad_reduce=False)).iteration_s
    assert preset > predict_any(_job("megatron-core-0.12", overlap_grad_reduce=True)).iteration_s


def test_a_user_stating_overlap_wins_over_megatron_core_s_default_and_is_said():
    job = _job("megatron-core-0.12", overlap_grad_reduce=True)
    assert job.parallel.overlaps_grad_reduce
    assert job.preset.overridden["overlap_grad_reduce"] == (True, False)
    assert any("overlap_grad_reduce true: your value, used" in line for line in job.preset.lines())


def test_the_mlperf_v3_0_preset_reduces_gradients_in_bf16_as_its_grad_sync_dtype_says():
    assert grad_bytes(_job("nemo-mlperf-3.0")) == 2.0
    assert grad_bytes(_job("megatron-core-0.12")) == 4.0  # Megatron-LM's fp32 default for bf16
    assert grad_bytes(_job("nemo-mlperf-3.0", grad_reduce_in_fp32=True)) == 4.0


def test_each_overlap_default_cites_the_framework_s_code():
    for name, words in (("megatron-lm-2022", "allreduce_gradients"), ("megatron-core-0.12", "--overlap-grad-reduce"),
                        ("nemo-mlperf-3.0", "overlap_grad_sync")):
        source = next(d.source for d in find_preset(name).defaults if d.field == "overlap_grad_reduce")
        assert words in source


@pytest.mark.parametrize(("framework", "notes", "stated"), [
    ("Megatron-LM (2021; DDP-impl=torch)", "", True),
    ("Megatron-LM (2021; DDP-impl=local)", "", None),
    ("Megatron-LM / Megatron-Core (main)", "model config: '--overlap-grad-reduce: true'", True),
    ("Megatron-LM / Megatron-Core (main)", "launch: --use-distributed-optimizer --overlap-grad-reduce \\", True),
    ("Megatron-LM / Megatron-Core (main)", "model config: '--overlap-grad-reduce: false'", None),
    ("NVIDIA NeMo 24.07", "optim overlap_grad_sync: True", True),
])
def test_a_record_s_own_overlap_words_are_read_and_win_over_the_preset(framework, notes, stated):
    run = {**copy.deepcopy(_RECORD), "framework": framework, "notes": notes}
    read = job_from_record(run)
    assert read.mapping["parallel"].get("overlap_grad_reduce") == stated
    job = resolve_job(read.mapping)
    preset_default = find_preset(job.preset.preset).defaults
    default = next(d.value for d in preset_default if d.field == "overlap_grad_reduce")
    assert job.parallel.overlaps_grad_reduce is (default if stated is None else stated)
    assert any(line.startswith("overlap_grad_reduce") for line in read.assumed) is (stated is None)


def test_a_2021_megatron_record_with_local_ddp_reduces_after_the_pipeline_drains_and_is_slower_than_torch_ddp():
    local = predict_any(resolve_job(job_from_record(copy.deepcopy(_RECORD)).mapping)).iteration_s
    torch_ddp = predict_any(resolve_job(job_from_record(
        {**copy.deepcopy(_RECORD), "framework": "Megatron-LM (2021; DDP-impl=torch)"}).mapping)).iteration_s
    assert local > torch_ddp


def test_a_search_keeps_the_job_file_s_overlap_over_megatron_core_s_default():
    from paraplan.catalog.loader import load_cluster, load_model
    from paraplan.search.space import SearchSpace, enumerate_plans
    from paraplan.specs import Precision

    model, cluster = load_model("llama-3-8b"), load_cluster("dgx-h100", num_nodes=2)

    def overlaps(**stated) -> set[bool]:
        space = SearchSpace(framework="megatron-core-0.12", micro_batch_size=(1,), preset_stated=stated)
        return {j.parallel.overlaps_grad_reduce for j in enumerate_plans(model, cluster, 64, Precision.BF16, space).jobs}

    assert overlaps() == {False}
    assert overlaps(overlap_grad_reduce=True) == {True}
