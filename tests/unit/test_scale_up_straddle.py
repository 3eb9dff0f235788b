"""A parallel group that straddles a scale-up domain (64 of an NVL72 rack's 72 GPUs) is priced
at the inter-domain link, as docs/hardware.md documents; the prediction now says so in its
notes, naming the group, its size and the domain, and how many groups the rank order puts
across two domains."""

from __future__ import annotations

import pytest

from paraplan.catalog import load_job
from paraplan.inventory.ops import ParallelDim
from paraplan.inventory.placement import group_layout, straddle_notes
from paraplan.prediction import predict
from paraplan.specs import ParallelPlan


def _plan(**kw) -> ParallelPlan:
    base = {"tp": 1, "pp": 1, "dp": 64, "micro_batch_size": 1, "global_batch_size": 64}
    return ParallelPlan.model_validate({**base, **kw})


def test_a_64_gpu_group_on_72_gpu_domains_is_named_with_its_size_the_domain_and_the_inter_domain_link():
    notes = straddle_notes(_plan(), 72, 1024)
    assert len(notes) == 1
    assert notes[0].startswith("DP group of 64 GPUs straddles the 72-GPU scale-up domain")
    assert "7 of every 9 blocks of 64 consecutive ranks cross two domains" in notes[0]
    assert "inter-domain link with 8 GPUs on the smaller side" in notes[0]
    assert group_layout(ParallelDim.DP, _plan(), 72).per_node == 8


@pytest.mark.parametrize(("plan", "domain", "world"), [(_plan(), 8, 512), (_plan(), 64, 512), (_plan(dp=8), 72, 576),
                                                        (_plan(), 72, 72), (_plan(dp=36, global_batch_size=36), 72, 1008)])
def test_groups_that_tile_the_domain_or_a_single_domain_cluster_give_no_straddle_note(plan, domain, world):
    assert straddle_notes(plan, domain, world) == ()


def test_deepseek_v3_with_ep_64_on_gb200_nvl72_says_its_ep_group_straddles_the_rack_and_dgx_h100_says_nothing():
    job = load_job("examples/deepseek-v3-dgx-h100-pp16-ep64.yaml")
    notes = straddle_notes(job.parallel, 72, 1024, moe=True)
    assert any(n.startswith("EP group of 64 GPUs straddles the 72-GPU scale-up domain: in the rank order "
                            "tp-ep-dp-pp") for n in notes)
    assert not any("straddles" in n for n in predict(job).uncalibrated)


def test_a_straddling_group_is_shown_under_placement_not_uncalibrated_in_table_json_and_html(tmp_path, monkeypatch):
    import json

    import yaml
    from typer.testing import CliRunner

    from paraplan.cli.app import app

    monkeypatch.setenv("COLUMNS", "80")
    job = {"model": "llama-3-8b", "cluster": {"name": "gb200-nvl72", "num_nodes": 32},
           "parallel": {"tp": 1, "pp": 2, "dp": 64, "micro_batch_size": 1, "global_batch_size": 128},
           "precision": "bf16"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    pred = predict(load_job(path))
    assert pred.placement_notes and pred.placement_notes[0].startswith("DP group of 64 GPUs straddles")
    assert not any("straddles" in n for n in pred.uncalibrated)
    runner = CliRunner()
    table = runner.invoke(app, ["predict", str(path)]).stdout
    assert "placement: DP group of 64 GPUs straddles" in " ".join(table.split())
    assert "uncalibrated: DP group" not in " ".join(table.split())
    data = json.loads(runner.invoke(app, ["predict", str(path), "-f", "json"]).stdout)
    assert data["placement_notes"] == list(pred.placement_notes)
    assert not any("straddles" in n for n in data["uncalibrated"])
    html = tmp_path / "job.html"
    assert runner.invoke(app, ["report", str(path), "-o", str(html)]).exit_code == 0
    assert "placement: DP group of 64 GPUs straddles" in html.read_text()
