"""Bad trace files end with one line naming the file and what is wrong (exit code 2); one bad
rank file among good ones is reported and the others are still summarised; nothing is written
over an existing output without --force."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from paraplan.cli.app import app
from paraplan.traces.decode import decode_trace
from paraplan.traces.reader import TraceFileError
from paraplan.traces.summary import summarize

DDP = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "ddp"
runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, ["trace", *args], env={"COLUMNS": "80"})


def _bad_files(tmp: Path) -> dict[str, tuple[Path, str]]:
    whole = gzip.decompress((DDP / "rank0.json.gz").read_bytes())
    cases = {
        "empty": (b"", "empty file"),
        "truncated gzip": (gzip.compress(whole)[:20000], "truncated or corrupt gzip"),
        "truncated JSON": (whole[: len(whole) // 2], "truncated or malformed JSON"),
        "not a trace": (json.dumps({"loss": [1.0, 0.9]}).encode(), "not a profiler trace"),
        "not JSON": (b"step,loss\n1,0.9\n", "not a JSON trace"),
        "binary": (bytes(range(256)) * 4, "not a JSON trace"),
        "no iterations": (json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 0, "dur": 1}]}).encode(),
                          "no iterations"),
        "no events": (json.dumps({"traceEvents": []}).encode(), "holds no events"),
    }
    out = {}
    for i, (name, (data, reason)) in enumerate(cases.items()):
        path = tmp / f"rank{i}.json"
        path.write_bytes(data)
        out[name] = (path, reason)
    return out


def test_each_kind_of_bad_file_is_named_with_what_is_wrong(tmp_path):
    for name, (path, reason) in _bad_files(tmp_path).items():
        with pytest.raises(TraceFileError) as info:
            decode_trace(path)
        message = str(info.value)
        assert message.startswith(f"{path}: ") and reason in message, name
        assert "\n" not in message


def test_the_command_ends_a_bad_file_with_one_line_and_exit_code_2(tmp_path):
    for path, reason in _bad_files(tmp_path).values():
        result = run("summarize", str(path))
        assert result.exit_code == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and str(path) in lines[0] and reason in lines[0]


def test_one_bad_rank_file_among_good_ones_is_reported_and_the_rest_summarised(tmp_path):
    shutil.copytree(DDP, tmp_path / "run")
    broken = tmp_path / "run" / "rank1.json.gz"
    broken.write_bytes(broken.read_bytes()[:5000])
    summary = summarize([tmp_path / "run"])
    assert [r.rank for r in summary.ranks] == [0]
    assert [(f, why.split(" (")[0]) for f, why in summary.skipped] == [(broken, "truncated or corrupt gzip")]
    result = run("summarize", str(tmp_path / "run"))
    assert result.exit_code == 0
    assert result.stderr.strip().splitlines() == [f"skipped: {broken}: " + summary.skipped[0][1]]
    assert "1 ranks" in result.stdout or "on 1 rank" in result.stdout


def test_files_of_different_runs_are_refused(tmp_path):
    twice = [DDP / "rank0.json.gz", tmp_path / "copy_of_rank0.json.gz"]
    shutil.copy(twice[0], twice[1])
    with pytest.raises(TraceFileError, match="rank 0 again"):
        summarize(twice)
    other = tmp_path / "rank1.json"
    other.write_text(json.dumps({"distributedInfo": {"rank": 1, "world_size": 8}, "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0, "dur": 10, "pid": 1, "tid": 1}]}))
    result = run("summarize", str(DDP / "rank0.json.gz"), str(other))
    assert result.exit_code == 2 and "disagree on the world size" in result.stderr
    later = tmp_path / "rank1b.json"
    later.write_text(json.dumps({"distributedInfo": {"rank": 1, "world_size": 2}, "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#90", "ts": 0, "dur": 10, "pid": 1, "tid": 1}]}))
    with pytest.raises(TraceFileError, match="share no iteration"):
        summarize([DDP / "rank0.json.gz", later])


def test_a_missing_path_or_an_empty_directory_is_one_line(tmp_path):
    for path in (tmp_path / "nowhere", tmp_path):
        result = run("summarize", str(path))
        assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
        assert str(path) in result.stderr


def test_nothing_is_written_over_an_existing_output_without_force(tmp_path):
    target = tmp_path / "measured.json"
    target.write_text("keep me")
    result = run("summarize", str(DDP), "--format", "json", "--output", str(target))
    assert result.exit_code == 2 and "--force" in result.stderr
    assert target.read_text() == "keep me"
    assert run("summarize", str(DDP), "--format", "json", "--output", str(target), "--force").exit_code == 0
    assert json.loads(target.read_text())["iterations"]["count"] == 2
    table = tmp_path / "summary.txt"
    assert run("summarize", str(DDP), "--output", str(table)).exit_code == 0
    assert "Noise:" in table.read_text() and max(map(len, table.read_text().splitlines())) <= 80
    assert sorted(p.name for p in tmp_path.iterdir()) == ["measured.json", "summary.txt"]


def test_the_trace_commands_help_states_the_exit_codes():
    for command in ("summarize", "record"):
        text = " ".join(run(command, "--help").output.split())
        assert "2 bad input" in text and "3 internal error" in text


def test_trace_record_refuses_a_non_empty_directory_without_force(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    result = run("record", "--out", str(tmp_path))
    assert result.exit_code == 2 and "--force" in result.stderr and str(tmp_path) in result.stderr
