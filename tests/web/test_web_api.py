"""The page's JSON API (no browser): the same prediction, message and recipes as the CLI."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.testclient import TestClient
from tests.web.helpers import FORM, HF_CONFIG, POST

from paraplan.web.app import create_app


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(), base_url="http://127.0.0.1") as c:
        yield c


def predict(client, **changes):
    return client.post("/api/predict", json={**FORM, **changes}, headers=POST)


def cli_json(*args: str) -> dict:
    """What ``paraplan ARGS --format json`` prints, read back."""
    from typer.testing import CliRunner

    from paraplan.cli.app import app

    result = CliRunner().invoke(app, [*args, "--format", "json"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_predicted_plan_is_the_clis_json_prediction_of_the_same_job_interval_included(client):
    answer = predict(client).json()
    assert answer["prediction"] == cli_json("predict", "--pp", "2")  # the demo job with --pp 2
    assert answer["prediction"]["interval"]["level"] == 0.8


def test_the_interval_level_field_is_the_clis_interval_flag(client):
    answer = predict(client, interval="0.5").json()
    assert answer["prediction"] == cli_json("predict", "--pp", "2", "--interval", "0.5")
    wide = predict(client, interval="0.95").json()["prediction"]["interval"]["iteration_s"]
    narrow = answer["prediction"]["interval"]["iteration_s"]
    assert wide[0] < narrow[0] and narrow[1] < wide[1]
    bad = predict(client, interval="1.5").json()
    assert bad["field"] == "interval" and "1.5" in bad["error"]


def test_the_pages_figures_are_the_cli_tables_strings(client):
    from typer.testing import CliRunner

    from paraplan.cli.app import app

    shown = predict(client).json()["shown"]
    table = CliRunner().invoke(app, ["predict", "--pp", "2"], env={"COLUMNS": "200"}).stdout
    cards = dict(shown["cards"])
    for label in ("iteration", "tokens / s", "MFU", "cost to train"):
        assert cards[label] in table, label
    used, hbm = cards["memory / GPU"].removesuffix(" HBM").split(" of ")
    assert used.endswith("GiB") and used in table and f"of {hbm} HBM" in table
    for t in shown["tables"]:
        for row in t["rows"]:
            assert all(cell in table for cell in row), row
    assert all(line in table for line in shown["interval"])


def test_a_bad_value_answers_the_packages_one_line_message_and_names_its_field(client):
    answer = predict(client, tp="3")
    assert answer.status_code == 400
    assert answer.json() == {"error": "parallel: tp*pp*cp = 6 does not divide the cluster's 32 GPUs "
                                      "(cluster.num_nodes 4 x cluster.gpus_per_node 8)", "field": "tp"}
    assert predict(client, recompute="bogus").json()["field"] == "recompute"
    assert predict(client, model="llama-9").json()["field"] == "model"


def test_each_picture_and_download_of_a_prediction_is_served(client):
    answer = predict(client).json()
    for url in answer["pictures"].values():
        picture = client.get(url)
        assert picture.status_code == 200 and picture.content.startswith(b"\x89PNG")
    megatron = client.get(answer["downloads"]["megatron"])
    assert "--pipeline-model-parallel-size 2" in megatron.text
    assert "attachment" in megatron.headers["content-disposition"]
    assert "pp: 2" in client.get(answer["downloads"]["job.yaml"]).text
    assert "<html" in client.get(answer["downloads"]["report.html"]).text.lower()


def test_a_model_uploaded_as_a_hugging_face_config_is_predicted(client):
    upload = client.post("/api/upload?name=config.json", content=HF_CONFIG, headers=POST).json()
    answer = predict(client, model_source="hf", hf_config=upload["id"], seq_length="4096").json()
    assert answer["prediction"]["seq_length"] == 4096 and answer["prediction"]["iteration_s"] > 0


def test_an_upload_over_the_size_limit_or_with_a_repeated_key_is_refused(client):
    big = client.post("/api/upload", content=b" " * (2 * 1024 * 1024), headers=POST)
    assert big.status_code == 413 and big.json()["field"] == "hf_config"
    repeated = client.post("/api/upload?name=config.json", content=b'{"a": 1, "a": 2}', headers=POST)
    assert repeated.json() == {"error": "config.json: duplicate key 'a' in one object", "field": "hf_config"}


def test_a_model_mapping_with_a_yaml_tag_is_refused_as_a_file_would_be(client):
    answer = predict(client, model_source="mapping", model_yaml="a: !!python/object/apply:os.system [ls]")
    assert answer.status_code == 400 and answer.json()["field"] == "model_yaml"
    assert "tag" in answer.json()["error"]


def test_a_cluster_named_by_a_server_file_is_refused(client, tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("gpu: H100-SXM5-80GB\ngpus_per_node: 8\nnum_nodes: 4\n")
    assert predict(client, cluster=str(cluster)).json() == {
        "error": "cluster: the page takes a catalog cluster name, not a file", "field": "cluster"}
    inline = predict(client, cluster_source="mapping", cluster_yaml=f"name: {cluster}\nnum_nodes: 2")
    assert inline.json()["field"] == "cluster_yaml" and "names a file" in inline.json()["error"]


def test_an_inline_cluster_is_predicted_and_its_error_named_beside_it(client):
    cluster = ("name: my-cluster\ngpu: H100-SXM5-80GB\ngpus_per_node: 8\nnum_nodes: 4\n"
               "intra_node: {bandwidth: 450 GB/s}\ninter_node: {bandwidth: 50 GB/s, latency: 5 us}\n")
    answer = predict(client, cluster_source="mapping", cluster_yaml=cluster).json()
    assert answer["prediction"]["num_gpus"] == 32
    bad = predict(client, cluster_source="mapping", cluster_yaml="gpu: H1000\nnum_nodes: 2").json()
    assert bad["field"] == "cluster_yaml" and "unknown GPU 'H1000'" in bad["error"]


def test_a_searched_plan_opens_on_the_predict_page_as_the_same_prediction(client):
    started = client.post("/api/search", json={"model": "llama-3-8b", "cluster_source": "gpu", "gpu": "A100-SXM4-80GB",
                                               "num_nodes": "2", "global_batch_size": "64", "tp": "1,2"},
                          headers=POST).json()
    while client.get(f"/api/search/{started['id']}").json()["state"] == "running":
        time.sleep(0.1)
    plan = client.post(f"/api/search/{started['id']}/plans/0", headers=POST).json()
    again = client.post("/api/predict", json=plan["fields"], headers=POST).json()
    named = {**plan["prediction"], "job": again["prediction"]["job"]}  # (the page's job is named by the form)
    assert again["prediction"] == named


def test_the_host_check_reads_ipv6_hosts_with_their_port(client):
    for host in ("[::1]:8000", "[::1]", "127.0.0.1:8000", "localhost", "LOCALHOST:80"):
        assert client.get("/static/style.css", headers={"host": host}).status_code == 200, host
    for host in ("[::2]:8000", "::1", "localhost.attacker.example", "127.0.0.1.nip.io:8000", "[::1]:x", ""):
        assert client.get("/static/style.css", headers={"host": host}).status_code == 400, host


def test_every_answer_carries_the_security_headers(client):
    headers = client.get("/").headers
    assert headers["content-security-policy"].startswith("default-src 'self'")
    assert headers["x-content-type-options"] == "nosniff"


def test_a_post_without_the_pages_header_or_to_another_host_name_is_refused(client):
    assert client.post("/api/predict", json=FORM).status_code == 403
    assert client.get("/", headers={"host": "attacker.example"}).status_code == 400


def test_a_search_reports_progress_ranks_plans_and_predicts_a_clicked_one(client):
    started = client.post("/api/search", json={"model": "llama-3-8b", "cluster": "aws-p5.48xlarge", "num_nodes": "1",
                                               "global_batch_size": "64", "tp": "1,2", "pp": "1,2"},
                          headers=POST).json()
    for _ in range(600):
        status = client.get(f"/api/search/{started['id']}").json()
        if status["state"] != "running":
            break
        time.sleep(0.1)
    assert status["state"] == "done" and 0 < len(status["result"]["plans"]) <= 10
    cli = cli_json("search", "--model", "llama-3-8b", "--cluster", "aws-p5.48xlarge", "--num-nodes", "1",
                   "--global-batch-size", "64", "--tp", "1,2", "--pp", "1,2")
    assert status["result"]["plans"] == cli["plans"] and status["result"]["interval"] == cli["interval"]
    assert "80 %" in status["shown"]["plans"]["header"]  # the CLI's interval column
    assert client.get(status["pareto_picture"]).content.startswith(b"\x89PNG")
    best = client.post(f"/api/search/{started['id']}/plans/0", headers=POST).json()
    assert best["prediction"]["iteration_s"] == pytest.approx(status["result"]["plans"][0]["iteration_s"])


def test_a_cancelled_search_stops_before_its_end(client):
    started = client.post("/api/search", json={"model": "llama-3-70b", "cluster": "aws-p5.48xlarge",
                                               "sizes": "4,8,16,32,64", "space": "full"}, headers=POST).json()
    assert client.post(f"/api/search/{started['id']}/cancel", headers=POST).status_code == 200
    for _ in range(600):
        status = client.get(f"/api/search/{started['id']}").json()
        if status["state"] != "running":
            break
        time.sleep(0.1)
    assert status["state"] == "cancelled" and status["done"] < 1


def test_two_predictions_compare_as_paraplan_compare_does_with_their_intervals(client):
    a, b = predict(client).json()["key"], predict(client, tp="4").json()["key"]
    answer = client.post("/api/compare", json={"a": a, "b": b}, headers=POST).json()
    assert answer["comparison"] == cli_json("compare", "--pp", "2", "--vs", "tp=4")
    lines = [block.get("line", "") for block in answer["shown"]]
    assert any(line.startswith("difference:") for line in lines)


def finished(client, key):
    for _ in range(1200):
        status = client.get(f"/api/search/{key}").json()
        if status["state"] != "running":
            return status
        time.sleep(0.05)
    raise AssertionError("the search did not finish")


def test_a_search_runs_on_a_cluster_typed_inline_and_names_its_error_there(client):
    cluster = ("name: my-cluster\ngpu: H100-SXM5-80GB\ngpus_per_node: 8\nnum_nodes: 2\n"
               "intra_node: {bandwidth: 450 GB/s}\ninter_node: {bandwidth: 50 GB/s, latency: 5 us}\n")
    started = client.post("/api/search", json={"model": "llama-3-8b", "cluster_source": "mapping",
                                               "cluster_yaml": cluster, "global_batch_size": "64", "tp": "1,2"},
                          headers=POST).json()
    status = finished(client, started["id"])
    assert status["state"] == "done", status
    assert {(p["cluster"], p["num_gpus"]) for p in status["result"]["plans"]} == {("my-cluster", 16)}
    bad = client.post("/api/search", json={"cluster_source": "mapping", "cluster_yaml": "gpu: H1000\nnum_nodes: 2"},
                      headers=POST).json()
    assert bad["field"] == "cluster_yaml" and "H1000" in bad["error"]
    tagged = client.post("/api/search", json={"cluster_source": "mapping", "cluster_yaml": "a: !!python/name:os.system"},
                         headers=POST).json()
    assert tagged["field"] == "cluster_yaml" and "tag" in tagged["error"]


def test_a_search_moves_its_progress_during_the_screen_stage(client):
    started = client.post("/api/search", json={"model": "llama-3-70b", "cluster": "aws-p5.48xlarge",
                                               "sizes": "8,16,32,64", "space": "full"}, headers=POST).json()
    seen = []
    try:
        for _ in range(400):
            status = client.get(f"/api/search/{started['id']}").json()
            if status["state"] != "running" or status["stage"] != "screen":
                break
            seen.append(status["done"])
            time.sleep(0.02)
    finally:
        client.post(f"/api/search/{started['id']}/cancel", headers=POST)
    assert len(seen) >= 2 and seen[-1] > seen[0] > 0  # it moved before any plan was predicted exactly


def test_a_picture_of_the_same_plan_is_drawn_once(client, monkeypatch):
    import paraplan.report.plots as plots

    drawn = []
    draw = plots.render_png
    monkeypatch.setattr(plots, "render_png", lambda *a, **k: drawn.append(a[1]) or draw(*a, **k))
    first = predict(client, tp="8", pp="1").json()
    again = predict(client, tp="8", pp="1").json()
    assert first["key"] == again["key"]  # the same plan, the same prediction: one key
    for answer in (first, again):
        assert client.get(answer["pictures"]["memory"]).content.startswith(b"\x89PNG")
    assert drawn == ["memory"]
    other = predict(client, tp="8", pp="1", interval="0.5").json()  # another interval: another picture
    assert other["key"] != first["key"]


def test_a_search_bad_list_names_its_field(client):
    answer = client.post("/api/search", json={"tp": "1,x"}, headers=POST)
    assert answer.status_code == 400 and answer.json()["field"] == "tp"


def test_a_search_runs_on_an_uploaded_hugging_face_config(client):
    upload = client.post("/api/upload?name=config.json", content=HF_CONFIG, headers=POST).json()
    started = client.post("/api/search", json={"model_source": "hf", "hf_config": upload["id"], "seq_length": "4096",
                                               "cluster": "aws-p5.48xlarge", "num_nodes": "1",
                                               "global_batch_size": "64", "tp": "2"}, headers=POST).json()
    while (status := client.get(f"/api/search/{started['id']}").json())["state"] == "running":
        time.sleep(0.1)
    assert status["state"] == "done" and status["result"]["plans"][0]["tp"] == 2
