"""The torchtitan presets: torchtitan-0.3 (the 0.3.0 release `paraplan export torchtitan` targets,
each default read from its code) is what plain `torchtitan` names; the published torchtitan runs
of August 2024 are torchtitan-2024.08's (0.1's plan defaults, its eager RMSNorm)."""

from __future__ import annotations

import inspect
import json

import pytest
import yaml
from typer.testing import CliRunner

from paraplan.catalog import resolve_job
from paraplan.catalog.presets import apply_preset, find_preset, preset_sources
from paraplan.cli.app import app
from paraplan.prediction.entry import predict_any
from paraplan.specs import ConfigError, FP8Recipe, Framework, Recompute
from paraplan.validate.records import job_from_record, preset_of

_TITAN = {"model": "llama-3-8b", "cluster": "dgx-h100",
          "parallel": {"framework": "torchtitan", "micro_batch_size": 1, "global_batch_size": 8}, "precision": "bf16"}
# torchtitan 0.3.0's default for each field the preset sets, as paraplan names it
_EXPECTED = {"zero_stage": 3, "sequence_parallel": True, "async_tp": False, "grad_reduce_in_fp32": True,
             "compile_loss": False, "fsdp_version": 2, "optimizer_impl": "fused", "grad_clip_scale": True,
             "recompute": "op", "loss_chunks": 8,
             "pipeline_keeps_outputs": False, "grads_set_to_none": True, "cp_comm_type": "allgather",
             "fp8_recipe": "rowwise"}


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "80"})
    return result.exit_code, result.stdout, result.stderr


def test_torchtitan_0_3_takes_each_default_from_torchtitan_0_3_0_s_code():
    preset = find_preset("torchtitan-0.3")
    assert preset.engine is Framework.FSDP
    assert {d.field: d.value for d in preset.defaults} == _EXPECTED
    # eager silu * w3; w1 and w3 two GEMMs; q, k, v one (FusedQKVLinear); ComplexRoPE in float32
    assert {d.field: d.value for d in preset.model_defaults} == {
        "qkv_fusion": True, "gate_up_fusion": False, "swiglu_fusion": False, "rope_impl": "complex"}
    assert preset.recorded["attention_kernel"][0].startswith("flex")  # no FlexAttention curve: recorded
    assert preset.runs["recompute"][0] == ("none", "full", "op")  # no every-n-th-block policy in 0.3.0
    sources = preset_sources(preset)
    assert set(sources) == {*_EXPECTED, "swiglu_fusion", "qkv_fusion", "gate_up_fusion", "rope_impl", "attention_kernel",
                            "runs.recompute"}
    assert all("0.3.0" in source and "torchtitan/" in source for source in sources.values())
    when = {d.field: d.when for d in preset.defaults}
    assert when["sequence_parallel"] == when["async_tp"] == "tensor_parallel"
    assert (when["pipeline_keeps_outputs"], when["cp_comm_type"], when["fp8_recipe"]) == (
        "pipeline_parallel", "context_parallel", "fp8")


def test_torchtitan_0_3_s_defaults_are_the_installed_torchtitan_0_3_0_s_dataclass_values():
    torchtitan = pytest.importorskip("torchtitan", reason="torchtitan is installed with paraplan[frameworks]")
    from importlib.metadata import version

    if version("torchtitan") != "0.3.0":
        pytest.skip(f"torchtitan {version('torchtitan')} is installed, the preset reads 0.3.0")
    from torchtitan.components.loss import ChunkedLossWrapper
    from torchtitan.components.quantization.float8 import Float8LinearConverter
    from torchtitan.config.configs import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed.activation_checkpoint import SelectiveAC
    from torchtitan.models.llama3.config_registry import llama3_8b
    from torchtitan.trainer import Trainer

    assert torchtitan is not None
    par, compile_, train = ParallelismConfig(), CompileConfig(), TrainingConfig()
    assert (par.data_parallel_shard_degree, par.fsdp_reshard_after_forward) == (-1, "default")  # ZeRO-3
    assert par.enable_sequence_parallel is _EXPECTED["sequence_parallel"]
    assert compile_.enable is _EXPECTED["compile_loss"] and compile_.enable_async_tensor_parallel is False
    assert train.mixed_precision_reduce == "float32" and train.mixed_precision_param == "bfloat16"
    assert par.pipeline_parallel_schedule == "1F1B"  # paraplan's own default schedule
    assert ChunkedLossWrapper.Config().num_chunks == _EXPECTED["loss_chunks"]
    assert isinstance(llama3_8b().loss, ChunkedLossWrapper.Config)
    assert Float8LinearConverter.Config().recipe_name == _EXPECTED["fp8_recipe"]
    assert isinstance(Trainer.Config().activation_checkpoint, SelectiveAC.Config)  # per op: recompute op
    from torchtitan.components.optimizer.optimizer import OptimizersContainer
    from torchtitan.distributed import utils as dist_utils

    assert OptimizersContainer.Config().implementation == _EXPECTED["optimizer_impl"]
    # its clip scales every gradient through torch's clip_grads_with_norm_ (clamped coefficient)
    assert "clip_grads_with_norm_" in inspect.getsource(dist_utils.clip_grad_norm_) and _EXPECTED["grad_clip_scale"]


def test_plain_torchtitan_is_the_newest_preset():
    assert find_preset("torchtitan").id == "torchtitan-0.3"
    job = resolve_job(_TITAN)
    assert job.preset.preset == "torchtitan-0.3" and job.parallel.framework is Framework.FSDP
    assert job.parallel.recompute is Recompute.OP and job.parallel.loss_chunks == 8
    assert job.model.swiglu_fusion is False and job.model.gate_up_fusion is False and job.model.qkv_fusion
    assert job.preset.model_taken == {"qkv_fusion": True, "gate_up_fusion": False, "swiglu_fusion": False,
                                      "rope_impl": "complex"}
    assert job.model.gqa_expand == "none"  # 0.3.0 passes enable_gqa to the kernel: no repeat_kv copy
    older = resolve_job({**_TITAN, "parallel": {**_TITAN["parallel"], "framework": "torchtitan-0.1"}})
    assert older.parallel.recompute is Recompute.LAYER and older.parallel.loss_chunks is None


def test_the_2024_torchtitan_records_are_read_as_the_dated_preset_and_a_named_version_as_itself():
    assert preset_of({"framework": "torchtitan (FSDP2)"}).id == "torchtitan-2024.08"
    assert preset_of({"framework": "torchtitan 0.3.0 (FSDP2)"}).id == "torchtitan-0.3"
    assert preset_of({"framework": "torchtitan 0.1 (FSDP2)"}).id == "torchtitan-0.1"


def test_the_dated_torchtitan_runs_0_1_s_plan_defaults_with_an_eager_norm_and_swiglu():
    dated, release = find_preset("torchtitan-2024.08"), find_preset("torchtitan-0.1")
    assert dated.defaults == release.defaults
    assert {d.field: d.value for d in dated.model_defaults}.items() >= {
        "rmsnorm_fusion": False, "swiglu_fusion": False}.items()
    # 0.1 runs torch.nn.RMSNorm (fused) but the same eager silu-then-multiply SwiGLU
    assert {d.field: d.value for d in release.model_defaults}["swiglu_fusion"] is False
    assert "rmsnorm_fusion" not in {d.field for d in release.model_defaults}
    with pytest.raises(ConfigError) as err:  # a version the catalog lacks: the presets listed
        find_preset("torchtitan-2024.07")
    assert "\n" not in str(err.value) and "torchtitan-2024.08" in str(err.value) and "torchtitan-0.1" in str(err.value)


@pytest.mark.shared_data
def test_every_published_torchtitan_run_is_read_as_torchtitan_2024_08_and_predicts_as_a_job_naming_it(
        published_dir, tmp_path):
    from paraplan.validate import load_runs

    runs = [r for r in load_runs(published_dir / "runs_dev_modern.json") if "torchtitan" in str(r["framework"]).lower()]
    assert len(runs) == 8
    for run in runs:
        mapped = job_from_record(run)
        assert mapped.family == "torchtitan-2024.08"
        assert mapped.mapping["parallel"]["framework"] == "torchtitan-2024.08"
        assert "swiglu_fusion" not in mapped.mapping["model"]  # the preset's, not the reader's
    # a job file naming the preset predicts what the reader's job predicts
    mapped = job_from_record(runs[0])
    model = resolve_job(mapped.mapping).model
    assert (model.rmsnorm_fusion, model.swiglu_fusion) == (False, False)
    seconds = {}
    for name in ("torchtitan-2024.08", "torchtitan-0.1"):
        job = tmp_path / f"{name}.yaml"
        job.write_text(yaml.safe_dump({**mapped.mapping, "parallel": {**mapped.mapping["parallel"], "framework": name}}))
        code, out, _ = _run("predict", str(job), "-f", "json")
        assert code == 0
        seconds[name] = json.loads(out)["iteration_s"]
    assert seconds["torchtitan-2024.08"] == pytest.approx(predict_any(resolve_job(mapped.mapping)).iteration_s)
    assert seconds["torchtitan-2024.08"] > seconds["torchtitan-0.1"]  # the eager norm's extra kernels


def test_torchtitan_0_3_s_conditional_defaults_apply_only_where_their_rule_holds():
    preset = find_preset("torchtitan")
    plain, _ = apply_preset({}, preset, num_gpus=16, gpus_per_node=8, precision="bf16")
    assert not {"sequence_parallel", "async_tp", "pipeline_keeps_outputs", "cp_comm_type", "fp8_recipe"} & set(plain)
    split, use = apply_preset({"tp": 2, "pp": 2, "cp": 2}, preset, num_gpus=16, gpus_per_node=8, precision="fp8")
    assert split["sequence_parallel"] and split["async_tp"] is False
    assert split["pipeline_keeps_outputs"] is False and split["cp_comm_type"] == "allgather"
    assert use.taken["fp8_recipe"] == "rowwise"
    job = resolve_job({**_TITAN, "precision": "fp8", "cluster": {"name": "dgx-h100", "num_nodes": 2},
                       "parallel": {**_TITAN["parallel"], "tp": 2, "pp": 2, "global_batch_size": 16}})
    assert job.parallel.fp8_recipe is FP8Recipe.ROWWISE and job.parallel.sequence_parallel


def test_a_job_naming_torchtitan_with_every_nth_block_recompute_is_refused_naming_what_it_runs():
    with pytest.raises(ConfigError) as err:
        resolve_job({**_TITAN, "parallel": {**_TITAN["parallel"], "recompute": "layer"}})
    message = str(err.value)
    assert "\n" not in message and "parallel.recompute" in message and "torchtitan-0.3" in message
    assert "none or full or op" in message


def test_the_recipe_paraplan_exports_for_torchtitan_is_what_the_preset_predicted(tmp_path):
    job = tmp_path / "titan.yaml"
    job.write_text(yaml.safe_dump(_TITAN))
    code, out, _ = _run("predict", str(job), "-f", "json")
    assert code == 0
    predicted = json.loads(out)
    assert predicted["framework_preset"]["defaults_taken"]["loss_chunks"] == 8
    code, recipe, notes = _run("export", "torchtitan", str(job))
    assert code == 0
    # the recipe runs what was predicted: per-op selective AC, torchtitan's 8-chunk loss (its
    # default: no num_chunks written), nothing compiled; so no note says the recipe differs
    assert "activation_checkpoint=SelectiveAC.Config()" in recipe and "ChunkedLossWrapper.Config(" in recipe
    assert "num_chunks" not in recipe and "CompileConfig" not in recipe
    assert "NOTE(paraplan)" not in recipe and "loss_chunks" not in notes and "recompute" not in notes
    assert "predicted for torchtitan-0.3" in recipe
    # torchtitan-0.1's every-second-block recompute and whole logits are what 0.3.0 cannot run
    older = tmp_path / "titan01.yaml"
    older.write_text(yaml.safe_dump({**_TITAN, "parallel": {**_TITAN["parallel"], "framework": "torchtitan-0.1"}}))
    code, recipe, notes = _run("export", "torchtitan", str(older))
    assert code == 0 and "parallel.loss_chunks" in notes and "parallel.recompute" in notes


def test_torchtitan_0_3_s_chunked_loss_holds_an_eighth_of_0_1_s_whole_logits_copies():
    from paraplan.inventory import count_job
    from paraplan.prediction import predict
    from paraplan.prediction.framework_memory import loss_logits_bytes

    def loss_copies(job):  # at the loss, whichever moment of the step is the peak
        return loss_logits_bytes(job, count_job(job).stages[-1])

    new_job = resolve_job(_TITAN)
    old_job = resolve_job({**_TITAN, "parallel": {**_TITAN["parallel"], "framework": "torchtitan-0.1"}})
    assert 0 < loss_copies(new_job) == pytest.approx(loss_copies(old_job) / 8)
    assert predict(new_job).memory.total < predict(old_job).memory.total


def test_a_torchtitan_search_screens_its_chunked_loss_and_pipeline_outputs_as_predict_does():
    from paraplan.catalog import load_cluster, load_model
    from paraplan.prediction import predict
    from paraplan.search import SearchSpace
    from paraplan.search.screen import screen_plans
    from paraplan.search.space import enumerate_plans, iter_unique
    from paraplan.specs import Precision

    model, cluster = load_model("llama-3-8b"), load_cluster("dgx-h100", num_nodes=2)
    space = SearchSpace(framework="torchtitan", micro_batch_size=(1,), pp=(1, 2), tp=(1, 2))
    screen = screen_plans(model, cluster, 32, Precision.BF16, space)
    jobs = list(iter_unique(enumerate_plans(model, cluster, 32, Precision.BF16, space).jobs))
    assert len(screen) == len(jobs) and {j.parallel.loss_chunks for j in jobs} == {8}
    assert any(j.parallel.pp > 1 for j in jobs)
    for i, job in enumerate(jobs):
        pred = predict(job)
        assert screen.memory_bytes[i] == max(m.total for m in pred.memory), job.name
        assert screen.iteration_s[i] == pytest.approx(pred.iteration_s, rel=0.02), job.name
