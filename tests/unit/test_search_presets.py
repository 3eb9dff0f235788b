"""A search run with a framework preset (``--framework nemo-24.07``, or a job file naming one):
it searches the preset's engine, every plan it predicts takes the preset's defaults for the
fields the search does not vary (a conditional one per plan), a field the search varies is
searched, and the output says the preset and the defaults taken."""

from __future__ import annotations

import json

import pytest
import yaml
from test_screen import screen_matches_the_exact_prediction
from typer.testing import CliRunner

from paraplan.catalog.loader import load_cluster, load_model
from paraplan.catalog.presets import find_preset, presets
from paraplan.cli.app import app
from paraplan.search import search_plans
from paraplan.search.space import SearchSpace, enumerate_plans, preset_model
from paraplan.specs import ConfigError, Precision


def _small():
    return load_model("llama-3-8b"), load_cluster("dgx-h100", num_nodes=2)


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "80"})
    return result.exit_code, result.stdout, result.stderr


_SEARCH = ("search", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--num-nodes", "2",
           "--global-batch-size", "64", "--mbs", "1,2")


def test_every_plan_of_a_preset_search_takes_the_preset_s_defaults_on_its_engine():
    model, cluster = _small()
    space = SearchSpace(framework="megatron-bridge-0.1", micro_batch_size=(1, 2))
    assert (space.framework, space.preset) == ("megatron", "megatron-bridge-0.1")
    result = search_plans(model, cluster, 64, Precision.BF16, space)
    assert len(result.ranked) > 3
    for pred in result.ranked:
        plan, use = pred.job.parallel, pred.job.preset
        assert use.preset == "megatron-bridge-0.1" and plan.grad_reduce_in_fp32 is True
        # "with tp > 1" and "with sequence parallelism": taken per plan
        assert plan.sequence_parallel == plan.tp_comm_overlap == (plan.tp > 1)
        assert ("sequence_parallel" in use.taken) == ("tp_comm_overlap" in use.taken) == (plan.tp > 1)


def test_a_preset_search_of_an_fp8_job_takes_the_preset_s_fp8_recipe_and_a_bf16_one_none():
    model, cluster = _small()
    space = SearchSpace(framework="torchtitan-0.1", micro_batch_size=(1,))
    fp8 = search_plans(model, cluster, 64, Precision.FP8, space)
    assert fp8.ranked and all(p.job.parallel.fp8_recipe.value == "current" for p in fp8.ranked)
    assert all(p.job.preset.taken.get("fp8_recipe") == "current" for p in fp8.ranked)
    bf16 = search_plans(model, cluster, 64, Precision.BF16, space)
    assert bf16.ranked and all(p.job.parallel.fp8_recipe is None for p in bf16.ranked)


def test_the_engine_s_searched_axes_stay_searched_and_its_pinned_ones_take_the_preset_s_value():
    space = SearchSpace(framework="megatron-core-0.12")
    # ZeRO 0-1 and the recompute policies are what the engine's space searches; sequence
    # parallelism it pins ("with tp > 1"), so megatron-core's default (off) replaces it
    assert space.zero_stage == (0, 1) and len(space.recompute) == 3 and space.sequence_parallel == "off"
    assert SearchSpace(framework="nemo-24.07").sequence_parallel == "with_tp"
    assert SearchSpace(framework="torchtitan-0.1").preset_fields == ("grad_reduce_in_fp32", "fsdp_version",
                                                                     "optimizer_impl", "grad_clip_scale",
                                                                     "recompute_every", "grads_set_to_none",
                                                                     "cp_comm_type",
                                                                     "attention_kernel", "fp8_recipe")
    # torchtitan 0.3 pins its sequence parallelism, async TP (off), the uncompiled and chunked loss
    # and the pipeline's outputs; its recompute stays searched (none, full, op: what it runs)
    assert SearchSpace(framework="torchtitan").preset_fields == (
        "sequence_parallel", "async_tp", "grad_reduce_in_fp32", "compile_loss", "fsdp_version", "optimizer_impl",
        "grad_clip_scale", "loss_chunks", "pipeline_keeps_outputs", "grads_set_to_none", "cp_comm_type",
        "fp8_recipe")


def test_a_field_the_search_varies_is_searched_not_pinned_by_the_preset():
    model, cluster = _small()
    space = SearchSpace(framework="nemo", zero_stage=(0, 1), sequence_parallel="both", micro_batch_size=(1,))
    jobs = enumerate_plans(model, cluster, 64, Precision.BF16, space).jobs
    assert {j.parallel.zero_stage for j in jobs} == {0, 1}
    assert {j.parallel.sequence_parallel for j in jobs if j.parallel.tp > 1} == {True, False}
    zero0 = next(j for j in jobs if j.parallel.zero_stage == 0)
    assert zero0.preset.overridden["zero_stage"] == (0, 1) and "zero_stage" not in zero0.preset.taken
    # what the search does not vary is the preset's
    assert zero0.preset.taken == {"overlap_grad_reduce": True, "grad_reduce_in_fp32": True, "attention_kernel": "cudnn"}


def test_a_plain_engine_search_takes_no_preset():
    model, cluster = _small()
    space = SearchSpace(framework="megatron", micro_batch_size=(1,))
    assert space.preset is None and space.zero_stage == (0, 1) and space.sequence_parallel == "with_tp"
    assert all(j.preset is None for j in enumerate_plans(model, cluster, 64, Precision.BF16, space).jobs)


def test_an_unknown_preset_in_a_search_space_names_the_field_and_the_presets():
    with pytest.raises(ConfigError, match=r"^framework: 'nemo-99.01' .*nemo-24.07"):
        SearchSpace(framework="nemo-99.01")


@pytest.mark.parametrize("preset_id", list(presets()))
def test_the_screen_matches_the_exact_prediction_under_each_preset(preset_id):
    """The screen builds its representative Jobs through ``plan_job``, so each takes the
    preset's defaults as the exact path does (fms-fsdp's hybrid sharding below 30 B too)."""
    for model, cluster, pp in (("gpt3-1.3b", "dgx-a100", None), ("llama-3-8b", "dgx-h100", (1, 2))):
        space = SearchSpace(framework=preset_id, micro_batch_size=(1, 2), pp=pp)
        jobs = screen_matches_the_exact_prediction(
            (load_model(model), load_cluster(cluster, num_nodes=2), Precision.BF16, 32, space))
        assert jobs and all(j.preset is not None and j.preset.preset == preset_id for j in jobs)


@pytest.mark.parametrize("preset_id", list(presets()))
def test_every_plan_of_a_preset_search_writes_back_as_a_job_file_that_resolves_to_it(preset_id):
    from paraplan.catalog import resolve_job
    from paraplan.catalog.jobfile import job_mapping

    model, cluster = load_model("gpt3-1.3b"), load_cluster("dgx-a100", num_nodes=2)
    space = SearchSpace(framework=preset_id, micro_batch_size=(1,), sequence_parallel="both",
                        recompute=("none", "full", "layer") if find_preset(preset_id).engine.value == "fsdp" else None)
    # the preset's model code (fms' and torchtitan-0.1's separate q, k, v GEMMs), as search_plans lays it
    jobs = enumerate_plans(preset_model(model, space), cluster, 32, Precision.BF16, space).jobs
    assert jobs
    for job in jobs:
        assert resolve_job(job_mapping(job)) == job, job.name


def test_the_search_table_and_json_say_the_preset_and_the_defaults_taken():
    code, out, _ = _run(*_SEARCH, "--framework", "nemo-24.07", "--zero", "0,1")
    assert code == 0
    assert "for nemo-24.07 on megatron" in out
    assert "defaults taken from it: sequence_parallel true (with tp > 1)" in out
    code, out, _ = _run(*_SEARCH, "--framework", "nemo-24.07", "--zero", "0,1", "-f", "json")
    data = json.loads(out)
    assert code == 0 and data["framework_preset"]["preset"] == "nemo-24.07"
    assert data["framework_preset"]["defaults_taken"]["grad_reduce_in_fp32"] is True
    assert "zero_stage" not in data["framework_preset"]["defaults_taken"]  # searched
    assert data["framework_preset"]["searched"]["zero_stage"] == 1  # ZeRO-0 plans: not the preset's 1
    assert all(r["framework_preset"]["preset"] == "nemo-24.07" for r in data["plans"])


def test_the_saved_best_plan_names_the_preset_and_predicts_the_same_time(tmp_path):
    best = tmp_path / "best.yaml"
    code, out, _ = _run(*_SEARCH, "--framework", "torchtitan", "--top", "1", "--save-best", str(best), "-f", "json")
    assert code == 0
    top = json.loads(out)["plans"][0]
    saved = yaml.safe_load(best.read_text())
    assert saved["parallel"]["framework"] == "torchtitan-0.3" and "fsdp_version" not in saved["parallel"]
    code, out, _ = _run("predict", str(best), "-f", "json")
    assert code == 0
    predicted = json.loads(out)
    assert predicted["iteration_s"] == pytest.approx(top["iteration_s"], rel=1e-12)
    assert predicted["framework_preset"]["defaults_taken"] == top["framework_preset"]["defaults_taken"]


def test_a_job_file_naming_a_preset_searches_with_it(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 2},
                                   "parallel": {"framework": "megatron-core-0.12", "global_batch_size": 64}}))
    code, out, _ = _run("search", str(job), "--mbs", "1", "-f", "json")
    data = json.loads(out)
    assert code == 0 and data["framework_preset"]["preset"] == "megatron-core-0.12"
    assert data["plans"] and not any(r["sequence_parallel"] for r in data["plans"])  # megatron-core's default


def test_a_job_file_s_own_value_of_a_field_the_preset_sets_is_kept_over_the_preset_s(tmp_path):
    job, best = tmp_path / "job.yaml", tmp_path / "best.yaml"
    job.write_text(yaml.safe_dump({"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 2},
                                   "parallel": {"framework": "megatron-bridge", "tp_comm_overlap": False,
                                                "global_batch_size": 64}}))
    code, out, err = _run("search", str(job), "--mbs", "1", "--save-best", str(best), "-f", "json")
    data = json.loads(out)
    assert code == 0 and "tp_comm_overlap" not in err  # kept, not "neither varies nor keeps"
    assert data["framework_preset"]["searched"]["tp_comm_overlap"] is True  # the preset's, not used
    assert any(r["tp"] > 1 for r in data["plans"])
    assert yaml.safe_load(best.read_text())["parallel"]["tp_comm_overlap"] is False
    code, out, _ = _run("predict", str(best), "-f", "json")
    assert code == 0 and json.loads(out)["iteration_s"] == pytest.approx(data["plans"][0]["iteration_s"], rel=1e-12)


def test_a_job_file_s_fp8_amax_reduction_off_is_kept_over_the_nemo_preset_s_in_every_plan(tmp_path):
    job, best = tmp_path / "job.yaml", tmp_path / "best.yaml"
    job.write_text(yaml.safe_dump({"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 2},
                                   "precision": "fp8",
                                   "parallel": {"framework": "nemo-24.07", "fp8_amax_reduce": "none",
                                                "global_batch_size": 64}}))
    code, out, err = _run("search", str(job), "--mbs", "1", "--save-best", str(best), "-f", "json")
    assert code == 0 and "fp8_amax_reduce" not in err  # kept, not "neither varies nor keeps"
    assert yaml.safe_load(best.read_text())["parallel"]["fp8_amax_reduce"] == "none"
    code, out2, _ = _run("predict", str(best), "-f", "json")
    assert code == 0 and json.loads(out2)["iteration_s"] == pytest.approx(json.loads(out)["plans"][0]["iteration_s"],
                                                                           rel=1e-12)


def test_every_field_a_preset_sets_is_an_axis_of_the_search_or_kept_from_the_job_file():
    from paraplan.search.space import PRESET_STATED

    axes = {"zero_stage", "sequence_parallel", "recompute", "data_parallel_shard_degree"}
    # recompute_every: the screen takes it linear in the layers; fp8_recipe: the job's precision's
    kept_otherwise = {"recompute_every", "fp8_recipe"}
    fields = {d.field for p in presets().values() for d in p.defaults}
    assert fields - axes - kept_otherwise <= set(PRESET_STATED)


def test_an_unknown_preset_in_a_search_is_one_line_and_exit_2():
    code, _, err = _run(*_SEARCH, "--framework", "nemo-99.01")
    assert code == 2
    assert err.strip().count("\n") == 0 and "framework: 'nemo-99.01'" in err and "torchtitan-0.1" in err


_NEMO_JOB = {"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 2},
             "parallel": {"framework": "nemo-24.07", "tp": 2, "pp": 2, "global_batch_size": 64}, "precision": "bf16"}


def test_compare_names_the_preset_and_says_a_preset_changed(tmp_path):
    nemo, plain = tmp_path / "nemo.yaml", tmp_path / "plain.yaml"
    nemo.write_text(yaml.safe_dump(_NEMO_JOB))
    plain.write_text(yaml.safe_dump({**_NEMO_JOB, "parallel": {**_NEMO_JOB["parallel"], "framework": "megatron"}}))
    code, out, _ = _run("compare", str(plain), str(nemo))
    assert code == 0
    assert "nemo-24.07 on megatron" in out and "framework preset none -> nemo-24.07" in " ".join(out.split())
    code, out, _ = _run("compare", str(plain), str(nemo), "-f", "json")
    data = json.loads(out)
    assert "framework_preset" not in data["a"] and data["b"]["framework_preset"]["defaults_taken"]["zero_stage"] == 1


def test_a_megatron_export_of_a_preset_job_sets_the_preset_s_defaults_as_flags_and_names_it(tmp_path):
    bridge = tmp_path / "bridge.yaml"
    bridge.write_text(yaml.safe_dump({**_NEMO_JOB, "parallel": {**_NEMO_JOB["parallel"], "framework": "megatron-bridge"}}))
    code, out, _ = _run("export", "megatron", str(bridge))
    assert code == 0
    assert "predicted for megatron-bridge-0.1" in out
    for flag in ("--sequence-parallel", "--use-distributed-optimizer", "--tp-comm-overlap"):
        assert flag in out


def test_the_html_report_of_a_preset_job_lists_the_defaults_taken():
    from paraplan.catalog import resolve_job
    from paraplan.prediction import predict
    from paraplan.report.html import _summary

    html = _summary(predict(resolve_job(_NEMO_JOB)))
    assert "framework nemo-24.07" in html and "defaults taken from it: zero_stage 1" in html


def test_a_torchtitan_export_of_an_fsdp1_preset_job_names_the_preset_and_says_torchtitan_runs_fsdp2(tmp_path):
    fms = tmp_path / "fms.yaml"
    fms.write_text(yaml.safe_dump({**_NEMO_JOB, "parallel": {"framework": "fms-fsdp", "global_batch_size": 64}}))
    code, out, _ = _run("export", "torchtitan", str(fms))
    assert code == 0
    assert "predicted for fms-fsdp-2024.03" in out and "fsdp_version 1" in out
    assert "NOTE(paraplan): parallel.fsdp_version: the prediction followed FSDP1" in out
    assert "NOTE(paraplan): parallel.optimizer_impl: the prediction ran torch's foreach AdamW" in out


def test_the_screen_matches_the_exact_prediction_on_interleaved_plans_that_overlap_their_sends():
    space = SearchSpace(framework="megatron-core-0.12", vpp=(1, 2), micro_batch_size=(1, 2))
    screen_matches_the_exact_prediction(
        (load_model("gpt3-1.3b"), load_cluster("dgx-a100", num_nodes=2), Precision.BF16, 32, space))


def test_a_fms_fsdp_search_ranks_only_plans_without_tp_pp_cp_or_ep():
    model, cluster = _small()
    space = SearchSpace.full(framework="fms-fsdp-2024.03", micro_batch_size=(1, 2))
    assert (space.tp, space.pp, space.cp, space.ep) == ((1,), (1,), (1,), (1,))
    result = search_plans(model, cluster, 64, Precision.BF16, space)
    assert len(result.ranked) > 3
    assert {(p.job.parallel.tp, p.job.parallel.pp, p.job.parallel.cp, p.job.parallel.ep) for p in result.ranked} == {
        (1, 1, 1, 1)}


def test_a_fms_fsdp_search_keeps_tp_1_of_the_tp_axis_and_refuses_an_axis_it_never_runs():
    code, out, _ = _run(*_SEARCH, "--framework", "fms-fsdp-2024.03", "--tp", "1,2,4")
    assert code == 0 and "every plan: tp 1, pp 1" in out
    code, _, err = _run(*_SEARCH, "--framework", "fms-fsdp-2024.03", "--tp", "2,4")
    assert code == 2
    assert err.strip() == "error: tp: fms-fsdp-2024.03 (IBM fms-fsdp (PyTorch FSDP1), 2024-03) runs tp 1 only, not 2"


def test_the_search_and_the_job_validator_agree_on_what_fms_fsdp_runs_over_every_plan_of_a_small_space():
    import itertools

    from paraplan.catalog import resolve_job

    checked = 0
    for tp, pp, cp, ep in itertools.product((1, 2), repeat=4):
        try:
            SearchSpace(framework="fms-fsdp-2024.03", tp=(tp,), pp=(pp,), cp=(cp,), ep=(ep,))
            searched = None
        except ConfigError as err:
            searched = str(err)
        job = {"model": "mixtral-8x7b", "cluster": {"name": "dgx-h100", "num_nodes": 2}, "precision": "bf16",
               "parallel": {"framework": "fms-fsdp-2024.03", "tp": tp, "pp": pp, "cp": cp, "ep": ep,
                            "micro_batch_size": 1, "global_batch_size": 64}}
        try:
            resolve_job(job)
            validated = None
        except ConfigError as err:
            validated = str(err)
        assert (searched is None) == (validated is None), (tp, pp, cp, ep, searched, validated)
        if validated is not None:
            assert validated == f"parallel.{searched}"
        checked += 1
    assert checked == 16


def test_a_fms_fsdp_search_tries_only_the_recompute_policies_fms_fsdp_offers():
    model, cluster = _small()
    space = SearchSpace.full(framework="fms-fsdp-2024.03", micro_batch_size=(1, 2))
    assert [r.value for r in space.recompute] == ["none", "full"]  # torchtitan's engine default adds 'op'
    assert [r.value for r in SearchSpace(framework="torchtitan-0.1").recompute] == ["none", "full", "op"]
    result = search_plans(model, cluster, 64, Precision.BF16, space)
    assert len(result.ranked) > 3
    assert {p.job.parallel.recompute.value for p in result.ranked} <= {"none", "full"}
    assert [r.value for r in SearchSpace(framework="fms-fsdp-2024.03", recompute=("layer", "op")).recompute] == [
        "layer"]


def test_a_fms_fsdp_search_asked_for_per_op_recompute_only_exits_2_with_one_line():
    code, _, err = _run(*_SEARCH, "--framework", "fms-fsdp-2024.03", "--recompute", "op")
    assert code == 2
    assert err.strip() == ("error: recompute: fms-fsdp-2024.03 (IBM fms-fsdp (PyTorch FSDP1), 2024-03) runs "
                           "recompute none or full or layer only, not 'op'")


def test_a_composer_search_tries_whole_block_recompute_and_none_never_a_per_op_policy():
    assert [r.value for r in SearchSpace.full(framework="composer-0.17").recompute] == ["none", "full"]
    with pytest.raises(ConfigError, match="runs recompute none or full only, not 'op'"):
        SearchSpace(framework="composer-0.17", recompute=("op",))
