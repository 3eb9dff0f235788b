"""The screen costs each representative plan once: a plan that stands for a shard shape and a
layout is inventoried once for both tables, and no plan twice."""

from __future__ import annotations

import numpy as np

import paraplan.search.screen as screen_module
from paraplan.catalog import load_cluster, load_model
from paraplan.search import SearchSpace
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
