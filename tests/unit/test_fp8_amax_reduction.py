"""Transformer Engine DelayedScaling's amax reduction (``parallel.fp8_amax_reduce``): one
max-all-reduce of a few bytes over the stage's tp x dp ranks per model chunk per micro-batch,
forward and backward, waited for by the compute stream, priced at NCCL's small-message latency;
the framework presets that run it (NeMo's MLPerf v3.0 GPT-3, Megatron-Core) set it, cited."""

from __future__ import annotations

import dataclasses

import pytest

from paraplan.catalog import load_cluster, load_model, resolve_job
from paraplan.catalog.presets import presets
from paraplan.costmodel import AnalyticalCostModel
from paraplan.costmodel.collectives import estimate_collective_s, nccl_ll_latency_s
from paraplan.inventory import (
    Collective,
    CollectiveKind,
    GroupLayout,
    ParallelDim,
    count_job,
    count_layer_collectives,
    group_layout,
    local_shape,
)
from paraplan.inventory.fp8 import amax_reductions, is_amax_reduction
from paraplan.prediction import predict
from paraplan.prediction.stages import CommCosts, LayerCost
from paraplan.specs import ConfigError, FP8Recipe, ParallelPlan, Phase, Precision

_MLPERF = {  # MLPerf v3.0 GPT-3 175B on 512 H100 (NVIDIA's config_DGXH100_64x8x128x4x8_mbs1.sh)
    "model": "gpt3-175b",
    "cluster": {"name": "dgx-h100", "num_nodes": 64},
    "parallel": {"framework": "nemo-mlperf-3.0", "tp": 4, "pp": 8, "vpp": 12, "sequence_parallel": True,
                 "zero_stage": 1, "micro_batch_size": 1, "global_batch_size": 2048},
    "precision": "fp8",
}


def _plan(**kw) -> ParallelPlan:
    base = {"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 8,
            "virtual_pipeline_model_parallel_size": 12, "data_parallel_size": 16, "sequence_parallel": True,
            "micro_batch_size": 1, "global_batch_size": 2048}
    return ParallelPlan(**{**base, **kw})


def _ll_all_reduce_s(layout):
    return nccl_ll_latency_s(CollectiveKind.ALL_REDUCE, layout)


def test_a_few_bytes_all_reduced_cost_nccls_ll_latency_far_below_the_alpha_beta_ring():
    cluster = load_cluster("dgx-h100", num_nodes=8)
    across = GroupLayout(size=64, nodes=8, per_node=8)
    # NCCL's tree: 6.8 + 2 x (7 x 0.6 + log2(8) x 5.0) us
    assert _ll_all_reduce_s(across) == pytest.approx(45.2e-6)
    # one node of 4: the ring, 6.6 + 6 x 0.6 us
    assert _ll_all_reduce_s(GroupLayout(size=4, nodes=1, per_node=4)) == pytest.approx(10.2e-6)
    assert _ll_all_reduce_s(GroupLayout(size=256, nodes=32, per_node=8)) > \
        _ll_all_reduce_s(across)
    assert _ll_all_reduce_s(GroupLayout(size=1, nodes=1, per_node=1)) == 0.0
    small = Collective("amax", CollectiveKind.ALL_REDUCE, ParallelDim.TP_DP, 48.0, Phase.FWD)
    assert estimate_collective_s(small, across, cluster) == pytest.approx(_ll_all_reduce_s(across), rel=1e-3)
    alpha_beta = 2 * 63 * cluster.inter_node.latency_s  # 2(n-1) whole link latencies: 1.26 ms
    assert alpha_beta > 20 * estimate_collective_s(small, across, cluster)


def test_the_amax_group_is_a_stages_tp_x_cp_x_dp_consecutive_ranks():
    assert group_layout(ParallelDim.TP_DP, _plan(), 8) == GroupLayout(size=64, nodes=8, per_node=8)
    assert group_layout(ParallelDim.TP_DP, _plan(data_parallel_size=1), 8) == GroupLayout(4, 1, 4)


def test_delayed_scaling_reduces_once_per_model_chunk_forward_and_backward_and_te_0x_again_over_tp():
    model = load_model("gpt3-175b")
    once = amax_reductions(model, _plan(fp8_amax_reduce="tp_dp"), None)
    assert [(c.dim, c.phase, c.count) for c in once] == [(ParallelDim.TP_DP, Phase.FWD, 12),
                                                          (ParallelDim.TP_DP, Phase.BWD_INPUT, 12)]
    assert all(c.kind is CollectiveKind.ALL_REDUCE for c in once)
    # one layer per chunk: 4 FP8 GEMMs, 3 fp32 amaxes each forward, 2 backward
    assert [c.bytes for c in once] == [48.0, 32.0]
    twice = amax_reductions(model, _plan(fp8_amax_reduce="tp_dp_then_tp"), FP8Recipe.DELAYED)
    assert [c.dim for c in twice] == [ParallelDim.TP_DP] * 2 + [ParallelDim.TP] * 2
    # without sequence parallelism TE 0.x reduces over the fp8 group alone
    assert len(amax_reductions(model, _plan(fp8_amax_reduce="tp_dp_then_tp", sequence_parallel=False), None)) == 2
    assert amax_reductions(model, _plan(), None) == ()
    assert amax_reductions(model, _plan(fp8_amax_reduce="tp_dp"), FP8Recipe.MXFP8) == ()


def test_amax_reduction_beside_a_recipe_without_amax_histories_is_an_error_naming_both():
    with pytest.raises(ValueError, match=r"parallel\.fp8_amax_reduce: 'tp_dp' .* fp8_recipe current"):
        _plan(fp8_amax_reduce="tp_dp", fp8_recipe="current")
    assert _plan(fp8_amax_reduce="tp_dp", fp8_recipe="delayed").fp8_amax_reduce == "tp_dp"


@pytest.mark.parametrize("preset_id, value", [("nemo-mlperf-3.0", "tp_dp_then_tp"), ("megatron-core-0.12", "tp_dp"),
                                              ("nemo-24.07", "tp_dp"), ("megatron-bridge-0.1", "tp_dp")])
def test_the_megatron_presets_reduce_amax_with_the_delayed_recipe_cited(preset_id, value):
    default = {d.field: d for d in presets()[preset_id].defaults}["fp8_amax_reduce"]
    assert (default.value, default.when) == (value, "fp8_delayed")
    assert "get_amax_reduction_group" in default.source


def test_the_preset_leaves_amax_unreduced_for_bf16_and_for_a_recipe_without_histories():
    assert resolve_job({**_MLPERF, "precision": "bf16"}).parallel.fp8_amax_reduce == "none"
    current = {**_MLPERF, "parallel": {**_MLPERF["parallel"], "fp8_recipe": "current"}}
    assert resolve_job(current).parallel.fp8_amax_reduce == "none"


def test_the_mlperf_gpt3_prediction_slows_by_its_amax_reductions_latency():
    """128 micro-batches x 12 chunks x (forward + backward) reductions on the critical path: over
    64 ranks on 8 nodes (NCCL's LL model: 45.2 us) and again over the tp group of 4 inside a node
    (XLA's sm_90 table: 31.5 us), ~0.24 s."""
    job = resolve_job(_MLPERF)
    assert job.parallel.fp8_amax_reduce == "tp_dp_then_tp"
    off = job.model_copy(update={"parallel": job.parallel.model_copy(update={"fp8_amax_reduce": "none"})})
    added = predict(job).iteration_s - predict(off).iteration_s
    expected = 128 * 12 * 2 * (45.2e-6 + 31.5e-6)
    assert 0.9 < added / expected < 1.1


def _layer_amax(recipe: str | None, **kw) -> list[tuple[Phase, int]]:
    plan = _plan(fp8_recipe=recipe, **kw)
    x = local_shape(load_model("gpt3-175b"), plan, Precision.FP8)
    return [(c.phase, c.count) for c in count_layer_collectives(load_model("gpt3-175b"), plan, x)
            if is_amax_reduction(c)]


def test_current_scaling_all_reduces_each_sequence_parallel_inputs_amax_over_tp_forward_and_backward():
    # the column-parallel inputs (QKV, the MLP's first linear) forward, the row-parallel outputs'
    # gradients backward: one fp32 each over the tp group
    assert _layer_amax("current") == [(Phase.FWD, 2), (Phase.BWD_INPUT, 2)]
    assert _layer_amax("nvfp4") == [(Phase.FWD, 2), (Phase.BWD_INPUT, 2)]
    assert _layer_amax("current", sequence_parallel=False) == []  # each rank quantizes the whole input
    assert _layer_amax("delayed") == [] and _layer_amax("mxfp8") == []
    assert _layer_amax("current", framework="fsdp", data_parallel_size=16, pipeline_model_parallel_size=1,
                       virtual_pipeline_model_parallel_size=None) == []


def test_an_amax_all_reduce_stays_exposed_under_tp_comm_overlap():
    """Transformer Engine's userbuffers hide the sequence-parallel gathers behind the GEMMs; the
    quantizer's amax all-reduce waits between its amax kernel and its cast on the compute stream."""
    job = resolve_job({**_MLPERF, "parallel": {**_MLPERF["parallel"], "fp8_recipe": "current",
                                               "tp_comm_overlap": True}})
    inv = count_job(job)
    cm = AnalyticalCostModel(job.cluster, job.precision)
    comm = CommCosts(inv, cm)
    block = inv.stages[0].blocks[0]
    amax = tuple(c for c in block.collectives if is_amax_reduction(c))
    plain = dataclasses.replace(block, collectives=tuple(c for c in block.collectives if not is_amax_reduction(c)))
    with_amax, without = LayerCost.of(block, cm, comm), LayerCost.of(plain, cm, comm)
    assert with_amax.tp_fwd - without.tp_fwd == pytest.approx(comm.total(amax, (Phase.FWD,)))
    assert with_amax.tp_bwd - without.tp_bwd == pytest.approx(comm.total(amax, (Phase.BWD_INPUT,)))
    # two tp-4 calls inside an H100 node: the median small all-reduce XLA's sm_90 table measured
    small = job.cluster.intra_node.collectives["all_reduce"].small_for(4)
    assert comm.total(amax, (Phase.FWD,)) == pytest.approx(2 * small) and small == pytest.approx(31.5e-6)


def test_amax_reduction_in_a_bf16_job_is_an_error_naming_the_field():
    stated = {**_MLPERF, "precision": "bf16", "parallel": {**_MLPERF["parallel"], "fp8_amax_reduce": "tp_dp"}}
    with pytest.raises(ConfigError, match=r"parallel\.fp8_amax_reduce: tp_dp .* precision is bf16"):
        resolve_job(stated)
