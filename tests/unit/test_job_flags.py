"""The job flags predict, report, compare (and, for the model, search) share: one definition,
--seq-length and --hf-config laid over a job, and what a run without a job file took from the
demo job."""

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from paraplan.catalog import resolve_job
from paraplan.catalog.jobs import apply_overrides, demo_job_mapping
from paraplan.cli.app import app
from paraplan.cli.common import JOB_FLAGS, MODEL_FLAGS
from paraplan.cli.loading import from_demo
from paraplan.specs import ConfigError

HF = Path(__file__).parent / "fixtures" / "llama-2-7b-config.json"


def _options(command: str) -> set[str]:
    click_command = typer.main.get_command(app).commands[command]
    return {name for p in click_command.params for name in p.opts + p.secondary_opts}


def _flag_names(flags) -> set[str]:
    return {part for f in flags for part in f.flag.split("/")}


@pytest.mark.parametrize("command", ["predict", "report", "compare"])
def test_predict_report_and_compare_take_every_job_flag(command):
    assert _flag_names(JOB_FLAGS) <= _options(command)


def test_search_takes_the_model_flags():
    assert {"--seq-length", "--hf-config"} <= _options("search")
    assert _flag_names(MODEL_FLAGS) == {"--seq-length", "--hf-config"}


def test_a_seq_length_flag_changes_the_sequence_length_of_a_catalog_model():
    job = resolve_job(apply_overrides(demo_job_mapping(), {"seq_length": 4096}))
    assert job.model.seq_length == 4096
    assert job.model.num_layers == resolve_job(demo_job_mapping()).model.num_layers


@pytest.mark.parametrize("bad", [0, -8, True, 2.5])
def test_a_seq_length_that_is_not_a_positive_whole_number_is_refused_naming_the_field(bad):
    with pytest.raises(ConfigError, match=r"^seq_length: expected a positive whole number"):
        apply_overrides(demo_job_mapping(), {"seq_length": bad})


def test_an_hf_config_flag_replaces_the_model_and_keeps_the_jobs_sequence_length():
    job = resolve_job(apply_overrides(demo_job_mapping(), {"hf_config": str(HF)}))
    assert job.model.hidden_size == 4096 and job.model.num_layers == 32  # Llama-2-7B's config.json
    assert job.model.seq_length == resolve_job(demo_job_mapping()).model.seq_length
    assert job.model.name == "llama-2-7b-config"  # a config saved under its own name is named by it


def test_an_hf_config_flag_takes_the_seq_length_flag_first():
    job = resolve_job(apply_overrides(demo_job_mapping(), {"hf_config": str(HF), "seq_length": 2048}))
    assert job.model.seq_length == 2048


def test_an_hf_config_flag_with_a_model_flag_is_refused_naming_both():
    with pytest.raises(ConfigError, match=r"^hf_config: --hf-config and --model"):
        apply_overrides(demo_job_mapping(), {"hf_config": str(HF), "model": "llama-3-8b"})


def test_the_demo_line_names_the_flags_that_would_set_what_the_demo_job_gave():
    demo = demo_job_mapping()
    words = " ".join(from_demo(demo, {}, 8192))
    for part in ("--model llama-3-8b", "--seq-length 8192", "--cluster aws-p5.48xlarge", "--num-nodes 4",
                 "--tp 2", "--global-batch-size 512", "--sequence-parallel", "--precision bf16"):
        assert part in words


def test_the_demo_line_leaves_out_what_a_flag_set():
    demo = demo_job_mapping()
    words = " ".join(from_demo(demo, {"tensor_model_parallel_size": 4, "cluster": "dgx-h100",
                                      "sequence_parallel": False}, 8192))
    assert "--tp" not in words and "--cluster" not in words and "sequence-parallel" not in words
    assert "--num-nodes" not in words  # a cluster flag replaces the demo's cluster, its size too
    assert "--model llama-3-8b" in words and "--pp 1" in words


def test_the_demo_line_says_the_sequence_length_came_from_the_demo_job_under_an_hf_config():
    words = " ".join(from_demo(demo_job_mapping(), {"hf_config": str(HF)}, 8192))
    assert "--model" not in words and "--seq-length 8192" in words
    assert "--seq-length" not in " ".join(from_demo(demo_job_mapping(), {"hf_config": str(HF), "seq_length": 64}, 64))


def test_a_plan_flag_is_named_by_the_short_name_job_files_use():
    from paraplan.specs import PLAN_ALIASES

    short = {field: alias for alias, field in PLAN_ALIASES.items()}
    aliased = [f for f in JOB_FLAGS if f.key in short]
    assert {f.key for f in aliased} >= {"tensor_model_parallel_size", "expert_tensor_parallel_size"}
    assert all(f.flag == f"--{short[f.key]}" for f in aliased)


def test_every_plan_flag_lands_in_the_parallel_part_of_the_job():
    from paraplan.specs import ParallelPlan

    plan_keys = [f.key for f in JOB_FLAGS if f.key in ParallelPlan.model_fields]
    job = apply_overrides(demo_job_mapping(), dict.fromkeys(plan_keys, "x"))
    assert {k for k, v in job["parallel"].items() if v == "x"} == set(plan_keys)


def test_a_job_files_dp_shard_is_read_as_the_plans_data_parallel_shard_degree():
    job = apply_overrides({**demo_job_mapping(), "parallel": {"dp_shard": 2}}, {})
    assert job["parallel"] == {"data_parallel_shard_degree": 2}


# -- the demo job's values are an example, not the user's (auditor's A, C) ----------------------

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama-3-70b-dgx-h100-tp8-pp4.yaml"


def _flags(**given):
    return {**{f.key: None for f in JOB_FLAGS}, **given}


def test_a_framework_flag_on_the_demo_job_takes_the_preset_s_defaults_over_the_demo_s_values():
    from paraplan.cli.loading import load_flagged_job

    job, said = load_flagged_job(None, _flags(framework="torchtitan", recompute="op"))
    assert job.parallel.zero_stage == 3  # torchtitan's FSDP2 shards fully; the demo job says ZeRO-1
    assert job.preset.taken["zero_stage"] == 3 and not job.preset.overridden
    assert "--zero-stage" not in said and "--recompute" not in said
    job, _ = load_flagged_job(None, _flags(framework="nemo"))
    assert job.parallel.recompute.value == "none" and not job.preset.overridden


def test_a_flag_still_wins_over_the_preset_on_the_demo_job_and_is_called_the_user_s_value():
    from paraplan.cli.loading import load_flagged_job

    job, _ = load_flagged_job(None, _flags(framework="nemo", recompute="selective"))
    assert job.preset.overridden == {"recompute": ("selective", "none")}
    assert any("recompute selective: your value" in line for line in job.preset.lines())


def test_predict_with_a_framework_and_no_job_file_never_calls_a_demo_value_your_value():
    for args in (["--framework", "torchtitan", "--recompute", "op"], ["--framework", "nemo"]):
        result = CliRunner().invoke(app, ["predict", *args], env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output
        assert "your value" not in result.output and "cannot run this plan" not in result.output


def test_a_job_file_s_stated_field_still_wins_over_the_preset_and_is_said(tmp_path):
    from paraplan.cli.loading import load_flagged_job

    job, _ = load_flagged_job(EXAMPLE, _flags(framework="nemo"))
    assert job.parallel.recompute.value == "selective"
    assert job.preset.overridden["recompute"] == ("selective", "none")


@pytest.mark.parametrize("flag", [{"cluster": "dgx-h100"}, {"gpu": "B200"}, {"cluster": "gb200-nvl72"}])
def test_a_cluster_or_gpu_flag_keeps_the_job_file_s_number_of_nodes(flag):
    from paraplan.cli.loading import load_flagged_job

    job, _ = load_flagged_job(EXAMPLE, _flags(**flag))
    assert job.cluster.num_nodes == 8  # the file's; a GB200 NVL72 node is 4 GPUs: 32 GPUs then
    assert job.cluster.num_gpus == 8 * job.cluster.gpus_per_node


def test_a_num_nodes_flag_beside_a_cluster_flag_sets_the_number_of_nodes():
    from paraplan.cli.loading import load_flagged_job

    job, _ = load_flagged_job(EXAMPLE, _flags(cluster="dgx-b200", num_nodes=4))
    assert job.cluster.num_nodes == 4 and job.cluster.gpu.name == "B200"


def test_a_cluster_flag_on_the_demo_job_takes_the_named_cluster_s_own_size():
    from paraplan.cli.loading import load_flagged_job

    job, said = load_flagged_job(None, _flags(cluster="dgx-h100"))
    assert job.cluster.num_nodes == 1 and "--num-nodes" not in said  # the demo's 4 were its p5's


def test_predict_of_a_job_file_on_another_cluster_runs_instead_of_blaming_tp_and_pp():
    for flag in (["--cluster", "dgx-h100"], ["--gpu", "B200"]):
        result = CliRunner().invoke(app, ["predict", str(EXAMPLE), *flag, "-f", "json"])
        assert result.exit_code == 0, result.output
        assert "does not divide" not in result.output and json.loads(result.stdout)["num_gpus"] == 64


def test_the_predict_header_says_1_micro_batch_in_the_singular():
    result = CliRunner().invoke(app, ["predict", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--tp", "8",
                                      "--micro-batch-size", "1", "--global-batch-size", "1"],
                                env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "(1 micro-batch)" in text and "micro-batches)" not in text


@pytest.mark.parametrize("command", ["predict", "search"])
def test_predict_and_search_take_the_queued_kernel_gap_switch(command):
    assert {"--queued-kernel-gap", "--no-queued-kernel-gap"} <= _options(command)


def test_the_queued_kernel_gap_flag_switches_the_gap_on_in_predict_and_off_over_a_job_file(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 1},
                               "parallel": {"tp": 2, "global_batch_size": 16, "queued_kernel_gap": True}}))
    times = {}
    for flag in ("--queued-kernel-gap", "--no-queued-kernel-gap"):
        result = CliRunner().invoke(app, ["predict", str(job), flag, "-f", "json"], env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output
        times[flag] = json.loads(result.stdout)["iteration_s"]
    assert times["--queued-kernel-gap"] > times["--no-queued-kernel-gap"]


def test_the_search_keeps_the_queued_kernel_gap_flag_on_every_plan():
    from paraplan.search.request import SearchFlags, SearchRequest

    on = SearchRequest.from_flags(None, SearchFlags(model="llama-3-8b", cluster="dgx-h100", queued_kernel_gap=True))
    off = SearchRequest.from_flags(None, SearchFlags(model="llama-3-8b", cluster="dgx-h100"))
    assert all(s["space"].queued_kernel_gap for s in on.searches)
    assert not any(s["space"].queued_kernel_gap for s in off.searches)
