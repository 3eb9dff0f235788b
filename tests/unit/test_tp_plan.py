"""A traced layer split over tensor-parallel ranks by the model's own plan (inventory.tp_plan)."""

from __future__ import annotations

from pathlib import Path

import pytest

from paraplan.inventory.layer import gemm
from paraplan.inventory.ops import CollectiveKind, Op, OpKind, Phase
from paraplan.inventory.tp_plan import shard_layer
from paraplan.specs import ConfigError

LLAMA_PLAN = {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
              "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
              "mlp.down_proj": "rowwise"}
T, H, F = 4096, 4096, 14336


def _norm(name: str) -> Op:
    return Op(name=name, kind=OpKind.NORM, role="norm", flops=4.0 * T * H, bytes=4.0 * T * H, bwd_flops=8.0 * T * H,
              bwd_bytes=6.0 * T * H, params=H, saved_bytes=2.0 * T * H)


def _layer() -> tuple[tuple[Op, ...], tuple[str, ...]]:
    ops = (
        _norm("input_layernorm"),
        gemm("self_attn.q_proj", "q", T, H, H, 2, bias=False, saved=2.0 * T * H),
        gemm("self_attn.k_proj", "k", T, H, 1024, 2, bias=False, saved=0.0),
        gemm("self_attn.o_proj", "o", T, H, H, 2, bias=False, saved=2.0 * T * H),
        _norm("post_attention_layernorm"),
        gemm("mlp.gate_proj", "gate", T, H, F, 2, bias=False, saved=2.0 * T * H),
        gemm("mlp.up_proj", "up", T, H, F, 2, bias=False, saved=0.0),
        Op(name="mlp", kind=OpKind.ELEMENTWISE, role="mul", flops=T * F, bytes=6.0 * T * F, bwd_flops=2.0 * T * F,
           bwd_bytes=9.0 * T * F, saved_bytes=2.0 * T * F),
        gemm("mlp.down_proj", "down", T, F, H, 2, bias=False, saved=2.0 * T * F),
    )
    return ops, tuple(op.name for op in ops)


def test_one_rank_of_a_column_or_row_split_gemm_does_a_tp_th_of_its_flops_and_holds_a_tp_th_of_its_weight():
    ops, modules = _layer()
    split, _ = shard_layer(ops, modules, LLAMA_PLAN, 4, False, 2)
    for full, one in zip(ops, split, strict=True):
        if full.kind is OpKind.GEMM:
            assert one.flops == full.flops / 4 and one.params == full.params / 4
            assert one.bwd_weight_flops == full.bwd_weight_flops / 4


def test_the_mlps_own_operators_run_on_a_tp_th_and_the_norms_on_all_tokens_without_sequence_parallelism():
    ops, modules = _layer()
    split, _ = shard_layer(ops, modules, LLAMA_PLAN, 4, False, 2)
    by = dict(zip(modules, split, strict=True))
    assert by["mlp"].bytes == ops[7].bytes / 4
    assert by["input_layernorm"].bytes == ops[0].bytes
    with_sp = dict(zip(modules, shard_layer(ops, modules, LLAMA_PLAN, 4, True, 2)[0], strict=True))
    assert with_sp["input_layernorm"].bytes == ops[0].bytes / 4
    assert with_sp["input_layernorm"].params == ops[0].params  # the norm's weight stays whole


def test_each_rowwise_output_is_all_reduced_forward_and_each_colwise_groups_input_gradient_backward():
    ops, modules = _layer()
    _, coll = shard_layer(ops, modules, LLAMA_PLAN, 2, False, 2)
    calls = {(c.kind, c.phase): (c.bytes, c.count) for c in coll}
    assert calls == {
        (CollectiveKind.ALL_REDUCE, Phase.FWD): (2.0 * T * H, 2),
        (CollectiveKind.ALL_REDUCE, Phase.BWD_INPUT): (2.0 * T * H, 2),
    }


def test_sequence_parallelism_turns_each_all_reduce_into_an_all_gather_and_a_reduce_scatter():
    ops, modules = _layer()
    _, coll = shard_layer(ops, modules, LLAMA_PLAN, 2, True, 2)
    kinds = sorted((c.kind.value, c.phase.value, c.count) for c in coll)
    assert kinds == [("all_gather", "bwd_input", 2), ("all_gather", "fwd", 2),
                     ("reduce_scatter", "bwd_input", 2), ("reduce_scatter", "fwd", 2)]


def test_a_model_without_a_tensor_parallel_plan_is_refused_tp_over_one_naming_the_field():
    ops, modules = _layer()
    assert shard_layer(ops, modules, None, 1, False, 2) == (ops, ())
    with pytest.raises(ConfigError, match="base_model_tp_plan"):
        shard_layer(ops, modules, None, 2, False, 2)


def test_a_plan_style_not_applied_yet_is_refused_in_one_line_naming_it():
    ops, modules = _layer()
    with pytest.raises(ConfigError, match="'grouped_gemm'"):
        shard_layer(ops, modules, {**LLAMA_PLAN, "mlp.up_proj": "grouped_gemm"}, 2, False, 2)


HF = Path(__file__).parents[1] / "fixtures" / "hf" / "llama-3-8b.json"


def _job(inventory: str, tp: int, **parallel):
    from paraplan.catalog.jobs import resolve_job

    model = {"hf_config": str(HF), "seq_length": 4096, "swiglu_fusion": False, "inventory": inventory}
    return resolve_job({"name": "t", "model": model, "cluster": {"name": "aws-p5.48xlarge", "num_nodes": 1},
                        "parallel": {"tp": tp, "micro_batch_size": 1, "global_batch_size": 64,
                                     "sequence_parallel": tp > 1, **parallel}, "precision": "bf16"})


def test_a_job_with_a_traced_llama_counts_the_hand_written_parameters_flops_and_tp_collectives():
    pytest.importorskip("transformers")
    from paraplan.inventory import count_job

    hand, traced = count_job(_job("hand", 2)), count_job(_job("traced", 2))
    assert traced.params_total == hand.params_total == 8_030_261_248
    h_block, t_block = hand.stages[0].blocks[0], traced.stages[0].blocks[0]
    mm = (OpKind.GEMM, OpKind.ATTENTION)
    h_flops = sum(o.flops + o.bwd_flops for o in h_block.ops if o.kind in mm)
    t_flops = sum(o.flops + o.bwd_flops for o in t_block.ops if o.kind in mm)
    assert t_flops == pytest.approx(h_flops, rel=1e-3)
    assert sorted(t_block.collectives, key=repr) == sorted(h_block.collectives, key=repr)


def test_a_traced_inventory_without_an_hf_config_is_refused_naming_it():
    from paraplan.specs import ModelSpec

    with pytest.raises(ValueError, match="hf_config"):
        ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64, vocab_size=100,
                  inventory="traced")


def test_a_search_over_a_traced_model_takes_the_exact_path_not_the_screens_closed_forms():
    from paraplan.search.screen import screenable
    from paraplan.search.space import SearchSpace

    model = _job("hand", 1).model.model_copy(update={"inventory": "traced", "hf_config": str(HF)})
    assert screenable(SearchSpace(), _job("hand", 1).model)
    assert not screenable(SearchSpace(), model)
