"""Shared fixtures: the path of ../shared/data (tests that need it skip cleanly when absent), a
terminal of 80 columns whatever the shell's, and no hypothesis deadline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# The shell's terminal must not reach the tests. rich fixes a Console's width when COLUMNS is set
# as the Console is made (paraplan.cli.common makes its consoles at import), and otherwise reads
# COLUMNS, then the terminal, at each print: so COLUMNS is removed here, before any test module
# imports paraplan.cli, and set to 80 for each test (a test that wants another width passes its
# own COLUMNS to CliRunner or the child process). FORCE_COLOR and NO_COLOR would change the text.
for _name in ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
    os.environ.pop(_name, None)

# A property test's examples take what the machine gives them: a per-example deadline fails
# tests on a loaded machine (tests that set their own settings keep them).
settings.register_profile("paraplan", deadline=None)
settings.load_profile("paraplan")


@pytest.fixture(autouse=True)
def _terminal_of_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def _shared(folder: str, probe: str) -> Path:
    """``../shared/data/<folder>``, or a skip when its ``probe`` file is absent."""
    path = SHARED_DATA / folder
    if not (path / probe).exists():
        pytest.skip(f"../shared/data/{folder} is not present")
    return path


@pytest.fixture(scope="session")
def gpumodeling_dir() -> Path:
    return _shared("gpumodeling", "runs_perlmutter.json")


@pytest.fixture(scope="session")
def published_dir() -> Path:
    return _shared("published", "runs_dev.json")


@pytest.fixture(scope="session")
def xla_tables_dir() -> Path:
    return _shared("xla_perf_tables", "matmul.csv")


@pytest.fixture
def hf_trace_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A trace cache of the test session's own (``PARAPLAN_CACHE_DIR``), shared by its tests."""
    path = tmp_path_factory.getbasetemp() / "hfcache"
    monkeypatch.setenv("PARAPLAN_CACHE_DIR", str(path))
    return path
