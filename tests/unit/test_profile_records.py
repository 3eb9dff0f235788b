"""The samplers' journal (paraplan.profile.records): appended and synced point by point, a
killed writer's cut line dropped, resumed only by the same sweep, finalized into a samples file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from paraplan.profile.records import RecordStore, journal_path, row_key
from paraplan.samples import load_samples
from paraplan.specs import ConfigError

SRC = Path(__file__).resolve().parents[2] / "src"


def _row(name: str = "linear1", phase: str = "fwd", l: int = 64, time_s: float = 1e-4) -> dict:  # noqa: E741
    return {"kind": "op", "name": name, "variant": "", "phase": phase, "mp": 1, "b": 2, "h": None,
            "l": l, "dim": 64, "vp": None, "encoders": None, "bytes": None, "nodes": None,
            "gpus_per_node": None, "dtype": "fp32", "device": "cpu-core", "cluster": "", "time_s": time_s}


def test_append_done_keys_and_finalize(tmp_path: Path) -> None:
    journal = journal_path(tmp_path / "a.samples")
    assert journal.name == "a.samples.journal"
    with RecordStore(journal, header={"sweep": 1}) as store:
        store.append([_row(), _row(phase="bwd", time_s=2e-4)], key="p1", extra={"spread": 0.01})
        store.append(_row(l=128))
        store.skip("p3", "out of memory")
        assert store.done_keys() == {"p1", row_key(_row(l=128)), "p3"}
        meta = store.finalize(tmp_path / "a.samples", {"importer": "test"})
    assert meta["skipped"] == {"out of memory": 1} and meta["points"] == 3
    frame = load_samples(tmp_path / "a.samples")
    assert list(frame["phase"]) == ["fwd", "bwd", "fwd"]
    assert list(frame["row"]) == [0, 1, 2] and set(frame["source"]) == {"a.samples.journal"}
    assert frame.attrs["samples_metadata"]["importer"] == "test"
    # reopened, the same sweep sees every point; a point is never recorded twice
    with RecordStore(journal, header={"sweep": 1}) as again:
        assert again.done_keys() == {"p1", row_key(_row(l=128)), "p3"}
        assert len(again.rows()) == 3 and again.skipped() == {"out of memory": 1}
        with pytest.raises(ValueError, match="recorded already"):
            again.append(_row(), key="p1")


def test_finalize_never_overwrites(tmp_path: Path) -> None:
    (tmp_path / "a.samples").write_text("x")
    with RecordStore(tmp_path / "j", header={}) as store, pytest.raises(ConfigError, match="exists"):
        store.finalize(tmp_path / "a.samples")


def test_a_cut_last_line_is_dropped(tmp_path: Path) -> None:
    journal = tmp_path / "j"
    with RecordStore(journal, header={"s": 1}) as store:
        store.append(_row(), key="p1")
    with journal.open("ab") as f:
        f.write(b'{"key": "p2", "rows": [{"kind": "o')  # a kill in the middle of a write
    with RecordStore(journal, header={"s": 1}) as store:
        assert store.done_keys() == {"p1"}
        store.append(_row(l=128), key="p2")
    lines = journal.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line) for line in lines)


def test_another_sweeps_journal_is_refused(tmp_path: Path) -> None:
    journal = tmp_path / "j"
    RecordStore(journal, header={"dtype": "fp32"}).close()
    with pytest.raises(ConfigError, match=r"different sweep.*dtype"):
        RecordStore(journal, header={"dtype": "bf16"})
    (tmp_path / "k").write_text("hello\n")
    with pytest.raises(ConfigError, match="not a paraplan journal"):
        RecordStore(tmp_path / "k")


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    with RecordStore(tmp_path / "j") as _, pytest.raises(ConfigError, match="another sampler"):
        RecordStore(tmp_path / "j")


def test_a_killed_writer_loses_nothing_it_reported(tmp_path: Path) -> None:
    """A real process appending as fast as it can, SIGKILLed: every point it announced is in the
    journal, and a restart continues with no duplicate."""
    journal = tmp_path / "j"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(SRC)!r})
        from paraplan.profile.records import RecordStore
        row = {_row()!r}
        with RecordStore({str(journal)!r}, header={{"s": 1}}) as store:
            for i in range(100000):
                if f"p{{i}}" in store.done_keys():
                    continue
                store.append(dict(row, l=i + 1), key=f"p{{i}}")
                print(i, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    announced = -1
    deadline = time.monotonic() + 60
    while announced < 20 and time.monotonic() < deadline:
        announced = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with RecordStore(journal, header={"s": 1}) as store:
        keys = store.done_keys()
        assert {f"p{i}" for i in range(announced + 1)} <= keys
        n = len(keys)
        assert keys == {f"p{i}" for i in range(n)}
        store.append(_row(l=n + 1), key=f"p{n}")
        ls = [r["l"] for r in store.rows()]
    assert ls == list(range(1, n + 2))
