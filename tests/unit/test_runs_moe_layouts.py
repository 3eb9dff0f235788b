"""The published MoE runs (benchmarks/data/runs_moe_dev.json) that state Megatron-LM's pipeline
split: Qwen3-235B's 94 layers and DeepSeek-V3's 61 over pp x vpp, read as the split the source's
launch configuration gave (each record's notes cite the line)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from paraplan.specs.errors import ConfigError
from paraplan.specs.pipeline_layout import SPLIT_FIELDS, stage_grid
from paraplan.validate.published import measured_from_published
from paraplan.validate.runs import load_runs, validate_runs

RUNS_MOE = Path(__file__).parents[2] / "benchmarks" / "data" / "runs_moe_dev.json"


def _runs() -> list[dict]:
    return load_runs(RUNS_MOE)


def _stating_a_split() -> list[dict]:
    return [r for r in _runs() if any(key in r["parallel"] for key in SPLIT_FIELDS)]


def test_every_record_stating_a_split_cites_its_source_line_in_its_notes():
    runs = _stating_a_split()
    assert len(runs) == 7  # six Qwen3-235B rows with pp > 1, DeepSeek-V3 on GB200
    for run in runs:
        assert "Pipeline split: " in run["notes"] and "Source: github.com/" in run["notes"], run["id"]


def test_the_records_with_a_stated_split_are_predicted_not_skipped():
    stated = {r["id"] for r in _stating_a_split()}
    assert len(stated) == 7
    skipped: list[tuple[str, str]] = []
    results = validate_runs(_runs(), skipped=skipped)
    predicted = {r.run_id for r in results}
    assert stated <= predicted
    assert not stated & {run_id for run_id, _ in skipped}
    assert all(r.prediction.iteration_s > 0 for r in results if r.run_id in stated)


def test_only_the_dualpipe_run_whose_split_is_unpublished_stays_skipped():
    skipped: list[tuple[str, str]] = []
    validate_runs(_runs(), skipped=skipped)
    assert [run_id for run_id, _ in skipped] == ["deepseek-v3-report-h800-2048gpu-pretrain-average"]


@pytest.mark.parametrize(("run_id", "first", "middle", "last"), [
    # (94 + embedding + loss) / (8 x 4) = 3 per virtual stage: 2 beside the embedding and the loss
    ("megatron-moezoo-qwen3-235b-h100-256gpu-ep32-deepep", 2, 3, 2),
    # (94 + 2) / (32 x 3) = 1: the embedding and the loss each fill a virtual stage
    ("megatron-moezoo-qwen3-235b-h100-256gpu-ep8-pp32-alltoall", 0, 1, 0),
    # "Et|(tt|)*30L": the embedding with 1 layer, 30 stages of 2, the loss alone
    ("megatron-docs-deepseek-v3-gb200-256gpu-mxfp8", 1, 2, 0),
])
def test_the_records_split_places_megatrons_layers_on_each_virtual_stage(run_id, first, middle, last):
    run = next(r for r in _runs() if r["id"] == run_id)
    job = measured_from_published(run).job
    grid = stage_grid(job.model.num_layers, job.parallel)
    assert (grid[0][0], grid[-1][-1]) == (first, last)
    assert {n for chunks in grid[1:-1] for n in chunks} == {middle}
    assert sum(map(sum, grid)) == run["model"]["num_layers"]


def _stating_recompute() -> list[dict]:
    return [r for r in _runs() if "recompute_granularity" in r["parallel"]]


def test_every_record_stating_megatrons_recompute_cites_its_source_line_and_reaches_the_plan():
    runs = _stating_recompute()
    assert len(runs) == 7  # five selective Qwen3-235B rows, the full-recompute FSDP row, DeepSeek-V3 on GB200
    for run in runs:
        assert "Recompute: " in run["notes"] and "Source: github.com/" in run["notes"], run["id"]
        plan = measured_from_published(run).job.parallel
        assert plan.recompute.value == run["parallel"]["recompute_granularity"], run["id"]
        assert list(plan.recompute_modules or ()) == run["parallel"].get("recompute_modules", []), run["id"]


def test_a_recompute_granularity_disagreeing_with_the_records_recompute_is_refused_naming_the_field():
    run = copy.deepcopy(next(r for r in _runs() if r["id"].endswith("ep8-fsdp")))
    run["parallel"]["recompute_granularity"] = "selective"
    with pytest.raises(ConfigError, match=r"parallel\.recompute_granularity 'selective' disagrees with recompute 'full'"):
        measured_from_published(run)


GB200_RUN = "megatron-docs-deepseek-v3-gb200-256gpu-mxfp8"


def _run(run_id: str) -> dict:
    return next(r for r in _runs() if r["id"] == run_id)


def test_a_record_stating_the_gpus_its_placement_keeps_on_one_nvlink_domain_gives_the_cluster_that_domain():
    from paraplan.validate.records import job_from_record

    run = _run(GB200_RUN)
    assert run["scale_up_domain"] == 32 and "Every 32 GB200 GPUs (8 nodes)" in run["notes"]
    assert job_from_record(run).mapping["cluster"]["scale_up_domain"] == 32
    unstated = {k: v for k, v in run.items() if k != "scale_up_domain"}
    assert "scale_up_domain" not in job_from_record(unstated).mapping["cluster"]


def test_deepseek_v3_on_gb200_runs_its_ep32_all_to_alls_on_nvlink_where_the_racks_72_would_straddle_two():
    from paraplan.prediction import predict

    run = _run(GB200_RUN)
    unstated = {k: v for k, v in run.items() if k != "scale_up_domain"}
    placed, rack = (predict(measured_from_published(r).job) for r in (run, unstated))
    ep = [[c for c in p.layer_collectives if c.dim == "ep"] for p in (placed, rack)]
    assert ep[0] and all(c.group_nodes == 1 for c in ep[0])
    assert all(c.group_nodes > 1 for c in ep[1])  # 32 of a 72-GPU domain: some groups cross racks
    assert placed.breakdown.ep_communication_s < 0.5 * rack.breakdown.ep_communication_s


def test_a_record_stating_its_reference_nodes_own_fabric_keeps_that_nodes_measured_network():
    """3200 Gb/s per 8-GPU node is DGX H100's 8 x 400 Gb/s NDR: the nccl-tests efficiency
    measured on it (0.94) stays; a fabric of another speed was never measured (generic)."""
    from paraplan.catalog import load_cluster
    from paraplan.validate.records import job_from_record

    run = next(r for r in _runs() if r["id"] == "megatron-moezoo-qwen3-235b-h100-256gpu-ep32-deepep")
    assert "3200 Gbps inter-node" in run["interconnect"]
    assert "inter_node" not in job_from_record(run).mapping["cluster"]
    slower = {**run, "interconnect": "800 Gbps inter-node"}
    assert job_from_record(slower).mapping["cluster"]["inter_node"] == {"latency": "10 us", "bandwidth": "12.5 GB/s"}
    assert load_cluster("dgx-h100").inter_node.efficiency == 0.94
