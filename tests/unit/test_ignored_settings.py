"""Settings the plan states that nothing priced runs are said under their own heading
("ignored:", JSON ``ignored_settings``), not as calibration gaps, in every output."""

import json

import yaml
from typer.testing import CliRunner

from paraplan.cli.app import app

_GRAPHS = "ignored: parallel.cuda_graph_scope attn: a dense model's kernel launches run ahead of the GPU"


def _job_file(tmp_path):
    job = {"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 1},
           "parallel": {"tp": 2, "micro_batch_size": 1, "global_batch_size": 8, "cuda_graph_scope": ["attn"]},
           "precision": "bf16"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_partial_cuda_graphs_on_a_dense_model_are_shown_as_ignored_in_the_table_json_and_html(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    path, runner = _job_file(tmp_path), CliRunner()
    table = runner.invoke(app, ["predict", str(path)]).stdout
    assert _GRAPHS in " ".join(table.split())
    assert "uncalibrated: parallel.cuda_graph_scope" not in " ".join(table.split())
    assert max(len(line) for line in table.splitlines()) <= 80
    data = json.loads(runner.invoke(app, ["predict", str(path), "-f", "json"]).stdout)
    assert [n.split(":")[0] for n in data["ignored_settings"]] == ["parallel.cuda_graph_scope attn"]
    assert not any("cuda_graph_scope" in n for n in data["uncalibrated"])
    html = tmp_path / "job.html"
    assert runner.invoke(app, ["report", str(path), "-o", str(html)]).exit_code == 0
    assert '<p class="note">ignored: parallel.cuda_graph_scope attn: a dense' in html.read_text()


def test_a_searchs_rows_and_notes_keep_the_ignored_settings(tmp_path, monkeypatch):
    """A userbuffers file stated without the overlap (a preset's field the search keeps)."""
    monkeypatch.setenv("COLUMNS", "80")
    job = {"model": {"name": "gpt3-175b", "num_layers": 8}, "cluster": {"name": "dgx-h100", "num_nodes": 1},
           "parallel": {"framework": "nemo-mlperf-3.0", "tp": 4, "pp": 2, "sequence_parallel": True,
                        "micro_batch_size": 1, "global_batch_size": 16, "tp_comm_overlap": False,
                        "tp_comm_overlap_cfg": "mlperf-3.0-h100tp4pp8mbs1"}, "precision": "fp8"}
    path, runner = tmp_path / "job.yaml", CliRunner()
    path.write_text(yaml.safe_dump(job))
    result = runner.invoke(app, ["search", str(path), "--top", "1", "-f", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["plans"]
    said = "parallel.tp_comm_overlap_cfg mlperf-3.0-h100tp4pp8mbs1: Transformer Engine's userbuffers"
    assert rows and all(any(n.startswith(said) for n in r["ignored_settings"]) for r in rows)
    assert not any("tp_comm_overlap_cfg" in n for r in rows for n in r["uncalibrated"])
    table = runner.invoke(app, ["search", str(path), "--top", "1"]).stdout
    assert f"ignored: {said}" in " ".join(table.split())
    assert max(len(line) for line in table.splitlines()) <= 80
