"""Issue 15 part 7: a write killed half-way leaves no temporary file behind for good.

Samples and model files are replaced atomically through a hidden temporary file beside them,
named after the writing process; the next write of the same file removes those whose process
is gone and leaves a live writer's alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from paraplan.files.atomic import sweep_stale, temp_path

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def live_pid():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child.pid
    child.kill()
    child.wait()


def _strand(folder, name, pid):
    """The temporary files writers of ``name`` with ``pid`` leave, in every naming paraplan used."""
    paths = [folder / f".{name}.{pid}.1a2b3c4d.tmp", folder / f".{name}.{pid}.tmp"]
    for path in paths:
        path.write_bytes(b"half a file")
    return paths


def test_a_temporary_path_is_hidden_beside_the_target_and_names_this_process(tmp_path):
    path = temp_path(tmp_path / "x.samples")
    assert path.parent == tmp_path and path.name.startswith(f".x.samples.{os.getpid()}.")
    assert path.name.endswith(".tmp") and temp_path(tmp_path / "x.samples") != path


def test_writing_samples_removes_a_dead_writer_s_temp_files_and_keeps_a_live_one(tmp_path, live_pid):
    from test_samples_store import _samples

    from paraplan.samples import load_samples, save_samples

    dead = _strand(tmp_path, "x.samples", _dead_pid())
    live = _strand(tmp_path, "x.samples", live_pid)
    other = _strand(tmp_path, "y.samples", _dead_pid())  # another file's: not this write's business
    save_samples(_samples(), tmp_path / "x.samples")
    assert not any(p.exists() for p in dead)
    assert all(p.exists() for p in live + other)
    assert len(load_samples(tmp_path / "x.samples")) == 3
    assert {p.name for p in tmp_path.iterdir() if p.name.startswith(".x.samples.")} == {p.name for p in live}


def test_writing_a_model_file_removes_a_dead_writer_s_temp_files_and_keeps_a_live_one(tmp_path, live_pid):
    from paraplan.regress.store import save_models

    dead = _strand(tmp_path, "b.models", _dead_pid())
    live = _strand(tmp_path, "b.models", live_pid)
    save_models(tmp_path / "b.models", {}, {"run": 1})
    assert not any(p.exists() for p in dead) and all(p.exists() for p in live)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".b.models.") and p not in live]


def test_an_old_random_named_temp_file_of_an_earlier_version_is_removed_a_recent_one_kept(tmp_path):
    old, recent = tmp_path / ".b.models.k3j_x9az.tmp", tmp_path / ".b.models.q8w2e0rt.tmp"
    for path in (old, recent):
        path.write_bytes(b"27 MB, once")
    two_days_ago = time.time() - 2 * 86400
    os.utime(old, (two_days_ago, two_days_ago))
    assert sweep_stale(tmp_path / "b.models") == [old]
    assert recent.exists() and not old.exists()


def test_files_that_only_look_alike_are_never_removed(tmp_path):
    keep = [tmp_path / ".b.models.notes.tmp", tmp_path / ".b.models.123.txt", tmp_path / "b.models.123.tmp"]
    for path in keep:
        path.write_text("mine")
    assert sweep_stale(tmp_path / "b.models") == []
    assert all(p.exists() for p in keep)
