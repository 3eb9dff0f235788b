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
