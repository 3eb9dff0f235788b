"""Launch recipes: each target's file parses back to the plan's degrees, batch sizes and precision,
and what a target cannot express is stated, never dropped."""

import argparse
import ast
import itertools
import json
import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from framework_parsers import bash_array, deepspeed_parse, parse_megatron, titan_parse
from paraplan.catalog import load_job, resolve_job
from paraplan.catalog.jobs import read_job_mapping
from paraplan.cli.export import export_command
from paraplan.export import (
    export_notes,
    render,
    render_deepspeed,
    render_megatron,
    render_slurm,
    render_torchtitan,
)
from paraplan.export.megatron import megatron_args
from paraplan.export.slurm import TIME_MARGIN
from paraplan.export.torchtitan import TORCHTITAN_DEFAULTS
from paraplan.prediction import predict
from paraplan.specs import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LLAMA = EXAMPLES / "llama-3-70b-dgx-h100-tp8-pp4.yaml"
NEOX = EXAMPLES / "gpt-neox-20b-perlmutter-pp4-tp4-dp8.yaml"
MISTRAL = EXAMPLES / "mistral-7b-one-node.yaml"


def job_from(path, **parallel):
    """An example job with some of its plan changed (``precision`` changes the precision)."""
    raw = read_job_mapping(path)
    precision = parallel.pop("precision", None)
    raw["parallel"] = {**raw["parallel"], **parallel}
    if precision:
        raw["precision"] = precision
    return resolve_job(raw, base_dir=path.parent)


def megatron_etp(args):
    """ModelParallelConfig.__post_init__: expert_tensor_parallel_size None means tp."""
    return args.expert_tensor_parallel_size or args.tensor_model_parallel_size


def megatron_moe_layers(args):
    """Which layers Megatron-LM makes MoE layers (an int N: every N-th from layer 0)."""
    freq = args.moe_layer_freq
    if isinstance(freq, int):
        return [int(i % freq == 0) for i in range(args.num_layers)]
    assert len(freq) == args.num_layers
    return freq


def megatron_vpp(args):
    """Megatron-LM's validate_args: vpp = (num_layers / pp) / num_layers_per_virtual_pipeline_stage."""
    if args.num_layers_per_virtual_pipeline_stage is None:
        return 1
    per_stage, rest = divmod(args.num_layers, args.pipeline_model_parallel_size)
    assert rest == 0 and per_stage % args.num_layers_per_virtual_pipeline_stage == 0
    return per_stage // args.num_layers_per_virtual_pipeline_stage


def megatron_layout(layout):
    """Layers per stage from a --pipeline-model-parallel-layout string, parsed as
    PipelineParallelLayerLayout.parse_str_to_list does."""
    layout = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        layout = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), layout)
    stages = layout.split("|")
    assert stages[0].startswith("E") and stages[-1].endswith("L")
    return [stage.count("t") for stage in stages]


# ---------------------------------------------------------------- Megatron-LM


def test_megatron_arguments_for_llama_3_70b_parse_back_to_its_degrees_batch_and_precision():
    job = load_job(LLAMA)
    args = parse_megatron(render_megatron(job, predict(job)))
    p = job.parallel
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size) == (8, 4, 1)
    world = job.cluster.num_gpus
    assert world // (args.tensor_model_parallel_size * args.pipeline_model_parallel_size
                     * args.context_parallel_size) == p.dp == 2
    assert (args.micro_batch_size, args.global_batch_size) == (1, 512)
    assert args.bf16 and not args.fp16
    assert args.sequence_parallel and args.use_distributed_optimizer and args.overlap_grad_reduce
    assert args.recompute_granularity == "selective" and args.recompute_method is None
    assert (args.num_layers, args.hidden_size, args.ffn_hidden_size, args.num_attention_heads) == (80, 8192, 28672, 64)
    assert args.group_query_attention and args.num_query_groups == 8
    assert (args.position_embedding_type, args.normalization, args.swiglu) == ("rope", "RMSNorm", True)
    assert args.untie_embeddings_and_output_weights and not args.add_bias_linear
    assert args.rotary_base == 500000  # Llama 3's RoPE base; Megatron-LM's default is 10000
    assert args.attention_dropout == 0.0 and args.hidden_dropout == 0.0  # Megatron-LM's default is 0.1
    assert args.train_samples * job.model.seq_length >= job.train_tokens


def test_vpp_becomes_layers_per_virtual_stage_and_megatron_recovers_vpp_from_it():
    job = load_job(LLAMA)  # 80 layers, pp=4, vpp=5
    args = parse_megatron(render_megatron(job))
    assert args.num_layers_per_virtual_pipeline_stage == 80 // (4 * 5) == 4
    assert megatron_vpp(args) == 5
    two = job_from(LLAMA, vpp=2)
    args = parse_megatron(render_megatron(two))
    assert args.num_layers_per_virtual_pipeline_stage == 10 and megatron_vpp(args) == 2
    plain = job_from(LLAMA, vpp=None, schedule="1f1b")
    assert parse_megatron(render_megatron(plain)).num_layers_per_virtual_pipeline_stage is None


def test_megatron_arguments_for_gpt_neox_keep_its_uneven_split_fp16_and_full_recompute():
    job = load_job(NEOX)
    args = parse_megatron(render_megatron(job))
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (4, 4)
    assert job.cluster.num_gpus // (4 * 4) == 8
    assert (args.micro_batch_size, args.global_batch_size) == (4, 512)
    assert args.fp16 and not args.bf16
    assert (args.recompute_granularity, args.recompute_method, args.recompute_num_layers) == ("full", "uniform", 1)
    # Megatron-LM: first and last stage given, the middle stages split the rest evenly
    first, last = args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers
    middle = (args.num_layers - first - last) // (args.pipeline_model_parallel_size - 2)
    assert [first, middle, middle, last] == [11, 12, 12, 9]
    assert args.rotary_percent == 0.25 and args.normalization == "LayerNorm" and args.add_bias_linear
    assert args.rotary_base == 10000  # the catalog's GPT-NeoX names no base: Megatron-LM's default
    assert not args.overlap_grad_reduce  # the prediction followed DeepSpeed, which does not overlap
    assert any(n.startswith("model.parallel_residual") for n in export_notes("megatron", job))


def test_a_split_that_first_and_last_cannot_express_becomes_a_pipeline_layout():
    job = job_from(NEOX, layers_per_stage=[10, 12, 11, 11])
    args = parse_megatron(render_megatron(job))
    assert args.decoder_first_pipeline_num_layers is None
    assert megatron_layout(args.pipeline_model_parallel_layout) == [10, 12, 11, 11]


def test_zero_3_becomes_megatron_fsdp_with_the_checkpoint_format_it_requires():
    args = parse_megatron(render_megatron(load_job(MISTRAL)))
    assert args.use_megatron_fsdp and args.data_parallel_sharding_strategy == "optim_grads_params"
    assert args.ckpt_format == "fsdp_dtensor" and not args.use_distributed_optimizer


def test_megatron_refuses_context_parallelism_that_does_not_go_twice_into_the_sequence():
    job = resolve_job({"model": {"name": "gpt3-125m", "seq_length": 2052}, "cluster": "dgx-a100",
                       "parallel": {"cp": 4}})
    with pytest.raises(ConfigError, match=r"^parallel\.cp: .*2\*cp = 8"):
        render_megatron(job)


# ---------------------------------------------------------------- DeepSpeed


@pytest.mark.parametrize("path", [LLAMA, NEOX, MISTRAL], ids=["llama-3-70b", "gpt-neox-20b", "mistral-7b"])
def test_deepspeed_config_round_trips_batch_sizes_zero_stage_and_precision(path):
    job = load_job(path)
    p = job.parallel
    config = json.loads(render_deepspeed(job, predict(job)))
    launcher = config["_paraplan"]["launcher"]
    # DeepSpeedConfig._batch_assertion, with the data-parallel world size from the framework's mpu
    assert config["train_batch_size"] == (config["train_micro_batch_size_per_gpu"]
                                          * config["gradient_accumulation_steps"] * launcher["data_parallel_size"])
    assert (config["train_batch_size"], config["train_micro_batch_size_per_gpu"]) == (p.global_batch_size, p.micro_batch_size)
    assert config["gradient_accumulation_steps"] == p.num_microbatches
    assert config["zero_optimization"]["stage"] == p.zero_stage
    # only the precision in use is switched on; DeepSpeed's default is off for both
    assert ("fp16" in config, "bf16" in config) == (job.precision.value == "fp16", job.precision.value == "bf16")
    assert (launcher["tensor_model_parallel_size"], launcher["pipeline_model_parallel_size"]) == (p.tp, p.pp)
    assert launcher["tensor_model_parallel_size"] * launcher["pipeline_model_parallel_size"] \
        * launcher["context_parallel_size"] * launcher["data_parallel_size"] == job.cluster.num_gpus
    assert ("activation_checkpointing" in config) == (p.recompute.value != "none" and p.sequence_parallel and p.tp > 1)


def test_deepspeed_states_the_degrees_and_schedule_it_takes_from_the_launching_framework():
    config = json.loads(render_deepspeed(load_job(LLAMA)))
    notes = config["_paraplan"]["notes"]
    assert any("tp=8 and pp=4" in n for n in notes)
    assert any(n.startswith("parallel.vpp:") for n in notes)
    assert config["_paraplan"]["launcher"]["virtual_pipeline_model_parallel_size"] == 5
    assert config["_paraplan"]["launcher"]["layers_per_stage"] == [20, 20, 20, 20]
    assert json.loads(render_deepspeed(load_job(NEOX)))["_paraplan"]["launcher"]["layers_per_stage"] == [11, 12, 12, 9]


def test_deepspeed_refuses_zero_3_with_pipeline_parallelism():
    job = job_from(LLAMA, zero_stage=3)
    with pytest.raises(ConfigError, match=r"^parallel\.zero_stage: DeepSpeed's pipeline engine"):
        render_deepspeed(job)


@pytest.mark.parametrize("path, changes", [
    (LLAMA, {}), (NEOX, {}), (MISTRAL, {}), (MISTRAL, {"zero_stage": 2}), (MISTRAL, {"zero_stage": 1}),
    (MISTRAL, {"framework": "megatron"}), (MISTRAL, {"overlap_grad_reduce": False}), (LLAMA, {"precision": "fp8"}),
    (MISTRAL, {"zero_stage": 2, "framework": "megatron"}),
], ids=["llama-3-70b", "gpt-neox-20b", "mistral-zero3", "mistral-zero2", "mistral-zero1",
        "mistral-zero3-megatron", "mistral-zero3-no-overlap", "llama-fp8", "mistral-zero2-megatron"])
def test_deepspeed_config_loads_in_deepspeeds_own_config_classes(path, changes):
    job = job_from(path, **changes)
    p = job.parallel
    config = json.loads(render_deepspeed(job, predict(job)))
    assert config["_paraplan"]["comment"][0].startswith("DeepSpeed config for DeepSpeed 0.19.8,")
    ds = deepspeed_parse(config, p.dp)
    assert (ds.train_batch_size, ds.train_micro_batch_size_per_gpu) == (p.global_batch_size, p.micro_batch_size)
    assert ds.gradient_accumulation_steps == p.num_microbatches
    assert ds.zero_optimization_stage == p.zero_stage
    assert (ds.bfloat16_config.enabled, ds.float16_config.enabled) == (
        job.precision.value in ("bf16", "fp8"), job.precision.value == "fp16")
    if p.zero_stage == 3:  # DeepSpeed's default, unless the plan turns the overlap off
        assert ds.zero_config.overlap_comm == (p.overlap_grad_reduce is not False)
    elif p.zero_stage:  # what the prediction assumed, written out: DeepSpeed's default is false
        assert ds.zero_config.overlap_comm == (p.overlaps_grad_reduce and p.pp == 1)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_deepspeed_turns_pipeline_partitioning_off_where_each_tensor_parallel_rank_sends_its_own_sequence_shard(
        sequence_parallel):
    job = job_from(NEOX, framework="deepspeed", zero_stage=1, sequence_parallel=sequence_parallel)
    assert job.parallel.pp > 1 and job.parallel.tp > 1
    config = json.loads(render_deepspeed(job))
    partitioned = not sequence_parallel  # DeepSpeed's default where the stage output is the same on every TP rank
    assert ("pipeline" in config) is sequence_parallel
    ds = deepspeed_parse(config, job.parallel.dp)
    assert (ds.pipeline["pipe_partitioned"], ds.pipeline["grad_partitioned"]) == (partitioned, partitioned)


def test_deepspeed_zero_3_overlaps_communication_as_deepspeed_does_and_says_where_the_prediction_did_not():
    job = load_job(MISTRAL)  # framework: deepspeed, ZeRO-3, no pipeline
    assert "overlap_comm" not in json.loads(render_deepspeed(job))["zero_optimization"]  # default: true
    assert not job.parallel.overlaps_grad_reduce  # paraplan's DeepSpeed model: no overlap
    assert any(n.startswith("parallel.overlap_grad_reduce: overlap_comm is true (DeepSpeed's default for ZeRO-3)")
               for n in export_notes("deepspeed", job))
    agreed = job_from(MISTRAL, overlap_grad_reduce=True)
    assert deepspeed_parse(json.loads(render_deepspeed(agreed)), agreed.parallel.dp).zero_config.overlap_comm
    assert not any(n.startswith("parallel.overlap_grad_reduce") for n in export_notes("deepspeed", agreed))
    # ZeRO-1/2 keep DeepSpeed's default (false), as predicted for framework: deepspeed
    zero_2 = job_from(MISTRAL, zero_stage=2)
    assert not deepspeed_parse(json.loads(render_deepspeed(zero_2)), zero_2.parallel.dp).zero_config.overlap_comm
    # a plan that turns the overlap off gets it off, with a note naming DeepSpeed's own default
    off = job_from(MISTRAL, overlap_grad_reduce=False)
    assert json.loads(render_deepspeed(off))["zero_optimization"]["overlap_comm"] is False
    assert any("DeepSpeed's own default for ZeRO-3 is true" in n for n in export_notes("deepspeed", off))


# ---------------------------------------------------------------- torchtitan

# torchtitan 0.3.0 (PyPI), torchtitan/config/configs.py: the fields of TrainingConfig and
# ParallelismConfig and the values their Literal types allow. Used when torchtitan is not
# installed; with it, the recipe is parsed by torchtitan's own ConfigManager below.
TITAN_TRAINING_FIELDS = {
    "local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps", "enable_cpu_offload",
    "disable_cuda_graphs", "dtype", "mixed_precision_param", "mixed_precision_reduce", "gc_freq", "gc_debug",
}
TITAN_PARALLELISM_FIELDS = {
    "data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
    "enable_fsdp_symm_mem", "tensor_parallel_degree", "enable_sequence_parallel", "spmd_backend",
    "pipeline_parallel_degree", "module_fqns_per_model_part", "pipeline_parallel_first_stage_less_layers",
    "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage",
    "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
    "context_parallel_degree", "context_parallel_load_balancer", "context_parallel_ptrr_mask_key",
    "expert_parallel_degree",
}
TITAN_LITERALS = {
    "mixed_precision_param": {"bfloat16", "float32"},
    "mixed_precision_reduce": {"float32"},
    "fsdp_reshard_after_forward": {"default", "always", "never"},
}


def titan_recipe(text):
    """The calls of a torchtitan recipe, read with ``ast`` (no torchtitan needed): the callee as
    written -> its literal keyword arguments (and positional ones under ``*args``)."""
    calls = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call):
            kwargs = {"*args": [ast.literal_eval(a) for a in node.args if isinstance(a, ast.Constant)]}
            for k in node.keywords:
                try:
                    kwargs[k.arg] = ast.literal_eval(k.value)
                except ValueError:
                    kwargs[k.arg] = ast.unparse(k.value)
            calls.setdefault(ast.unparse(node.func), kwargs)
    training, par = calls["TrainingConfig"], calls["ParallelismConfig"]
    assert set(training) - {"*args"} <= TITAN_TRAINING_FIELDS
    assert set(par) - {"*args"} <= TITAN_PARALLELISM_FIELDS
    for key, allowed in TITAN_LITERALS.items():
        assert {**training, **par}.get(key, next(iter(allowed))) in allowed, key
    return calls


def titan_values(calls, block):
    """What torchtitan runs for one block of a recipe: the keys written, torchtitan's defaults for
    the others (the recipe does not repeat them)."""
    call = {"parallelism": "ParallelismConfig", "training": "TrainingConfig"}[block]
    return {**TORCHTITAN_DEFAULTS[block], **calls[call]}


def test_torchtitan_recipe_for_llama_3_70b_round_trips_degrees_batches_and_stages():
    job = load_job(LLAMA)
    p = job.parallel
    text = render_torchtitan(job, predict(job))
    assert text.startswith('r"""torchtitan configuration for torchtitan 0.3.0, exported by paraplan')
    assert "-m torchtitan.train" in text and "--config paraplan_config" in text
    calls = titan_recipe(text)
    assert "context_parallel_degree" not in calls["ParallelismConfig"]  # torchtitan's default, 1, is not repeated
    par, training = titan_values(calls, "parallelism"), titan_values(calls, "training")
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert (par["tensor_parallel_degree"], par["enable_sequence_parallel"]) == (8, True)
    assert (par["pipeline_parallel_degree"], par["context_parallel_degree"], dp) == (4, 1, 2)
    assert 8 * 4 * 1 * dp == job.cluster.num_gpus
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    stages = par["module_fqns_per_model_part"]
    assert len(stages) == p.pp * p.vpp == 20
    layers = [name for stage in stages for name in stage if name.startswith("layers.")]
    assert layers == [f"layers.{i}" for i in range(80)]
    assert all(sum(n.startswith("layers.") for n in stage) == 4 for stage in stages)
    assert stages[0][0] == "tok_embeddings" and stages[-1][-2:] == ["norm", "lm_head"]
    # one step pushes all micro-batches of a DP rank through the pipeline, no extra accumulation
    assert training["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == p.num_microbatches
    assert training["global_batch_size"] == 512
    assert training["global_batch_size"] // (training["local_batch_size"] * dp) == 1
    assert training["seq_len"] == 8192 and training["mixed_precision_param"] == "bfloat16"
    assert training["disable_cuda_graphs"] is True  # torchtitan's CUDA graphs refuse pipelining
    assert calls["model_registry"]["*args"] == ["70B"]
    assert "SelectiveAC.Config" in calls
    assert calls["CheckpointManager.Config"]["enable"] is True


@pytest.mark.slow
def test_torchtitan_recipe_parses_with_torchtitans_own_config_manager(tmp_path, monkeypatch):
    job = load_job(LLAMA)
    config = titan_parse(render_torchtitan(job, predict(job)), tmp_path, monkeypatch)
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torchtitan.distributed.activation_checkpoint import SelectiveAC

    par, training = config.parallelism, config.training
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.data_parallel_shard_degree) == (8, 4, 2)
    assert get_schedule_class(par.pipeline_parallel_schedule).__name__ == "ScheduleInterleaved1F1B"
    assert (training.local_batch_size, training.global_batch_size, training.seq_len) == (256, 512, 8192)
    assert (config.model_spec.name, config.model_spec.flavor) == ("llama3", "70B")
    assert len(config.model_spec.model.layers) == 80
    assert isinstance(config.activation_checkpoint, SelectiveAC.Config)
    assert config.checkpoint.enable and config.checkpoint.interval >= 1


@pytest.mark.parametrize("path, changes", [
    (MISTRAL, {}), (LLAMA, {"zero_stage": 3, "recompute": "full"}), (LLAMA, {"recompute": "none", "zero_stage": 0}),
    (NEOX, {"precision": "bf16"}), (LLAMA, {"precision": "fp8", "recompute": "layer", "framework": "fsdp"}),
], ids=["mistral-zero3", "llama-zero3-full", "llama-ddp-no-recompute", "neox-bf16", "llama-fp8"])
def test_every_torchtitan_recipe_parses_with_torchtitan(path, changes, tmp_path, monkeypatch):
    job = job_from(path, **changes)
    text = render_torchtitan(job, predict(job))
    titan_recipe(text)
    from_registry = None
    if "model_registry" not in text or "Float8" in text:  # placeholder model; FP8 builds only on a GPU
        def from_registry():
            from torchtitan.models.llama3 import model_registry

            return model_registry("debugmodel")
    config = titan_parse(text, tmp_path, monkeypatch, name=f"recipe_{abs(hash(path.name + str(changes)))}",
                         model_spec=from_registry)
    p = job.parallel
    par = config.parallelism
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree) == (p.tp, p.pp, p.cp)
    assert par.data_parallel_replicate_degree * par.data_parallel_shard_degree == p.dp


def test_torchtitan_states_that_it_has_no_zero_1():
    text = render_torchtitan(load_job(LLAMA))
    assert "NOTE(paraplan): parallel.zero_stage: torchtitan has no ZeRO-1" in text
    assert titan_recipe(text)["ParallelismConfig"]["fsdp_reshard_after_forward"] == "never"


def test_torchtitan_refuses_fp16_naming_the_precision():
    with pytest.raises(ConfigError, match=r"^precision: torchtitan trains in bfloat16 or float32"):
        render_torchtitan(load_job(NEOX))


def test_torchtitan_renders_gpt_neox_in_bf16_with_a_model_spec_that_refuses_to_run_until_edited(tmp_path):
    job = job_from(NEOX, precision="bf16")
    text = render_torchtitan(job)
    calls = titan_recipe(text)
    assert "model_registry" not in calls and "NOTE(paraplan): model:" in text
    assert 'raise NotImplementedError("EDIT-ME' in text
    par, training = titan_values(calls, "parallelism"), titan_values(calls, "training")
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"]) == (4, 4)
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == 8
    assert [sum(n.startswith("layers.") for n in s) for s in par["module_fqns_per_model_part"]] == [11, 12, 12, 9]
    assert par["pipeline_parallel_schedule"] == "1F1B"
    assert training["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == 16
    assert (training["global_batch_size"], training["mixed_precision_param"]) == (512, "bfloat16")
    assert "FullAC.Config" in calls


def test_torchtitan_without_pipelining_accumulates_gradients_over_the_micro_batches():
    job = load_job(MISTRAL)  # dp=8, ZeRO-3, micro-batch 2, global 64 -> 4 micro-batches
    calls = titan_recipe(render_torchtitan(job))
    par, training = calls["ParallelismConfig"], calls["TrainingConfig"]
    # ZeRO-3 is torchtitan's own "default" (reshard after forward without pp): not written
    assert par["data_parallel_shard_degree"] == 8 and "fsdp_reshard_after_forward" not in par
    assert training["local_batch_size"] == 2 and "disable_cuda_graphs" not in training
    assert training["global_batch_size"] // (training["local_batch_size"] * 8) == job.parallel.num_microbatches == 4


# ---------------------------------------------------------------- SLURM


def sbatch(text):
    return dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)$", text, re.M))


def torchrun(text):
    line = next(line for line in text.replace("\\\n", " ").splitlines() if "torchrun" in line)
    return shlex.split(line, comments=True)


def slurm_seconds(value):
    days, clock = value.split("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return int(days) * 86400 + h * 3600 + m * 60 + s


def test_slurm_script_for_llama_3_70b_has_its_nodes_walltime_and_torchrun_line():
    job = load_job(LLAMA)
    pred = predict(job)
    text = render_slurm(job, pred)
    lines = sbatch(text)
    assert (lines["nodes"], lines["ntasks-per-node"], lines["gpus-per-node"]) == ("8", "1", "8")
    walltime = slurm_seconds(lines["time"])
    assert pred.time_to_train_s * TIME_MARGIN <= walltime < pred.time_to_train_s * TIME_MARGIN + 60
    argv = torchrun(text)
    flags = dict(itertools.pairwise(argv))
    assert flags["--nnodes"] == "$SLURM_NNODES" and flags["--nproc-per-node"] == "8"
    assert flags["--rdzv-backend"] == "c10d" and flags["--rdzv-endpoint"] == "$MASTER_ADDR:29500"
    assert any(a.endswith("/pretrain_gpt.py") for a in argv) and "${MEGATRON_ARGS[@]}" in argv
    args = parse_megatron(text, "DATA_ARGS", "TRAIN_ARGS")
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, megatron_vpp(args)) == (8, 4, 5)
    assert (args.micro_batch_size, args.global_batch_size, args.bf16) == (1, 512, True)
    assert args.mock_data and args.tokenizer_type == "NullTokenizer" and args.vocab_size == 128256
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text


def test_slurm_script_makes_its_own_prediction_when_none_is_given():
    job = load_job(LLAMA)
    assert sbatch(render_slurm(job))["time"] == sbatch(render_slurm(job, predict(job)))["time"]


def test_slurm_script_for_gpt_neox_without_train_tokens_has_a_marked_time_placeholder():
    job = load_job(NEOX)
    text = render_slurm(job, predict(job))
    lines = sbatch(text)
    assert (lines["nodes"], lines["gpus-per-node"], lines["time"]) == ("32", "4", "EDIT-ME")
    assert "# EDIT: --time: the job has no train_tokens" in text
    assert dict(itertools.pairwise(torchrun(text)))["--nproc-per-node"] == "4"
    args = parse_megatron(text, "DATA_ARGS", "TRAIN_ARGS")
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.fp16) == (4, 4, True)
    assert args.train_iters == 100 and args.train_samples is None
    assert "# NOTE(paraplan): model.parallel_residual" in text


def test_slurm_script_passes_exactly_the_megatron_recipe():
    for path in (LLAMA, NEOX):
        job = load_job(path)
        assert bash_array(render_slurm(job), "MEGATRON_ARGS") == megatron_args(job)
        assert bash_array(render_megatron(job), "MEGATRON_ARGS") == megatron_args(job)


def test_slurm_script_saves_checkpoints_and_resumes_from_them():
    job = load_job(LLAMA)
    pred = predict(job)
    text = render_slurm(job, pred)
    tokens = bash_array(text, "CKPT_ARGS")
    flags = dict(itertools.pairwise(tokens))
    assert flags["--save"] == flags["--load"] == "$CKPT_DIR"  # a rerun loads what the last run saved
    assert "CKPT_DIR=${CKPT_DIR:-$PWD/checkpoints/llama-3-70b-64xH100}" in text
    interval = int(flags["--save-interval"])
    assert interval * pred.iteration_s <= 3600 < (interval + 1) * pred.iteration_s  # about hourly
    minutes = int(flags["--exit-duration-in-mins"])
    assert minutes == slurm_seconds(sbatch(text)["time"]) // 60 - 15  # save and exit before --time
    assert "${CKPT_ARGS[@]}" in torchrun(text)
    assert "# Resume: --save and --load (CKPT_ARGS) name one folder" in text
    # the whole command line through Megatron-LM's parser (CheckpointConfig, TrainingConfig,
    # SchedulerConfig flags included: they are generated from those dataclasses)
    args = parse_megatron(text, "DATA_ARGS", "TRAIN_ARGS", "CKPT_ARGS")
    assert args.exit_duration_in_mins == minutes and args.tokenizer_type and args.lr_decay_style
    assert args.save == args.load == "$CKPT_DIR" and args.save_interval == interval


def test_slurm_script_without_walltime_saves_but_leaves_the_exit_to_the_user():
    job = job_from(MISTRAL, recompute="full")  # no train_tokens: --time=EDIT-ME
    text = render_slurm(job, predict(job))
    flags = dict(itertools.pairwise(bash_array(text, "CKPT_ARGS")))
    assert flags["--save"] == flags["--load"] and int(flags["--save-interval"]) >= 1
    assert "--exit-duration-in-mins" not in flags


def test_every_export_header_names_the_framework_version_it_targets():
    job = load_job(LLAMA)
    assert "Megatron-LM arguments for pretrain_gpt.py (Megatron Core >= 0.16)" in render_megatron(job)
    assert "SLURM batch script for Megatron-LM (Megatron Core >= 0.16)" in render_slurm(job)
    assert "DeepSpeed 0.19.8" in render_deepspeed(job_from(LLAMA, zero_stage=1))
    assert "for torchtitan 0.3.0" in render_torchtitan(job)


# ---------------------------------------------------------------- API and CLI


def test_a_prediction_for_another_job_is_refused():
    with pytest.raises(ValueError, match="different job"):
        render("megatron", load_job(LLAMA), predict(load_job(NEOX)))


def test_an_unknown_target_is_a_config_error_naming_the_target():
    with pytest.raises(ConfigError, match=r"^target: unknown export target 'nemo'"):
        render("nemo", load_job(LLAMA))


def cli():
    app = typer.Typer()
    app.command()(export_command)
    return app


def invoke(*args):
    return CliRunner().invoke(cli(), [str(a) for a in args], env={"COLUMNS": "200"})


def test_export_writes_the_recipe_to_stdout_and_the_notes_to_stderr():
    result = invoke("torchtitan", LLAMA)
    assert result.exit_code == 0, result.output
    assert titan_recipe(result.stdout)["ParallelismConfig"]["pipeline_parallel_degree"] == 4
    assert "note: parallel.zero_stage: torchtitan has no ZeRO-1" in result.stderr


def test_export_refuses_to_overwrite_an_existing_file_without_force(tmp_path):
    target = tmp_path / "ds_config.json"
    target.write_text("precious\n")
    result = invoke("deepspeed", NEOX, "--out", target)
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [f"error: out: {target} already exists; pass --force to overwrite it"]
    assert target.read_text() == "precious\n"
    result = invoke("deepspeed", NEOX, "--out", target, "--force")
    assert result.exit_code == 0, result.output
    assert json.loads(target.read_text())["train_batch_size"] == 512


def test_export_writes_a_new_file_and_bad_input_is_one_line_with_exit_2(tmp_path):
    target = tmp_path / "run.sbatch"
    assert invoke("slurm", LLAMA, "-o", target).exit_code == 0
    assert sbatch(target.read_text())["nodes"] == "8"
    for args, message in [(("nemo", LLAMA), "error: target: unknown export target 'nemo'"),
                          (("torchtitan", NEOX), "error: precision: torchtitan trains in bfloat16"),
                          (("megatron", EXAMPLES / "missing.yaml"), "cannot read the job file")]:
        result = invoke(*args)
        assert result.exit_code == 2
        assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr


# ---------------------------------------------------------------- mixtures of experts


def moe_job(model="mixtral-8x7b", nodes=4, **parallel):
    """A catalog MoE model (a name, or a mapping of a name and overrides) on DGX H100 nodes."""
    parallel = {"tp": 1, "pp": 1, "micro_batch_size": 1, "global_batch_size": 64, "zero_stage": 1, **parallel}
    if model == "deepseek-v3" and parallel["pp"] == 16:  # 61 layers: Megatron-LM runs the split it is given
        parallel.setdefault("layers_per_stage", [4] * 13 + [3] * 3)
    return resolve_job({"model": model, "cluster": {"name": "dgx-h100", "num_nodes": nodes}, "parallel": parallel})


MOE_FLAGS = ("--num-experts", "--moe-", "--expert-", "--overlap-moe", "--delay-wgrad", "--multi-latent",
             "--q-lora", "--kv-lora", "--qk-", "--v-head")


def test_megatron_arguments_for_deepseek_v3_carry_its_layer_pattern_and_latent_attention():
    job = moe_job("deepseek-v3", nodes=128, pp=16, ep=64, etp=1, global_batch_size=1024, recompute="full")
    args = parse_megatron(render_megatron(job))
    assert "--moe-layer-freq '([0]*3+[1]*58)'" in render_megatron(job)  # NVIDIA's own DeepSeek-V3 spelling
    assert megatron_moe_layers(args) == [0] * 3 + [1] * 58 == [int(v) for v in job.model.moe_layers]
    assert args.multi_latent_attention
    assert (args.q_lora_rank, args.kv_lora_rank, args.qk_head_dim, args.qk_pos_emb_head_dim, args.v_head_dim) == (
        1536, 512, 128, 64, 128)
    assert (args.num_experts, args.moe_router_topk, args.moe_ffn_hidden_size) == (256, 8, 2048)
    assert args.moe_shared_expert_intermediate_size == 2048 and args.moe_router_score_function == "sigmoid"
    # aux_loss is Megatron-LM's default; the coefficient is nargs="+" (one per load-balancing type)
    assert (args.moe_router_load_balancing_type, args.moe_aux_loss_coeff) == ("aux_loss", [1e-4])
    assert (args.expert_model_parallel_size, megatron_etp(args)) == (64, 1)
    assert args.moe_token_dispatcher_type == "alltoall" and args.moe_grouped_gemm
    # Megatron-LM's expert grid: world % (etp * ep * pp) == 0
    assert job.cluster.num_gpus % (megatron_etp(args) * 64 * args.pipeline_model_parallel_size) == 0


def test_megatron_arguments_for_mixtral_carry_its_experts_top_2_and_expert_parallelism():
    job = moe_job(tp=2, sequence_parallel=True, ep=4, etp=1, moe_shared_expert_overlap=False,
                  overlap_moe_expert_parallel_comm=True)
    tokens = megatron_args(job)
    assert " ".join(tokens).count("--num-experts 8 ") == 1
    assert "--moe-router-topk" not in tokens  # Megatron-LM's default is top-2
    args = parse_megatron(render_megatron(job))
    assert (args.num_experts, args.moe_router_topk, args.expert_model_parallel_size) == (8, 2, 4)
    assert args.moe_layer_freq == 1 and megatron_moe_layers(args) == [1] * 32
    assert args.overlap_moe_expert_parallel_comm and args.delay_wgrad_compute  # NVIDIA's scripts pair them
    assert args.moe_expert_capacity_factor is None and not args.multi_latent_attention
    assert any(n.startswith("parallel.expert_load_imbalance: not a launch setting")
               for n in export_notes("megatron", job))


@pytest.mark.parametrize("model, pattern", [
    ({"name": "mixtral-8x7b", "moe_layer_freq": 2, "moe_first_k_dense": 1}, "([0]*2+([1]+[0])*15)"),
    ({"name": "mixtral-8x7b", "moe_layer_freq": 4}, "4"),
    ({"name": "mixtral-8x7b", "moe_layer_freq": [0, 1] * 16}, "(([0]+[1])*16)"),
    ({"name": "mixtral-8x7b", "moe_first_k_dense": 31}, "([0]*31+[1])"),
], ids=["every-2nd-after-1-dense", "every-4th", "odd-layers", "last-layer-only"])
def test_megatron_layer_pattern_is_compact_and_evaluates_to_the_models_moe_layers(model, pattern):
    job = moe_job(model)
    args = parse_megatron(render_megatron(job))
    assert megatron_moe_layers(args) == [int(v) for v in job.model.moe_layers]
    assert dict(itertools.pairwise(megatron_args(job)))["--moe-layer-freq"] == pattern


def test_capacity_factor_and_shared_expert_overlap_get_the_alltoall_dispatcher_they_need():
    job = moe_job({"name": "mixtral-8x7b", "moe_expert_capacity_factor": 1.25, "moe_aux_loss_coeff": 0})
    args = parse_megatron(render_megatron(job))
    assert (args.moe_expert_capacity_factor, args.moe_token_dispatcher_type) == (1.25, "alltoall")
    assert args.moe_router_load_balancing_type == ["none"]  # no auxiliary loss


def test_a_dense_models_exports_carry_no_mixture_of_experts_setting():
    job = load_job(LLAMA)
    assert not [t for t in megatron_args(job) if t.startswith(MOE_FLAGS)]
    assert "expert_parallel_degree" not in titan_recipe(render_torchtitan(job))["ParallelismConfig"]
    launcher = json.loads(render_deepspeed(job))["_paraplan"]["launcher"]
    assert "megatron_deepspeed_moe_args" not in launcher and "expert_model_parallel_size" not in launcher
    assert not any("expert" in n for n in export_notes("megatron", job))


def test_slurm_script_launches_megatron_with_the_mixture_of_experts_flags():
    job = moe_job("deepseek-v3", nodes=128, pp=16, ep=64, etp=1, global_batch_size=1024, recompute="full")
    text = render_slurm(job)
    assert bash_array(text, "MEGATRON_ARGS") == megatron_args(job)
    args = parse_megatron(text, "DATA_ARGS", "TRAIN_ARGS")
    assert args.num_experts == 256 and args.multi_latent_attention and args.expert_model_parallel_size == 64


def test_torchtitan_recipe_for_qwen3_30b_a3b_uses_torchtitans_flavor_and_expert_parallel_degree(
        tmp_path, monkeypatch):
    job = moe_job("qwen3-30b-a3b", nodes=2, ep=8, zero_stage=3)
    text = render_torchtitan(job)
    calls = titan_recipe(text)
    assert calls["model_registry"]["*args"] == ["30B-A3B"] and "from torchtitan.models.qwen3 import" in text
    assert calls["ParallelismConfig"]["expert_parallel_degree"] == 8
    config = titan_parse(text, tmp_path, monkeypatch, name="recipe_qwen3_moe")
    assert (config.model_spec.name, config.model_spec.flavor) == ("qwen3", "30B-A3B")
    assert config.parallelism.expert_parallel_degree == 8
    # torchtitan's mesh: ep divides dp_shard * cp * tp (ParallelDims: efsdp = dp_shard * cp * tp / ep)
    par = config.parallelism
    assert par.data_parallel_shard_degree * par.context_parallel_degree * par.tensor_parallel_degree % 8 == 0


def test_every_torchtitan_key_of_a_moe_recipe_is_a_field_of_the_installed_torchtitan():
    pytest.importorskip("torchtitan", reason="torchtitan is installed with paraplan[frameworks]")
    import dataclasses

    from torchtitan.config import ParallelismConfig, TrainingConfig

    for job in (moe_job("qwen3-30b-a3b", nodes=2, ep=8, zero_stage=3),
                moe_job(tp=2, pp=2, sequence_parallel=True, ep=8, etp=1, zero_stage=1)):
        calls = titan_recipe(render_torchtitan(job))
        for cls in (ParallelismConfig, TrainingConfig):
            fields = {f.name for f in dataclasses.fields(cls)}
            assert set(calls[cls.__name__]) - {"*args"} <= fields


def test_torchtitan_leaves_mixtral_to_the_user_with_its_experts_in_the_model_note():
    job = moe_job(tp=2, pp=2, sequence_parallel=True, ep=8, etp=1)
    text = render_torchtitan(job)
    assert "model_registry" not in titan_recipe(text) and 'raise NotImplementedError("EDIT-ME' in text
    assert "NOTE(paraplan): model: mixtral-8x7b is not one of torchtitan's mixture-of-experts flavors" in text
    assert "num_experts=8, top_k=2" in text


@pytest.mark.parametrize("target, model, parallel, field", [
    ("torchtitan", "mixtral-8x7b", {"tp": 2, "sequence_parallel": True, "ep": 2, "zero_stage": 3}, "parallel.etp"),
    ("torchtitan", "mixtral-8x7b", {"ep": 8, "zero_stage": 0}, "parallel.ep"),
    ("deepspeed", "deepseek-v3", {"ep": 8}, "model.moe_shared_expert_intermediate_size"),
    ("deepspeed", {"name": "deepseek-v3", "moe_shared_expert_intermediate_size": None}, {"ep": 8},
     "model.multi_latent_attention"),
    ("deepspeed", {"name": "mixtral-8x7b", "moe_router_score_function": "sigmoid"}, {"ep": 8},
     "model.moe_router_score_function"),
    ("deepspeed", "mixtral-8x7b", {"tp": 2, "sequence_parallel": True, "ep": 2, "etp": 2}, "parallel.etp"),
    ("deepspeed", "mixtral-8x7b", {"tp": 8, "sequence_parallel": True, "ep": 8, "etp": 1}, "parallel.ep"),
    ("deepspeed", {"name": "mixtral-8x7b", "moe_first_k_dense": 3}, {"ep": 8}, "model.moe_first_k_dense"),
    ("deepspeed", {"name": "mixtral-8x7b", "moe_layer_freq": 3}, {"ep": 8}, "model.moe_layer_freq"),
], ids=["titan-etp", "titan-ep-ddp", "ds-shared", "ds-mla", "ds-sigmoid", "ds-etp", "ds-ep-dp", "ds-first-k",
        "ds-freq-3-of-32"])
def test_each_moe_refusal_is_one_line_naming_its_field(target, model, parallel, field):
    job = moe_job(model, **parallel)
    with pytest.raises(ConfigError) as err:
        render(target, job)
    message = str(err.value)
    assert message.startswith(f"{field}: ") and "\n" not in message


def test_deepspeed_carries_megatron_deepspeeds_moe_arguments_for_mixtral():
    job = moe_job(tp=2, pp=2, sequence_parallel=True, ep=8, etp=1)
    launcher = json.loads(render_deepspeed(job))["_paraplan"]["launcher"]
    tokens = launcher["megatron_deepspeed_moe_args"]
    # Megatron-DeepSpeed megatron/arguments.py: --num-experts nargs='+', --topk, --expert-interval,
    # --moe-expert-parallel-size, --mlp-type standard|residual, --disable-moe-token-dropping, --moe-loss-coeff
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    p.add_argument("--num-experts", type=int, nargs="+", default=[1])
    p.add_argument("--mlp-type", choices=["standard", "residual"], default="standard")
    for flag, default in (("--topk", 1), ("--expert-interval", 2), ("--moe-expert-parallel-size", 1)):
        p.add_argument(flag, type=int, default=default)
    p.add_argument("--disable-moe-token-dropping", action="store_false", dest="moe_token_dropping")
    p.add_argument("--moe-train-capacity-factor", type=float, default=1.0)
    p.add_argument("--moe-loss-coeff", type=float, default=0.1)
    args = p.parse_args(tokens)
    assert (args.num_experts, args.topk, args.moe_expert_parallel_size, args.expert_interval) == ([8], 2, 8, 1)
    assert args.mlp_type == "standard" and not args.moe_token_dropping and args.moe_loss_coeff == 0.02
    assert launcher["data_parallel_size"] % args.moe_expert_parallel_size == 0  # DeepSpeed's groups.py
    assert launcher["expert_model_parallel_size"] == 8


def test_deepspeed_shifts_megatron_lms_every_n_th_moe_layer_and_says_so():
    job = moe_job({"name": "mixtral-8x7b", "moe_layer_freq": 2}, ep=8)
    tokens = json.loads(render_deepspeed(job))["_paraplan"]["launcher"]["megatron_deepspeed_moe_args"]
    assert dict(itertools.pairwise(tokens))["--expert-interval"] == "2"
    assert any(n.startswith("model.moe_layer_freq: Megatron-DeepSpeed puts the experts in layers 2, 4")
               for n in export_notes("deepspeed", job))


def hsdp_cp_job(shard, cp):
    """llama-3.1-8b on two DGX H100 nodes with FSDP over dp x cp = 16 ranks, sharded within
    groups of ``shard`` of them (paraplan's data_parallel_shard_degree) and replicated across."""
    return resolve_job({"model": "llama-3.1-8b", "cluster": {"name": "dgx-h100", "num_nodes": 2},
                        "parallel": {"framework": "fsdp", "zero_stage": 3, "tp": 1, "pp": 1, "cp": cp,
                                     "micro_batch_size": 1, "global_batch_size": 64,
                                     "data_parallel_shard_degree": shard}})


def test_torchtitan_counts_hybrid_shard_groups_over_data_parallel_ranks_with_context_parallelism_inside():
    """torchtitan's ParallelDims: world = dp_replicate x dp_shard x cp x tp x pp and FSDP shards
    over the dp_shard x cp ranks, so paraplan's shard group of 8 of the dp x cp = 16 ranks with
    cp=2 is dp_shard 4 (x cp 2) replicated twice, not dp_shard 8."""
    job = hsdp_cp_job(shard=8, cp=2)
    p = job.parallel
    assert (p.dp, p.zero_shards, p.grad_group) == (8, 8, 16)
    par = titan_recipe(render_torchtitan(job))["ParallelismConfig"]
    assert (par["data_parallel_shard_degree"], par["context_parallel_degree"]) == (4, 2)
    assert par["data_parallel_shard_degree"] * par["context_parallel_degree"] == p.zero_shards
    assert par["data_parallel_replicate_degree"] == 2
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] * 2 == job.cluster.num_gpus


def test_torchtitan_refuses_a_shard_group_that_splits_a_context_parallel_group():
    job = hsdp_cp_job(shard=2, cp=4)  # torchtitan shards over all 4 cp ranks at least
    with pytest.raises(ConfigError, match=r"^parallel\.data_parallel_shard_degree: .*cp=4"):
        render_torchtitan(job)


@pytest.mark.parametrize("target", ["megatron", "deepspeed", "torchtitan"])
def test_a_tf32_job_exports_as_fp32_training_and_says_tf32_needs_allow_tf32(target):
    from paraplan.export.deepspeed import deepspeed_config
    from paraplan.export.torchtitan import torchtitan_config

    job = job_from(LLAMA if target == "megatron" else MISTRAL, precision="tf32")
    notes = [n for n in export_notes(target, job) if n.startswith("precision: tf32")]
    assert len(notes) == 1 and "torch.backends.cuda.matmul.allow_tf32 = True" in notes[0]
    assert "precision: tf32 is no launch setting" in render(target, job)  # the recipe carries it
    if target == "megatron":
        assert not {"--bf16", "--fp16", "--fp8-format"} & set(megatron_args(job))
    elif target == "deepspeed":
        config = deepspeed_config(job)
        assert "bf16" not in config and "fp16" not in config
    else:
        assert torchtitan_config(job)["training"]["mixed_precision_param"] == "float32"


def test_the_torchtitan_recipe_chunks_the_loss_as_the_prediction_did_or_says_it_held_the_whole_logits():
    def titan(**plan):
        return resolve_job({"model": {"name": "llama-3-8b", "seq_length": 8192}, "precision": "bf16",
                            "cluster": {"name": "dgx-h100", "num_nodes": 1},
                            "parallel": {"framework": "fsdp", "micro_batch_size": 1, "global_batch_size": 8, **plan}})

    whole = render_torchtitan(titan(), None)
    assert "re-predict with loss_chunks: 8" in whole and "num_chunks=" not in whole
    eight = render_torchtitan(titan(loss_chunks=8), None)
    assert "loss_chunks" not in eight and "num_chunks=" not in eight  # ChunkedLossWrapper's default
    four = render_torchtitan(titan(loss_chunks=4), None)
    assert "num_chunks=4," in four and "loss_chunks" not in four


def test_torchtitan_recipe_turns_on_async_tp_in_the_compile_config_where_the_plan_runs_it():
    job = job_from(LLAMA, framework="fsdp", recompute="op", async_tp=True)
    calls = titan_recipe(render_torchtitan(job, predict(job)))
    assert calls["CompileConfig"]["enable_async_tensor_parallel"] is True
    assert "model" in calls["CompileConfig"]["components"]  # the micro-pipeline pass needs the model compiled
    plain = titan_recipe(render_torchtitan(job_from(LLAMA, framework="fsdp", recompute="op")))
    assert "enable_async_tensor_parallel" not in plain.get("CompileConfig", {})


def test_megatron_arguments_graph_the_attention_and_say_the_moe_graph_scopes_the_parser_lacks():
    attn = parse_megatron(render_megatron(moe_job(ep=8, cuda_graph_scope=["attn"])))
    assert (attn.cuda_graph_impl, attn.cuda_graph_scope) == ("transformer_engine", "attn")
    job = moe_job(ep=8, cuda_graph_scope=["attn", "moe_router", "moe_preprocess"])
    args = parse_megatron(render_megatron(job))
    assert (args.cuda_graph_impl, args.cuda_graph_scope) == ("transformer_engine", "attn")
    assert any(n.startswith("parallel.cuda_graph_scope: moe_router moe_preprocess is not")
               for n in export_notes("megatron", job))
    assert parse_megatron(render_megatron(moe_job(ep=8))).cuda_graph_impl == "none"


def test_megatron_arguments_turn_rope_fusion_off_only_when_the_model_does():
    off = parse_megatron(render_megatron(moe_job({"name": "mixtral-8x7b", "rope_fusion": False})))
    assert not off.apply_rope_fusion and parse_megatron(render_megatron(moe_job())).apply_rope_fusion


def test_a_dense_model_graphs_its_attention_in_megatron_too():
    job = resolve_job({"model": "llama-2-7b", "cluster": {"name": "dgx-h100", "num_nodes": 1},
                       "parallel": {"tp": 2, "micro_batch_size": 1, "global_batch_size": 8, "cuda_graph_scope": ["attn"]}})
    args = parse_megatron(render_megatron(job))
    assert (args.cuda_graph_impl, args.cuda_graph_scope) == ("transformer_engine", "attn")
