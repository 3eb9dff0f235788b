"""Hybrid sharding (FSDP HYBRID_SHARD, torchtitan's data_parallel_shard_degree): ZeRO state
sharded within groups of ranks, the shards' replicas all-reducing their gradients."""

from __future__ import annotations

import pytest

from paraplan.catalog import resolve_job
from paraplan.inventory import ParallelDim, count_job, group_layout
from paraplan.prediction import predict
from paraplan.specs import ConfigError


def job(**parallel):
    plan = {"framework": "fsdp", "zero_stage": 3, "micro_batch_size": 2, "global_batch_size": 64, **parallel}
    return resolve_job({"model": "llama-2-7b", "cluster": {"name": "dgx-a100", "num_nodes": 4}, "parallel": plan})


def test_zero_state_is_divided_by_the_shard_group_not_the_whole_data_parallel_group():
    full, hybrid = predict(job()).memory[0], predict(job(data_parallel_shard_degree=8)).memory[0]
    assert hybrid.optimizer_states == pytest.approx(full.optimizer_states * 32 / 8)
    assert hybrid.gradients == pytest.approx(full.gradients * 32 / 8)


def test_gathers_stay_in_the_node_and_replicas_all_reduce_one_shard_across_nodes():
    j = job(data_parallel_shard_degree=8)
    st = count_job(j).stages[0]
    assert group_layout(ParallelDim.DP, j.parallel, 8).nodes == 1
    replicate = group_layout(ParallelDim.DP_REPLICATE, j.parallel, 8)
    assert (replicate.size, replicate.nodes, replicate.per_node) == (4, 4, 1)
    rs = next(c for c in st.per_microbatch_dp if c.name == "dp_reducescatter")
    ar = next(c for c in st.per_microbatch_dp if c.name == "dp_replicate_allreduce")
    assert ar.bytes == pytest.approx(rs.bytes / 8)


def test_a_shard_group_as_large_as_the_data_parallel_group_is_full_sharding():
    full, hybrid = predict(job()), predict(job(data_parallel_shard_degree=32))
    assert hybrid.iteration_s == pytest.approx(full.iteration_s)
    assert hybrid.memory[0].total == pytest.approx(full.memory[0].total)


def test_the_shard_degree_must_divide_the_data_parallel_group():
    with pytest.raises(ConfigError, match="data_parallel_shard_degree: 6 does not divide"):
        job(data_parallel_shard_degree=6)


def test_hybrid_sharding_needs_zero():
    with pytest.raises(ConfigError, match=r"data_parallel_shard_degree: .*zero_stage >= 1"):
        job(zero_stage=0, data_parallel_shard_degree=8)
