"""Framework presets (catalog/frameworks/*.yaml): what a framework at a version does by default
for the plan fields a user leaves out, each default cited; job files, flags and the published-
runs reader resolve the same preset, and a stated field always wins and is said."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from paraplan.catalog import resolve_job
from paraplan.catalog.jobs import apply_overrides
from paraplan.catalog.presets import find_preset, preset_sources, presets
from paraplan.cli.app import app
from paraplan.specs import ConfigError, Framework
from paraplan.validate.records import job_from_record

_JOB = {
    "model": "llama-2-70b",
    "cluster": {"name": "dgx-h100", "num_nodes": 8},
    "parallel": {"framework": "nemo-24.07", "tp": 4, "pp": 4, "vpp": 5, "global_batch_size": 128},
    "precision": "bf16",
}
_RECORD = {
    "id": "nemo-llama2-70b-64gpu",
    "gpu": "H100-SXM5-80GB",
    "num_gpus": 64,
    "gpus_per_node": 8,
    "model": {"num_layers": 80, "hidden_size": 8192, "num_attention_heads": 64, "num_kv_heads": 8,
              "ffn_hidden_size": 28672, "seq_length": 4096, "vocab_size": 32000, "activation": "swiglu"},
    "parallel": {"tp": 4, "pp": 4, "dp": 4, "cp": 1, "sp": None, "virtual_pipeline": 5, "zero_stage": None,
                 "micro_batch_size": 1, "global_batch_size": 128},
    "recompute": None,
    "precision": "bf16",
    "framework": "NVIDIA NeMo 24.07",
}


@pytest.mark.parametrize("preset_id", list(presets()))
def test_each_preset_file_loads_with_a_source_for_every_default(preset_id):
    preset = presets()[preset_id]
    assert preset.engine in set(Framework)
    assert preset.defaults and preset.keywords
    sources = preset_sources(preset)
    assert set(sources) == ({d.field for d in (*preset.defaults, *preset.model_defaults)} | set(preset.recorded)
                            | {f"runs.{axis}" for axis in preset.runs})
    assert all(len(source) > 20 for source in sources.values())


def test_a_preset_name_alone_is_its_newest_version_and_an_engine_is_no_preset():
    assert find_preset("nemo").id == "nemo-24.07"
    assert find_preset("megatron") is None and find_preset("fsdp") is None


def test_an_unknown_preset_is_one_line_listing_the_presets_the_catalog_has():
    with pytest.raises(ConfigError) as err:
        find_preset("nemo-99.01")
    message = str(err.value)
    assert "\n" not in message and "parallel.framework" in message
    assert all(name in message for name in presets())


def test_a_job_file_takes_the_preset_s_defaults_and_runs_on_its_engine():
    job = resolve_job(_JOB)
    plan = job.parallel
    assert plan.framework is Framework.MEGATRON
    assert plan.sequence_parallel and plan.zero_stage == 1 and plan.grad_reduce_in_fp32
    assert job.preset.preset == "nemo-24.07"
    assert job.preset.taken["sequence_parallel"] is True and not job.preset.overridden


def test_a_field_the_user_states_wins_over_the_preset_and_is_said():
    job = resolve_job({**_JOB, "parallel": {**_JOB["parallel"], "sequence_parallel": False}})
    assert job.parallel.sequence_parallel is False
    assert job.preset.overridden == {"sequence_parallel": (False, True)}
    assert "tp_comm_overlap" not in job.preset.taken  # it needs sequence parallelism
    assert any("your value, used" in line for line in job.preset.lines())


def test_the_job_file_the_flag_and_the_reader_resolve_the_same_preset():
    from_file = resolve_job(_JOB)
    plain = {**_JOB, "parallel": {k: v for k, v in _JOB["parallel"].items() if k != "framework"}}
    from_flag = resolve_job(apply_overrides(plain, {"framework": "nemo-24.07"}))
    from_record = resolve_job(job_from_record(_RECORD).mapping)
    assert from_file.preset == from_flag.preset
    assert from_record.preset.preset == from_file.preset.preset
    assert from_record.preset.taken == from_file.preset.taken
    assert from_record.parallel.sequence_parallel and from_record.parallel.zero_stage == 1


def test_the_fms_fsdp_preset_shards_within_a_node_only_below_30b_parameters():
    small = {"model": "llama-2-7b", "cluster": {"name": "dgx-a100", "num_nodes": 4},
             "parallel": {"framework": "fms-fsdp"}}
    large = {**small, "model": "llama-2-70b"}
    assert resolve_job(small).parallel.data_parallel_shard_degree == 8
    assert resolve_job(large).parallel.data_parallel_shard_degree is None


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "80"})
    return result.exit_code, result.stdout, result.stderr


def test_the_defaults_taken_appear_in_the_json_and_the_table(tmp_path):
    path = tmp_path / "nemo.json"
    path.write_text(json.dumps(_JOB))
    code, out, _ = _run("predict", str(path), "--no-sequence-parallel", "-f", "json")
    assert code == 0
    preset = json.loads(out)["framework_preset"]
    assert preset["preset"] == "nemo-24.07" and preset["defaults_taken"]["zero_stage"] == 1
    assert preset["user_values_used"] == {"sequence_parallel": {"used": False, "preset": True}}
    assert preset["defaults_taken"]["attention_kernel"] == "cudnn"
    assert "fp8_recipe" not in preset["defaults_taken"]  # a bf16 job: the preset's FP8 recipe applies to fp8 only
    code, out, _ = _run("predict", str(path))
    assert code == 0 and "defaults taken from it: zero_stage 1" in out


def test_an_unknown_preset_on_the_command_line_exits_2_with_one_line():
    code, _, err = _run("predict", "--framework", "nemo-99.01")
    assert code == 2
    assert err.strip().count("\n") == 0 and "nemo-24.07" in err


def test_a_plain_engine_value_takes_no_preset_and_says_none():
    code, out, _ = _run("predict", "--framework", "megatron", "-f", "json")
    assert code == 0 and "framework_preset" not in json.loads(out)


def test_a_job_with_a_preset_writes_back_as_a_job_file_that_resolves_to_it():
    from paraplan.catalog.jobfile import job_mapping

    job = resolve_job({**_JOB, "parallel": {**_JOB["parallel"], "sequence_parallel": False}})
    mapping = job_mapping(job)
    assert mapping["parallel"]["framework"] == "nemo-24.07" and "zero_stage" not in mapping["parallel"]
    assert resolve_job(mapping) == job


_FMS = {"model": "llama-2-7b", "cluster": "dgx-h100", "parallel": {"framework": "fms-fsdp", "global_batch_size": 16}}


def test_the_fms_fsdp_preset_runs_its_model_codes_eager_rmsnorm_and_swiglu_and_says_so():
    """fms's LayerNormParameterized and GatedLinearUnit are eager PyTorch (its preset's
    ``model_defaults``): a job naming the preset gets ``rmsnorm_fusion`` and ``swiglu_fusion``
    false and lists them among the defaults it took; the job file writes back without them."""
    from paraplan.catalog.jobfile import job_mapping

    job = resolve_job(_FMS)
    assert (job.model.rmsnorm_fusion, job.model.swiglu_fusion) == (False, False)
    assert job.preset.model_taken == {"rmsnorm_fusion": False, "swiglu_fusion": False, "qkv_fusion": False,
                                      "gate_up_fusion": False, "rope_impl": "rotation", "gqa_expand": "copy"}
    assert "rmsnorm_fusion false" in job.preset.lines()[1]
    assert "rope_impl rotation" in job.preset.lines()[1]
    mapping = job_mapping(job)
    assert mapping["model"] == "llama-2-7b"
    assert resolve_job(mapping) == job


def test_a_model_field_the_user_states_wins_over_the_preset_and_is_said():
    job = resolve_job({**_FMS, "model": {"name": "llama-2-7b", "rmsnorm_fusion": True}})
    assert job.model.rmsnorm_fusion is True and job.model.swiglu_fusion is False
    assert job.preset.model_overridden == {"rmsnorm_fusion": (True, False)}
    assert "rmsnorm_fusion true: your value, used (fms-fsdp-2024.03 would set false)" in job.preset.lines()


def test_a_preset_model_default_applies_only_to_a_model_with_that_kernel():
    job = resolve_job({**_FMS, "model": "gpt3-1.3b"})  # LayerNorm and GELU: no norm, gate or SwiGLU to set
    assert job.model.rmsnorm_fusion is True
    assert job.preset.model_taken == {"qkv_fusion": False, "gqa_expand": "copy"}  # no rotary: no rope_impl


def test_a_preset_model_default_that_is_not_a_model_field_a_preset_sets_is_refused_naming_it():
    from paraplan.catalog.presets import _preset

    raw = {"name": "x", "version": "1", "engine": "fsdp", "label": "x",
           "model_defaults": {"hidden_size": {"value": False, "source": "somewhere long enough"}}}
    with pytest.raises(ConfigError, match=r"x.yaml: model_defaults.hidden_size: not a model field a preset sets"):
        _preset(raw, "x.yaml")


def test_a_search_naming_the_preset_runs_the_same_eager_model_as_a_job_file_naming_it():
    from paraplan.catalog import load_cluster, load_model
    from paraplan.catalog.jobfile import job_mapping
    from paraplan.prediction import predict
    from paraplan.search import SearchSpace, search_plans
    from paraplan.specs import Precision

    result = search_plans(load_model("llama-2-7b"), load_cluster("dgx-h100", num_nodes=1), 16, Precision.BF16,
                          SearchSpace(framework="fms-fsdp"))
    best = result.ranked[0]
    assert best.job.model.rmsnorm_fusion is False and best.job.preset.model_taken["rmsnorm_fusion"] is False
    assert predict(resolve_job(job_mapping(best.job))).iteration_s == pytest.approx(best.iteration_s, rel=1e-9)


def _fms_job(**plan):
    return {"model": {"name": "llama-2-13b", "seq_length": 4096}, "cluster": {"name": "dgx-h100", "num_nodes": 2},
            "parallel": {"framework": "fms-fsdp-2024.03", "micro_batch_size": 2, "global_batch_size": 128, **plan},
            "precision": "bf16"}


def test_a_job_naming_fms_fsdp_with_tp_2_is_refused_in_one_line_naming_the_field_and_what_it_runs():
    assert resolve_job(_fms_job()).parallel.tp == 1  # data parallelism alone runs
    with pytest.raises(ConfigError) as err:
        resolve_job(_fms_job(tp=2))
    message = str(err.value)
    assert "\n" not in message and message.startswith("parallel.tp: fms-fsdp-2024.03")
    assert "runs tp 1 only, not 2" in message


def test_a_job_file_naming_fms_fsdp_with_pipeline_parallelism_exits_2_with_one_line(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(_fms_job(pp=2)))
    result = CliRunner().invoke(app, ["predict", str(path)], env={"COLUMNS": "80"})
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: parallel.pp: fms-fsdp-2024.03 (IBM fms-fsdp (PyTorch FSDP1), 2024-03) runs pp 1 only, not 2"]


def test_fms_fsdp_runs_data_parallelism_only_with_its_code_cited():
    preset = find_preset("fms-fsdp-2024.03")
    degrees = {axis: preset.runs[axis] for axis in ("tp", "pp", "cp", "ep")}
    assert {axis: values for axis, (values, _) in degrees.items()} == {"tp": (1,), "pp": (1,), "cp": (1,), "ep": (1,)}
    assert all("fms-fsdp main_training.py" in source for _, source in degrees.values())


def test_a_preset_file_whose_runs_names_no_source_or_an_unknown_axis_is_refused():
    from paraplan.catalog.presets import _preset

    base = {"name": "x", "version": "1", "engine": "fsdp", "label": "x"}
    for runs in ({"tp": {"values": [1]}}, {"dp": {"values": [1], "source": "somewhere in its code"}},
                 {"tp": {"values": [0], "source": "somewhere in its code"}}, {"tp": 1}):
        with pytest.raises(ConfigError, match="runs"):
            _preset({**base, "runs": runs}, "x.yaml")


def test_a_job_naming_fms_fsdp_with_per_op_recompute_is_refused_since_it_checkpoints_whole_blocks_only():
    assert resolve_job(_fms_job(recompute="layer", recompute_every=2)).parallel.recompute.value == "layer"
    assert resolve_job(_fms_job(recompute="full")).parallel.recompute.value == "full"
    with pytest.raises(ConfigError) as err:
        resolve_job(_fms_job(recompute="op"))
    assert str(err.value) == ("parallel.recompute: fms-fsdp-2024.03 (IBM fms-fsdp (PyTorch FSDP1), 2024-03) runs "
                              "recompute none or full or layer only, not 'op'")


def test_fms_fsdp_s_recompute_policies_cite_its_block_level_checkpointing_code():
    values, source = find_preset("fms-fsdp-2024.03").runs["recompute"]
    assert values == ("none", "full", "layer")
    assert "ac_handler.py" in source and "selective_checkpointing" in source


def test_a_preset_file_whose_runs_offers_a_recompute_policy_its_engine_lacks_is_refused():
    from paraplan.catalog.presets import _preset

    base = {"name": "x", "version": "1", "label": "x"}
    for engine, values in (("megatron", ["layer"]), ("fsdp", ["selective"]), ("fsdp", [])):
        with pytest.raises(ConfigError, match=r"runs\.recompute"):
            _preset({**base, "engine": engine, "runs": {"recompute": {"values": values, "source": "its code, cited"}}},
                    "x.yaml")


def _composer_job(**plan):
    return {"model": "llama-2-7b", "cluster": {"name": "dgx-a100", "num_nodes": 2}, "precision": "bf16",
            "parallel": {"framework": "composer-0.17", "micro_batch_size": 2, "global_batch_size": 64, **plan}}


def test_composer_0_17_s_defaults_are_its_set_fsdp_default_read_at_v0_17_0():
    preset = find_preset("composer-0.17")
    assert {d.field: d.value for d in preset.defaults} == {"zero_stage": 3, "fsdp_version": 1,
                                                            "grad_reduce_in_fp32": True, "recompute": "none"}
    assert all("v0.17.0" in d.source for d in preset.defaults)
    job = resolve_job(_composer_job())
    assert (job.parallel.zero_stage, job.parallel.fsdp_version, job.parallel.grad_reduce_in_fp32) == (3, 1, True)


def test_composer_s_triton_attention_is_recorded_not_timed_on_the_triton_tutorial_kernel_s_curve():
    job = resolve_job(_composer_job())
    assert job.preset.recorded == {"attention_kernel": "triton"}
    assert job.parallel.attention_kernel is None
    assert "llm-foundry v0.4.0" in find_preset("composer-0.17").recorded["attention_kernel"][1]


def test_a_job_naming_composer_with_every_nth_block_recompute_is_refused_naming_what_composer_offers():
    assert resolve_job(_composer_job(recompute="full")).parallel.recompute.value == "full"
    for policy in ("layer", "op"):
        with pytest.raises(ConfigError, match=rf"^parallel\.recompute: composer-0\.17 .* runs recompute none or full "
                                              rf"only, not '{policy}'$"):
            resolve_job(_composer_job(recompute=policy))


def test_pytorch_fsdp_2_4_is_fsdp1_reducing_in_the_parameters_bf16_as_its_constructor_and_mixed_precision_say():
    preset = find_preset("pytorch-fsdp-2.4")
    assert {d.field: d.value for d in preset.defaults} == {"zero_stage": 3, "grad_reduce_in_fp32": False,
                                                            "fsdp_version": 1, "recompute": "none"}
    assert all("v2.4.0" in d.source for d in preset.defaults)
    job = resolve_job({"model": "llama-2-7b", "cluster": {"name": "dgx-a100", "num_nodes": 2}, "precision": "bf16",
                       "parallel": {"framework": "pytorch-fsdp-2.4", "micro_batch_size": 2, "global_batch_size": 64}})
    # the fsdp engine alone is torchtitan's FSDP2 with fp32 reduction
    assert (job.parallel.fsdp_version, job.parallel.grad_reduce_in_fp32) == (1, False)
    assert job.preset.taken["fsdp_version"] == 1
