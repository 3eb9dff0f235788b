"""The screen costs each representative plan once: a plan that stands for a shard shape and a
layout is inventoried once for both tables, and no plan twice."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import paraplan.search.screen as screen_module
from paraplan.catalog import load_cluster, load_model
from paraplan.search import SearchSpace
from paraplan.search.space import enumerate_plans, iter_unique
from paraplan.specs import Precision


def test_the_screen_inventories_no_plan_twice_and_lets_one_plan_stand_for_both_tables(monkeypatch):
    counted = []
    real = screen_module.count_job
    monkeypatch.setattr(screen_module, "count_job", lambda job: counted.append(job.parallel) or real(job))
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100", num_nodes=128)
    sc = screen_module.screen_plans(model, cluster, 512, Precision.BF16, SearchSpace(global_batch_sizes=(512, 1024)))
    p = sc.plans
    sp_on = np.where(p["sp"] == 2, p["tp"] > 1, (p["sp"] == 1) & (p["tp"] > 1))
    shards = set(zip(p["tp"], p["cp"], sp_on, p["mbs"], strict=True))  # Megatron, bf16: fused accumulation
    layouts = set(zip(*(p[k] for k in ("tp", "cp", "pp", "zero", "offload", "shard")), strict=True))
    assert len(set(counted)) == len(counted)
    assert max(len(shards), len(layouts)) <= len(counted) < len(shards) + len(layouts)


@pytest.mark.parametrize(("framework", "recompute"), [
    ("megatron", ("none", "selective", "full")),  # all offered: one verdict serves every policy
    ("fsdp", ("none", "selective", "full", "op")),  # torchtitan has no selective: judged per policy
])
def test_the_screen_excludes_what_the_job_validator_excludes_whether_or_not_the_framework_offers_each_recompute_policy(
    framework, recompute
):
    model, cluster = load_model("gpt3-1.3b"), load_cluster("aws-p4de.24xlarge", num_nodes=2)
    space = SearchSpace(framework=framework, recompute=recompute, zero_stage=(0, 1, 3), global_batch_sizes=(64, 128))
    sc = screen_module.screen_plans(model, cluster, 64, Precision.BF16, space)
    cands = enumerate_plans(model, cluster, 64, Precision.BF16, space)
    assert sc.excluded == Counter(cands.excluded)
    assert [sc.job(i).parallel for i in range(len(sc))] == [j.parallel for j in iter_unique(cands.jobs)]


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, bool, np.float64])
def test_a_columns_codes_are_the_ranks_numpy_unique_gives_its_values(dtype):
    rng = np.random.default_rng(0)
    for _ in range(100):
        values = rng.integers(0, 2 if dtype is bool else 40, size=int(rng.integers(1, 200))).astype(dtype)
        expected = np.unique(values, return_inverse=True)[1].reshape(values.shape)
        assert np.array_equal(screen_module._codes(values), expected if values.min() != values.max() else 0 * expected)


def test_a_space_of_one_recompute_policy_screens_its_plans_as_the_space_of_every_policy_does():
    # the shard table costs only the policies a space holds: what it leaves out no plan reads
    model, cluster = load_model("llama-3-8b"), load_cluster("dgx-h100", num_nodes=2)
    every = screen_module.screen_plans(model, cluster, 128, Precision.BF16, SearchSpace(
        framework="fsdp", zero_stage=(0, 3), recompute=("none", "full", "op", "layer"), schedule=("1f1b", "zb-h1")))
    for policy in ("none", "full", "op", "layer"):
        one = screen_module.screen_plans(model, cluster, 128, Precision.BF16, SearchSpace(
            framework="fsdp", zero_stage=(0, 3), recompute=(policy,), schedule=("1f1b", "zb-h1")))
        code = screen_module._RECOMPUTE.index(screen_module.Recompute(policy))
        rows = np.flatnonzero(every.plans["recompute"] == code)
        assert len(one) == len(rows) > 0
        assert np.array_equal(one.iteration_s, every.iteration_s[rows])
        assert np.array_equal(one.memory_bytes, every.memory_bytes[rows])


def test_a_space_without_zero_bubble_plans_screens_its_plans_as_a_space_with_them_does():
    # the ends' weight-gradient pass is costed only where a zero-bubble plan reads it
    model, cluster = load_model("llama-3-8b"), load_cluster("dgx-h100", num_nodes=2)
    both = screen_module.screen_plans(model, cluster, 128, Precision.BF16, SearchSpace(
        framework="fsdp", zero_stage=(0, 3), schedule=("1f1b", "zb-h1")))
    plain = screen_module.screen_plans(model, cluster, 128, Precision.BF16, SearchSpace(
        framework="fsdp", zero_stage=(0, 3), schedule=("1f1b",)))
    rows = np.flatnonzero(both.plans["sched"] == [s.value for s in screen_module.SCHEDULES].index("1f1b"))
    assert len(plain) == len(rows) > 0
    assert np.array_equal(plain.iteration_s, both.iteration_s[rows])
    assert np.array_equal(plain.memory_bytes, both.memory_bytes[rows])
