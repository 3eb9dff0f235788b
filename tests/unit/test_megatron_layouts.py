"""Megatron-LM's pipeline layouts (--pipeline-model-parallel-layout, --decoder-first/last-
pipeline-num-layers, --account-for-embedding/loss-in-pipeline-split) and Megatron-Core's
--recompute-modules: stated in the plan, predicted, exported, refused in one line when wrong."""

from __future__ import annotations

import pytest

from paraplan.catalog import load_cluster, load_model, resolve_job
from paraplan.export.megatron import megatron_args
from paraplan.inventory.partition import count_layers_per_stage, count_moe_layers_per_stage
from paraplan.prediction.entry import predict_any
from paraplan.specs import Job, ParallelPlan
from paraplan.specs.pipeline_layout import parse_layout, stage_grid
from paraplan.validate.records import job_from_record

# Qwen3-235B-A22B (Qwen3 technical report: 94 layers, hidden 4096, 64 Q / 4 KV heads, 128
# experts of 1536, top-8), built from the catalog's Qwen3-30B-A3B
QWEN3_235B = load_model("qwen3-30b-a3b").model_copy(update={
    "name": "qwen3-235b-like", "num_layers": 94, "hidden_size": 4096, "num_attention_heads": 64,
    "moe_ffn_hidden_size": 1536})
DSV3 = load_model("deepseek-v3")
CLUSTER = load_cluster("dgx-h100", num_nodes=32)


def _job(model=QWEN3_235B, cluster=CLUSTER, **parallel) -> Job:
    return Job(name="t", model=model, cluster=cluster, precision="bf16",
               parallel={"tp": 1, "ep": 8, "global_batch_size": 512, **parallel})


def _one_line_error(**parallel) -> str:
    with pytest.raises(ValueError) as err:
        _job(**parallel)
    message = [line.strip() for line in str(err.value).splitlines() if "parallel." in line]
    assert len(message) == 1
    return message[0]


def test_the_docs_deepseek_layout_parses_as_megatrons_parse_str_to_list():
    # Megatron-LM's docstring: "Ettt|(tt|)*29,m|L" -> [["E","t","t","t"]] + [["t","t"]]*29 + [["m"],["L"]]
    assert parse_layout("Et*3|(tt|)*29,m|L") == ("Ettt",) + ("tt",) * 29 + ("m", "L")
    assert parse_layout("Ettt|(tt|)*29,m|L") == parse_layout("Et*3|(tt|)*29,m|L")


@pytest.mark.parametrize(("layout", "stages"), [
    ("Et,(tt|)*2,L", ("Ettt", "tt", "L")),       # Megatron's "ab,(cd|)*2 -> abcd|cd|": the trailing bar
    ("(|tt)*2,tL", ("", "tt", "tttL")),          # "(|ab)*2,cd -> |ab|abcd": an empty first stage
    ("E(t|t)*2,L", ("Et", "tt", "tL")),          # "xy(ab|cd)*2,pq -> xyab|cdab|cdpq"
])
def test_a_layouts_groups_unroll_as_megatrons_comments_say(layout, stages):
    assert parse_layout(layout) == stages


def test_a_layouts_virtual_stage_c_times_pp_plus_i_is_chunk_c_of_rank_i():
    # the docs' table for PP16 VPP2: rank 0 holds embedding + 3 decoders, then 2 decoders; the MTP
    # stage left empty here (paraplan models no MTP layer)
    plan = ParallelPlan(pp=16, pipeline_model_parallel_layout="Et*3|(tt|)*29,|L")
    grid = stage_grid(61, plan)
    assert plan.vpp == 2
    assert grid[0] == (3, 2) and grid[1] == (2, 2) and grid[14] == (2, 0) and grid[15] == (2, 0)


def test_qwen3_235b_94_layers_over_pp_16_with_first_and_last_stage_counts_predicts():
    job = _job(pp=16, decoder_first_pipeline_num_layers=4, decoder_last_pipeline_num_layers=6)
    pred = predict_any(job)
    assert [s.num_layers for s in pred.stages] == [4] + [6] * 15
    assert pred.iteration_s > 0


def test_qwen3_235b_94_layers_over_pp_16_vpp_2_predicts_with_a_layout_string():
    job = _job(pp=16, pipeline_model_parallel_layout="Et*2|(ttt|)*30,ttL")
    pred = predict_any(job)
    assert job.parallel.vpp == 2 and job.parallel.schedule.value == "interleaved"
    assert [s.num_layers for s in pred.stages] == [5] + [6] * 14 + [5]


def test_94_layers_over_pp_x_vpp_32_are_refused_without_a_split_and_predicted_with_a_layout():
    # 94 layers over pp x vpp = 32 are refused without a layout; with one the iteration is predicted
    with pytest.raises(ValueError, match=r"parallel\.vpp: num_layers=94 is not divisible by pp\*vpp = 32"):
        _job(pp=16, vpp=2)
    assert predict_any(_job(pp=16, pipeline_model_parallel_layout="Et*2|(ttt|)*30,ttL")).iteration_s > 0


def test_layers_per_stage_with_vpp_splits_each_stage_into_its_chunks_instead_of_a_wrong_divisibility_message():
    # issue 28: 32 layers, pp x vpp = 8 and layers_per_stage gave "32 is not divisible by 8"
    model = load_model("llama-3-8b")
    cluster = load_cluster("dgx-h100", num_nodes=1)
    job = Job(name="t", model=model, cluster=cluster,
              parallel={"tp": 2, "pp": 4, "vpp": 2, "layers_per_stage": [6, 10, 10, 6], "global_batch_size": 8})
    assert stage_grid(32, job.parallel) == ((3, 3), (5, 5), (5, 5), (3, 3))
    assert [s.num_layers for s in predict_any(job).stages] == [6, 10, 10, 6]
    with pytest.raises(ValueError, match=r"parallel\.layers_per_stage: stage 0's 7 layers do not split into its 2 "
                                         r"model chunks; give each virtual stage's layers with pipeline_model_par"):
        Job(name="t", model=model, cluster=cluster,
            parallel={"tp": 2, "pp": 4, "vpp": 2, "layers_per_stage": [7, 9, 10, 6], "global_batch_size": 8})


def test_uneven_chunks_place_deepseeks_dense_layers_in_the_first_chunk_only():
    # DeepSeek-V3's 3 dense layers sit in chunk 0 of rank 0; its chunk 1 (virtual stage 16) is MoE
    job = _job(model=DSV3, pp=16, pipeline_model_parallel_layout="Et*3|(tt|)*29,|L")
    assert count_layers_per_stage(DSV3, job.parallel) == (5,) + (4,) * 13 + (2, 2)
    assert count_moe_layers_per_stage(DSV3, job.parallel) == (2,) + (4,) * 13 + (2, 2)


def test_the_embedding_and_loss_counted_as_layers_take_one_layer_off_the_first_and_last_virtual_stage():
    job = _job(pp=8, vpp=2, account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    grid = stage_grid(94, job.parallel)  # (94 + 2) / 16 = 6 per virtual stage
    assert grid[0] == (5, 6) and grid[-1] == (6, 5) and grid[3] == (6, 6)


@pytest.mark.parametrize(("parallel", "field"), [
    ({"pp": 16, "pipeline_model_parallel_layout": "Et*2|(ttt|)*30,ttx"}, "pipeline_model_parallel_layout: "),
    ({"pp": 16, "pipeline_model_parallel_layout": "Et*2|(ttt|)*30,tt|L"}, "pipeline_model_parallel_layout: 33 virtual"),
    ({"pp": 16, "pipeline_model_parallel_layout": "Et*2|(ttt|)*30,tL"}, "pipeline_model_parallel_layout: places 93"),
    ({"pp": 16, "pipeline_model_parallel_layout": "tE*2|(ttt|)*30,ttL"}, "pipeline_model_parallel_layout: the embedding"),
    ({"pp": 16, "vpp": 4, "pipeline_model_parallel_layout": "Et*2|(ttt|)*30,ttL"}, "pipeline_model_parallel_layout: has 32"),
    ({"pp": 16, "decoder_first_pipeline_num_layers": 5, "decoder_last_pipeline_num_layers": 6},
     "decoder_first_pipeline_num_layers: the other"),
    ({"pp": 16, "vpp": 2, "decoder_first_pipeline_num_layers": 4, "decoder_last_pipeline_num_layers": 5,
      "layers_per_stage": None}, "decoder_first_pipeline_num_layers: the other"),
    ({"pp": 8, "account_for_embedding_in_pipeline_split": True}, "account_for_embedding_in_pipeline_split: num_layers=94"),
    ({"pp": 16, "decoder_first_pipeline_num_layers": 4, "account_for_loss_in_pipeline_split": True},
     "account_for_loss_in_pipeline_split: Megatron-LM does not combine"),
    ({"pp": 16, "framework": "deepspeed", "decoder_first_pipeline_num_layers": 4}, "decoder_first_pipeline_num_layers: a Megatron-LM"),
    ({"pp": 16, "recompute_modules": ["moe_act"]}, "recompute_modules: Megatron-Core's --recompute-modules go with"),
    ({"pp": 2, "layers_per_stage": [47, 47], "recompute": "selective", "recompute_modules": ["mla_up_proj"]},
     "recompute_modules: 'mla_up_proj' recomputes nothing in qwen3-235b-like"),
])
def test_a_bad_split_or_recompute_module_is_one_line_naming_the_field(parallel, field):
    assert "parallel." + field in _one_line_error(**{k: v for k, v in parallel.items() if v is not None})


def _stage0(job: Job) -> tuple[float, float]:
    pred = predict_any(job)
    return pred.iteration_s, pred.memory[0].total


@pytest.mark.parametrize(("model", "module"), [
    (DSV3, "core_attn"), (DSV3, "layernorm"), (DSV3, "moe_act"), (DSV3, "mla_up_proj"), (DSV3, "mlp"),
    (DSV3, "moe"), (DSV3, "shared_experts"), (QWEN3_235B, "layernorm"), (QWEN3_235B, "moe_act"),
])
def test_each_recompute_module_costs_time_and_saves_memory(model, module):
    # one rank holding DeepSeek-V3's 3 dense layers and 2 MoE layers: every module has something to do
    small = model.model_copy(update={"num_layers": 5})
    cluster = load_cluster("dgx-h100", num_nodes=1)
    base = {"pp": 1, "global_batch_size": 8}
    none_s, none_b = _stage0(_job(small, cluster, **base))
    s, b = _stage0(_job(small, cluster, **base, recompute="selective", recompute_modules=[module]))
    assert s > none_s
    assert b < none_b


def test_selective_recompute_without_modules_is_megatrons_default_core_attn():
    small = DSV3.model_copy(update={"num_layers": 5})
    cluster = load_cluster("dgx-h100", num_nodes=1)
    plain = _stage0(_job(small, cluster, pp=1, global_batch_size=8, recompute="selective"))
    core = _stage0(_job(small, cluster, pp=1, global_batch_size=8, recompute="selective", recompute_modules=["core_attn"]))
    assert plain == core


def test_recomputing_the_whole_moe_layer_re_runs_its_all_to_alls():
    small = DSV3.model_copy(update={"num_layers": 5})
    cluster = load_cluster("dgx-h100", num_nodes=2)
    none = predict_any(_job(small, cluster, pp=1, ep=16, global_batch_size=16))
    moe = predict_any(_job(small, cluster, pp=1, ep=16, global_batch_size=16, recompute="selective",
                           recompute_modules=["moe"]))
    assert moe.breakdown.ep_communication_s > none.breakdown.ep_communication_s


def test_the_megatron_recipe_passes_the_layout_and_recompute_modules_as_given():
    args = megatron_args(_job(pp=16, pipeline_model_parallel_layout="Et*2|(ttt|)*30,ttL", recompute="selective",
                              recompute_modules=["moe_act", "layernorm"]))
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et*2|(ttt|)*30,ttL"
    assert args[args.index("--recompute-modules") + 1: args.index("--recompute-modules") + 3] == ["moe_act", "layernorm"]
    assert "--num-layers-per-virtual-pipeline-stage" not in args


def test_the_megatron_recipe_gives_first_last_counts_with_the_number_of_virtual_stages():
    args = megatron_args(_job(pp=16, vpp=2, decoder_first_pipeline_num_layers=4, decoder_last_pipeline_num_layers=6))
    assert args[args.index("--decoder-first-pipeline-num-layers") + 1] == "4"
    assert args[args.index("--decoder-last-pipeline-num-layers") + 1] == "6"
    assert args[args.index("--num-virtual-stages-per-pipeline-rank") + 1] == "2"


def test_the_megatron_recipe_writes_uneven_chunks_of_layers_per_stage_as_a_layout():
    args = megatron_args(_job(pp=2, vpp=2, layers_per_stage=[48, 46]))
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et*24|t*23|t*24|t*23L"
    args = megatron_args(_job(pp=2, account_for_embedding_in_pipeline_split=True,
                              account_for_loss_in_pipeline_split=True))
    assert "--account-for-embedding-in-pipeline-split" in args and "--account-for-loss-in-pipeline-split" in args


def test_a_published_record_stating_megatrons_layout_and_recompute_modules_is_read_into_the_plan():
    run = {
        "id": "qwen3-235b-megatron-bridge", "gpu": "H100-SXM5-80GB", "num_gpus": 256, "gpus_per_node": 8,
        "interconnect": None, "framework": "Megatron-Core", "precision": "bf16", "recompute": "selective",
        "model": {"num_layers": 94, "hidden_size": 4096, "num_attention_heads": 64, "num_kv_heads": 4,
                  "kv_channels": 128, "ffn_hidden_size": 12288, "seq_length": 4096, "vocab_size": 151936,
                  "activation": "swiglu", "num_experts": 128, "moe_router_topk": 8, "moe_ffn_hidden_size": 1536},
        "parallel": {"tp": 1, "pp": 16, "cp": 1, "sp": None, "ep": 8, "virtual_pipeline": 2,
                     "micro_batch_size": 1, "global_batch_size": 512,
                     "pipeline_model_parallel_layout": "Et*2|(ttt|)*30,ttL",
                     "recompute_modules": ["moe_act", "layernorm"]},
        "measured": {"iteration_time_s": 10.0},
    }
    job = resolve_job(job_from_record(run).mapping)
    assert job.parallel.pipeline_model_parallel_layout == "Et*2|(ttt|)*30,ttL"
    assert job.parallel.recompute_modules == ("moe_act", "layernorm")
    assert count_layers_per_stage(job.model, job.parallel) == (5,) + (6,) * 14 + (5,)


@pytest.mark.parametrize("parallel", [
    {"pp": 16, "pipeline_model_parallel_layout": "Et*2|(ttt|)*30,ttL", "recompute": "selective",
     "recompute_modules": ["moe_act", "layernorm"]},
    {"pp": 16, "vpp": 2, "decoder_first_pipeline_num_layers": 4, "decoder_last_pipeline_num_layers": 6},
    {"pp": 2, "account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True},
])
def test_megatron_lms_parser_reads_back_the_split_and_the_modules_the_recipe_writes(parallel):
    from framework_parsers import parse_megatron
    from paraplan.export import render

    job = _job(**parallel)
    args = parse_megatron(render("megatron", job))
    p = job.parallel
    assert args.pipeline_model_parallel_layout == p.pipeline_model_parallel_layout
    assert args.decoder_first_pipeline_num_layers == p.decoder_first_pipeline_num_layers
    assert args.decoder_last_pipeline_num_layers == p.decoder_last_pipeline_num_layers
    assert args.account_for_embedding_in_pipeline_split == p.account_for_embedding_in_pipeline_split
    assert args.recompute_modules == (list(p.recompute_modules) if p.recompute_modules else None)


def test_the_uneven_search_splits_over_lighter_end_stages_and_exports_megatrons_layout():
    from paraplan.search import SearchSpace, search_plans
    from paraplan.specs import Precision

    model, cluster = load_model("llama-3-8b"), load_cluster("dgx-h100", num_nodes=1)
    space = SearchSpace(uneven_layers=True, tp=(2,), pp=(4,), micro_batch_size=(1,), zero_stage=(1,), recompute=("none",))
    best = search_plans(model, cluster, 64, Precision.BF16, space).ranked[0]
    split = best.job.parallel.layers_per_stage
    assert split[-1] < max(split)  # the LM head's stage takes fewer layers
    args = megatron_args(best.job)
    layout = args[args.index("--pipeline-model-parallel-layout") + 1] if "--pipeline-model-parallel-layout" in args else None
    first_last = "--decoder-last-pipeline-num-layers" in args
    assert layout is not None or first_last
    if layout is not None:
        assert count_layers_per_stage(model, ParallelPlan(pp=4, pipeline_model_parallel_layout=layout)) == split


def test_a_space_stating_megatrons_split_or_recompute_modules_takes_the_exact_path_and_searches_it():
    from paraplan.search import SearchSpace, search_plans
    from paraplan.search.screen import screenable
    from paraplan.specs import Precision

    assert not screenable(SearchSpace(extra={"decoder_last_pipeline_num_layers": 6}))
    assert not screenable(SearchSpace(extra={"recompute_modules": ("moe_act",)}))
    model, cluster = load_model("llama-3-8b"), load_cluster("dgx-h100", num_nodes=1)
    space = SearchSpace(tp=(2,), pp=(4,), micro_batch_size=(1,), zero_stage=(1,), recompute=("none",),
                        extra={"decoder_first_pipeline_num_layers": 9, "decoder_last_pipeline_num_layers": 7})
    best = search_plans(model, cluster, 64, Precision.BF16, space).ranked[0]
    assert [s.num_layers for s in best.stages] == [9, 8, 8, 7]
