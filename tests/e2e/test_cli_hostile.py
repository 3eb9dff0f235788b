"""Hostile input through the command line: one line on stderr naming the flag or field, exit
code 2, no traceback, and checked before the work starts (issue 15 parts 1, 4, 5)."""

import pytest
from typer.testing import CliRunner

from paraplan.cli.app import app
from timing import assert_no_slower

runner = CliRunner()
# a small search: one plan family, so a check that comes after the work still fails fast
SEARCH = ["search", "--model", "gpt2", "--cluster", "dgx-a100", "--tp", "1", "--pp", "1", "--mbs", "1",
          "--zero", "0", "--recompute", "none"]


def refused(*args: str, flag: str) -> str:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    assert result.exit_code == 2, (result.exit_code, result.output[-600:], result.exception)
    message = result.stderr.strip()
    assert "\n" not in message and len(message) < 300, message[:400]
    assert message.startswith(f"error: {flag}"), message
    return message


def test_an_alias_bomb_job_file_is_refused_quickly_by_the_cli(tmp_path):
    names = "abcdefghi"
    parts = ["&a [x,x,x,x,x,x,x,x,x]"] + [f"&{names[i]} [" + ",".join([f"*{names[i - 1]}"] * 9) + "]" for i in range(1, 9)]
    job = tmp_path / "job.yaml"
    job.write_text(f"model: gpt2\ncluster: dgx-a100\nparallel:\n  tp: [{', '.join(parts)}]\n", encoding="utf-8")
    message = refused("predict", str(job), flag=str(job))
    assert "alias" in message
    # quickly: no slower than refusing tp: [x, x] (expanding the bomb's 387 million values takes minutes)
    sane = tmp_path / "sane.yaml"
    sane.write_text("model: gpt2\ncluster: dgx-a100\nparallel:\n  tp: [x, x]\n", encoding="utf-8")
    assert_no_slower(lambda: refused("predict", str(job), flag=str(job)),
                     lambda: refused("predict", str(sane), flag="parallel"), factor=10)


@pytest.mark.parametrize("cluster", ["3", "[a, b]"])
def test_export_of_a_cluster_that_is_not_a_name_or_mapping_exits_2(tmp_path, cluster):
    job = tmp_path / "job.yaml"
    job.write_text(f"model: gpt2\ncluster: {cluster}\n", encoding="utf-8")
    refused("export", "megatron", str(job), flag="cluster: expected")


def test_a_deeply_nested_job_file_exits_2(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model: gpt2\ncluster: dgx-a100\nname: " + "[" * 2000 + "]" * 2000 + "\n", encoding="utf-8")
    assert "nested" in refused("predict", str(job), flag=str(job))


@pytest.mark.parametrize(("name", "reason"), [("p.txt", "ends in"), ("nodir/p.png", "does not exist")])
def test_a_pareto_file_that_cannot_be_written_is_refused_before_the_search(tmp_path, name, reason):
    path = tmp_path / name
    message = refused(*SEARCH, "--pareto", str(path), flag="--pareto")
    assert reason in message and str(path) in message


def test_a_save_best_file_in_a_missing_folder_is_refused_before_the_search(tmp_path):
    refused(*SEARCH, "--save-best", str(tmp_path / "nodir" / "best.yaml"), flag="--save-best")


@pytest.mark.parametrize(("args", "flag", "shown"), [
    (("--top", "-1"), "--top", "-1"),
    (("--top", "0"), "--top", "0"),
    (("--num-gpus", "-8"), "--num-gpus", "-8"),
    (("--num-gpus", "0"), "--num-gpus", "0"),
    (("--num-nodes", "0"), "--num-nodes", "0"),
    (("--price-per-gpu-hour", "2 USD", "--train-tokens", "1B", "--budget", "-5 USD"), "--budget", "-5 USD"),
    (("--train-tokens", "1B", "--deadline", "-1d"), "--deadline", "-1d"),
    (("--global-batch-size", "0"), "--global-batch-size", "0"),
    (("--tp", ""), "--tp", "''"),
])
def test_a_search_bound_names_the_flag_and_the_users_value(args, flag, shown):
    message = refused(*SEARCH, *args, flag=flag)
    assert shown in message


def test_a_job_files_zero_global_batch_size_is_refused_by_search(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model: gpt2\ncluster: dgx-a100\nparallel: {global_batch_size: 0}\n", encoding="utf-8")
    message = refused("search", str(job), *SEARCH[5:], flag="parallel.global_batch_size")
    assert "0" in message


@pytest.mark.parametrize(("args", "flag"), [
    (("--global-batch-size", "0"), "parallel.global_batch_size"),
    (("--tp", "0"), "parallel.tensor_model_parallel_size"),
    (("--num-nodes", "-1"), "cluster.num_nodes"),
])
def test_a_predict_bound_names_the_field_and_the_users_value(args, flag):
    message = refused("predict", *args, flag=flag)
    assert args[1] in message


@pytest.mark.parametrize(("text", "flag"), [
    ("parallel: {tp: true}", "parallel.tensor_model_parallel_size"),
    ("parallel: {tp: '2'}", "parallel.tensor_model_parallel_size"),
    ("parallel:\n  tp: 2\n  tp: 4", "job.yaml"),
])
def test_a_coerced_or_repeated_value_in_a_job_file_is_refused(tmp_path, text, flag):
    job = tmp_path / "job.yaml"
    job.write_text(f"model: gpt2\ncluster: dgx-a100\n{text}\n", encoding="utf-8")
    refused("predict", str(job), flag=flag if flag != "job.yaml" else str(job))
