"""`paraplan trace record` beyond the defaults: one process, a larger model, timing without the
profiler (what issue 17's closed loop compares predictions with), and the refusals."""

from __future__ import annotations

import json

import pytest

from paraplan.specs import ConfigError
from paraplan.traces.tinyrun import TIMERS_FILE, record_run

pytest.importorskip("torch")


@pytest.mark.slow
def test_one_unprofiled_process_writes_only_its_timers(tmp_path):
    out = record_run("ddp", tmp_path / "one", nproc=1, active=2, profile=False,
                     model={"hidden_size": 32, "num_attention_heads": 2, "seq_length": 16})
    record = json.loads((out / TIMERS_FILE).read_text())
    assert not list(out.glob("rank*.json*"))
    assert record["profile"] is False and "unprofiled" in record["what"]
    assert record["model"]["hidden_size"] == 32 and record["model"]["seq_length"] == 16
    assert [t["step"] for t in record["ranks"]["0"]] == [3, 4]
    assert all(t["seconds"] > 0 for t in record["ranks"]["0"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "pipeline", "nproc": 1}, "a pipeline needs at least 2"),
        ({"nproc": 0}, "needs at least 1"),
        ({"model": {"hidden_size": 65}}, "not a multiple of the 4 heads"),
        ({"model": {"hidden": 64}}, "model.hidden: not a TinyConfig field"),
        ({"model": {"seq_length": 0}}, "model.seq_length: expected a positive integer"),
    ],
)
def test_impossible_runs_are_refused_before_any_process_starts(tmp_path, kwargs, message):
    mode = kwargs.pop("mode", "ddp")
    with pytest.raises(ConfigError, match=message):
        record_run(mode, tmp_path / "x", **kwargs)
    assert not (tmp_path / "x").exists()


def _abort_on_rank_one(rank: int, world: int, meet: str) -> None:
    """What a worker does (faulthandler into the meeting folder, the mode it starts), then the
    native abort gloo raises when a socket fails under it."""
    import faulthandler
    import os
    from pathlib import Path

    fault = open(Path(meet) / f"rank{rank}.fault", "w", buffering=1)  # open until the abort
    faulthandler.enable(fault, all_threads=True)
    fault.write("mode pipeline\n")
    if rank == 1:
        os.abort()


@pytest.mark.slow
def test_a_process_killed_by_a_signal_is_named_with_its_mode_and_python_stack():
    from paraplan.traces.tinyrun import TinyRunCrashed, spawn

    with pytest.raises(TinyRunCrashed) as crash:
        spawn(_abort_on_rank_one, 2)
    assert crash.value.rank == 1 and crash.value.signal_name == "SIGABRT"
    assert "process 1 died of SIGABRT (mode pipeline; at File" in str(crash.value)
    assert "_abort_on_rank_one" in crash.value.fault_log


def test_trace_record_says_a_crashed_process_in_one_line_and_exits_1(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import paraplan.traces.tinyrun as tinyrun
    from paraplan.cli.app import app

    log = "mode fsdp\nFatal Python error: Aborted\n\nCurrent thread 0x1 (most recent call first):\n" \
          '  File "x.py", line 3 in barrier\n'

    def crash(*args, **kwargs):
        raise tinyrun.TinyRunCrashed(1, "SIGABRT", log)

    monkeypatch.setattr(tinyrun, "record_run", crash)
    result = CliRunner().invoke(app, ["trace", "record", "--out", str(tmp_path / "r")])
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        'error: tiny run: process 1 died of SIGABRT (mode fsdp; at File "x.py", line 3 in barrier)']
