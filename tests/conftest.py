"""Shared fixtures: the path of ../shared/data (tests that need it skip cleanly when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

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
