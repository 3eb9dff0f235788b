"""Every flag and key an export writes is one its target accepts. Each example job, and a seeded
sample of the plans the search enumerates, is exported to every target that can run it and read back
by the target's own reader: Megatron-LM's parser (rebuilt from the extract of its pinned source,
tests/fixtures/megatron_flags.json), DeepSpeed's DeepSpeedConfig (every key must be one DeepSpeed
reads or validates) and torchtitan's ConfigManager. No Megatron-LM flag restates its default."""

import argparse
import json
import random
import re
from functools import cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

from framework_parsers import (
    MEGATRON_FLAGS,
    bash_array,
    deepspeed_parse,
    deepspeed_restated_defaults,
    deepspeed_unread_keys,
    megatron_parser,
    parse_megatron,
    titan_parse,
    titan_restated_defaults,
)
from paraplan.catalog import load_job, resolve_job
from paraplan.export import TARGETS, export_notes, render
from paraplan.export.megatron import CHECKED_AT
from paraplan.search.space import SearchSpace, enumerate_plans
from paraplan.specs import ConfigError

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
SLURM_ARRAYS = ("DATA_ARGS", "TRAIN_ARGS", "CKPT_ARGS")
# the target each framework of paraplan's plans is exported to
TARGETS_OF = {"megatron": ("megatron", "slurm"), "deepspeed": ("deepspeed",), "fsdp": ("torchtitan",)}


def export_or_refusal(target, job):
    """The recipe, or None where the target cannot run the plan: then the refusal is one line that
    names the field (the rule of paraplan.export)."""
    try:
        return render(target, job)
    except ConfigError as err:
        assert re.match(r"^[a-z_]+(\.[a-z_]+)*: \S", str(err)) and "\n" not in str(err), str(err)
        return None


@cache
def example_recipes():
    """(example, target) -> recipe text (None: refused) for every example and target."""
    return {(path.stem, target): export_or_refusal(target, load_job(path)) for path in EXAMPLES for target in TARGETS}


@cache
def sampled_plans():
    """A seeded sample of the plans the search enumerates (the whole space of each framework) for a
    dense and a mixture-of-experts model, with the targets of each plan's framework."""
    rng = random.Random(24)
    out = []
    for model, nodes, frameworks in (("llama-3-8b", 2, ("megatron", "deepspeed", "fsdp")),
                                     ("mixtral-8x7b", 4, ("megatron",))):
        base = resolve_job({"model": model, "cluster": {"name": "dgx-h100", "num_nodes": nodes},
                            "parallel": {"global_batch_size": 64}})
        for framework in frameworks:
            space = SearchSpace.full(framework=framework)
            jobs = enumerate_plans(base.model, base.cluster, 64, base.precision, space).jobs
            assert jobs, f"{framework}: the search enumerated no plan"
            for job in rng.sample(jobs, min(8, len(jobs))):
                out.append((f"{model}-{framework}", job))
    return out


@cache
def sampled_recipes():
    """(label, target, recipe text or None) for the sampled plans."""
    return [(label, target, export_or_refusal(target, job))
            for label, job in sampled_plans() for target in TARGETS_OF[job.parallel.framework.value]]


def megatron_tokens(target, text):
    return bash_array(text, "MEGATRON_ARGS") + [
        token for name in SLURM_ARRAYS if target == "slurm" for token in bash_array(text, name)]


def all_megatron_recipes():
    recipes = [(f"{name}/{target}", target, text) for (name, target), text in example_recipes().items()
               if target in ("megatron", "slurm") and text is not None]
    recipes += [(f"{label}/{target}", target, text) for label, target, text in sampled_recipes()
                if target in ("megatron", "slurm") and text is not None]
    return recipes


# ---------------------------------------------------------------- Megatron-LM


def test_the_extract_names_its_source_and_holds_the_flags_generated_from_megatrons_dataclasses():
    source = MEGATRON_FLAGS["source"]
    assert source["repository"] == "NVIDIA/Megatron-LM" and re.fullmatch(r"[0-9a-f]{40}", source["commit"])
    options = {o for entry in MEGATRON_FLAGS["arguments"] for o in entry["options"]}
    # model and parallelism flags (literal add_argument calls at the pinned commit), and TrainingConfig's
    # fields that ArgumentGroupFactory turns into flags (--train-samples)
    assert {"--num-layers", "--tensor-model-parallel-size", "--sequence-parallel", "--bf16", "--fp8-format",
            "--disable-bias-linear", "--moe-router-topk", "--recompute-granularity"} <= options
    assert {"--train-samples", "--ckpt-format", "--use-megatron-fsdp", "--save-interval"} <= options
    assert "--no-overlap-p2p-communication" in options and "--overlap-p2p-communication" not in options


def test_the_recipes_name_the_commit_whose_parser_checked_their_flags():
    assert MEGATRON_FLAGS["source"]["commit"].startswith(CHECKED_AT)


def test_megatron_lms_parser_refuses_the_overlap_flag_it_never_had():
    with pytest.raises(SystemExit):  # "unrecognized arguments", as pretrain_gpt.py stops
        megatron_parser().parse_args(["--overlap-p2p-communication"])


def test_every_megatron_recipe_of_the_examples_parses_with_megatron_lms_parser():
    recipes = {key: text for key, text in example_recipes().items() if key[1] in ("megatron", "slurm")}
    assert sum(text is not None for text in recipes.values()) >= 2 * (len(EXAMPLES) - 1)
    for (name, target), text in recipes.items():
        if text is None:
            continue
        args = parse_megatron(text, *(SLURM_ARRAYS if target == "slurm" else ()))
        job = load_job(Path(EXAMPLES[0].parent / f"{name}.yaml"))
        assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (
            job.parallel.tp, job.parallel.pp), name


def test_a_seeded_sample_of_searched_plans_exports_flags_megatron_lm_accepts():
    recipes = [(label, target, text) for label, target, text in sampled_recipes() if target in ("megatron", "slurm")]
    assert sum(text is not None for _, _, text in recipes) >= 12
    for label, target, text in recipes:
        if text is not None:
            assert parse_megatron(text, *(SLURM_ARRAYS if target == "slurm" else ())).num_layers, label


def test_no_megatron_flag_restates_megatron_lms_default():
    parser = megatron_parser()
    actions = {option: action for action in parser._actions for option in action.option_strings}
    for name, target, text in all_megatron_recipes():
        tokens = megatron_tokens(target, text)
        for i, token in enumerate(tokens):
            action = actions.get(token)
            if action is None:
                continue
            if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
                assert action.const != action.default, f"{name}: {token} is Megatron-LM's default"
                continue
            value = vars(parser.parse_args([token, tokens[i + 1]]))[action.dest]
            assert value != action.default, f"{name}: {token} {tokens[i + 1]} is Megatron-LM's default"


def test_interleaved_plans_keep_megatrons_overlapped_sends_or_turn_them_off_as_predicted():
    gpt3 = EXAMPLES[0].parent / "gpt3-175b-h100-fp8-megatron.yaml"
    overlapped = load_job(gpt3)
    assert overlapped.parallel.vpp > 1 and overlapped.parallel.overlap_p2p_comm
    text = render("megatron", overlapped)
    assert "overlap-p2p-communication" not in text
    assert parse_megatron(text).overlap_p2p_comm  # Megatron-LM's default with interleaving
    raw = json.loads(json.dumps({"model": {"name": "gpt3-175b", "position_embedding": "learned",
                                           "normalization": "layernorm"},
                                 "cluster": {"name": "dgx-h100", "num_nodes": 64}, "precision": "fp8",
                                 "parallel": {"tp": 4, "pp": 8, "vpp": 12, "sequence_parallel": True,
                                              "zero_stage": 1, "global_batch_size": 2048}}))
    blocking = resolve_job(raw)
    assert not blocking.parallel.overlap_p2p_comm
    assert not parse_megatron(render("megatron", blocking)).overlap_p2p_comm
    plain = resolve_job({**raw, "parallel": {**raw["parallel"], "vpp": 1}})
    assert "overlap-p2p-communication" not in render("megatron", plain)  # validate_args turns it off itself


# ---------------------------------------------------------------- DeepSpeed and torchtitan


def test_a_misspelt_deepspeed_key_is_caught_although_deepspeed_ignores_it():
    job = load_job(EXAMPLES[0].parent / "mistral-7b-one-node.yaml")
    config = json.loads(render("deepspeed", job))
    assert deepspeed_unread_keys(config, job.parallel.dp) == []
    config["zero_optimisation"] = config.pop("zero_optimization")
    deepspeed_parse(config, job.parallel.dp)  # DeepSpeed 0.19.8 says nothing...
    assert deepspeed_unread_keys(config, job.parallel.dp) == ["zero_optimisation", "zero_optimisation.stage"]


def test_every_deepspeed_config_of_the_examples_and_the_sample_has_only_keys_deepspeed_reads():
    recipes = [(name, text) for (name, target), text in example_recipes().items() if target == "deepspeed"]
    recipes += [(label, text) for label, target, text in sampled_recipes() if target == "deepspeed"]
    checked = 0
    for name, text in recipes:
        if text is None:
            continue
        config = json.loads(text)
        dp = config["_paraplan"]["launcher"]["data_parallel_size"]
        assert deepspeed_unread_keys(config, dp) == [], name
        checked += 1
    assert checked >= 8


def test_no_deepspeed_key_restates_deepspeeds_default():
    configs = [(name, text) for (name, target), text in example_recipes().items() if target == "deepspeed"]
    configs += [(label, text) for label, target, text in sampled_recipes() if target == "deepspeed"]
    for name, text in configs:
        if text is not None:
            assert deepspeed_restated_defaults(json.loads(text)) == [], name


def test_torchtitan_refuses_a_misspelt_key_in_a_recipe(tmp_path, monkeypatch):
    text = example_recipes()[("llama-3-70b-dgx-h100-tp8-pp4", "torchtitan")]
    assert "tensor_parallel_degree=" in text
    with pytest.raises(TypeError, match="tensor_paralel_degree"):  # the config dataclasses take no other keyword
        titan_parse(text.replace("tensor_parallel_degree=", "tensor_paralel_degree="), tmp_path, monkeypatch,
                    name="recipe_misspelt")


def _debug_model():
    from torchtitan.models.llama3 import model_registry

    return model_registry("debugmodel")


def test_every_torchtitan_recipe_of_the_examples_parses_with_torchtitans_config_manager(tmp_path, monkeypatch):
    """A model torchtitan has no flavor for (the recipe leaves it to the user) and FP8 (its converter
    builds only on a GPU) take torchtitan's debug model; everything else is the recipe's."""
    recipes = [(name, text) for (name, target), text in example_recipes().items()
               if target == "torchtitan" and text is not None]
    assert len(recipes) >= 4
    for i, (name, text) in enumerate(recipes):
        spec = _debug_model if "model_registry" not in text or "Float8" in text else None
        job = load_job(EXAMPLES[0].parent / f"{name}.yaml")
        par = titan_parse(text, tmp_path, monkeypatch, name=f"recipe_example_{i}", model_spec=spec).parallelism
        assert (par.tensor_parallel_degree, par.pipeline_parallel_degree) == (job.parallel.tp, job.parallel.pp), name


def test_every_torchtitan_recipe_of_the_sample_parses_with_torchtitans_config_manager(tmp_path, monkeypatch):
    recipes = [(label, text) for label, target, text in sampled_recipes() if target == "torchtitan"]
    assert sum(text is not None for _, text in recipes) >= 4
    for i, (label, text) in enumerate(recipes):
        if text is not None:
            assert titan_parse(text, tmp_path, monkeypatch, name=f"recipe_sample_{i}").parallelism, label


def test_paraplans_table_of_torchtitans_defaults_is_the_installed_torchtitans():
    pytest.importorskip("torchtitan", reason="torchtitan is installed with paraplan[frameworks]")
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.config import ParallelismConfig, TrainingConfig

    from paraplan.export.torchtitan import TORCHTITAN_DEFAULTS

    for block, config in (("training", TrainingConfig()), ("parallelism", ParallelismConfig()),
                          ("checkpoint", CheckpointManager.Config())):
        assert {key: getattr(config, key) for key in TORCHTITAN_DEFAULTS[block]} == TORCHTITAN_DEFAULTS[block], block


def test_no_torchtitan_key_restates_torchtitans_default():
    recipes = [(name, text) for (name, target), text in example_recipes().items() if target == "torchtitan"]
    recipes += [(label, text) for label, target, text in sampled_recipes() if target == "torchtitan"]
    assert sum(text is not None for _, text in recipes) >= 8
    for name, text in recipes:
        if text is not None:
            assert titan_restated_defaults(text) == [], name


# ---------------------------------------------------------------- what the recipes say


def test_every_recipe_states_the_framework_its_prediction_was_made_for():
    for (name, target), text in example_recipes().items():
        if text is None:
            continue
        job = load_job(EXAMPLES[0].parent / f"{name}.yaml")
        framework = job.parallel.framework.value
        said = f"{job.preset.preset} (" if job.preset is not None else f"{framework} ("  # a preset names itself
        assert f"predicted for {said}" in text, (name, target)
        if job.preset is not None:
            assert f") on {framework} (" in text, (name, target)
        runs_on = {"megatron": "megatron", "slurm": "megatron", "deepspeed": "deepspeed", "torchtitan": "fsdp"}[target]
        assert (f"re-predict with framework: {runs_on}" in text) == (framework != runs_on), (name, target)
        notes = export_notes(target, load_job(EXAMPLES[0].parent / f"{name}.yaml"))
        assert any(n.startswith("parallel.framework:") for n in notes) == (framework != runs_on), (name, target)


@pytest.mark.parametrize("target, parallel, field", [
    ("megatron", {"tp": 1, "pp": 4, "schedule": "zb-h1", "global_batch_size": 64}, "parallel.schedule"),
    ("deepspeed", {"tp": 1, "pp": 2, "zero_stage": 3, "framework": "deepspeed", "global_batch_size": 64},
     "parallel.zero_stage"),
    ("torchtitan", {"tp": 2, "pp": 1, "global_batch_size": 64}, "precision"),
], ids=["zero-bubble-to-megatron", "zero-3-with-pp-to-deepspeed", "fp16-to-torchtitan"])
def test_a_plan_the_target_cannot_run_is_refused_in_one_line_with_exit_2(target, parallel, field, tmp_path):
    from paraplan.cli.app import app

    raw = {"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 1}, "parallel": parallel}
    if target == "torchtitan":
        raw["precision"] = "fp16"
    path = tmp_path / "job.json"
    path.write_text(json.dumps(raw))
    result = CliRunner().invoke(app, ["export", target, str(path)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], result.output
