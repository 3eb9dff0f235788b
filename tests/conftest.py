"""Shared fixtures: the path of ../shared/data (tests that need it skip cleanly when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def gpumodeling_dir() -> Path:
    path = SHARED_DATA / "gpumodeling"
    if not (path / "runs_perlmutter.json").exists():
        pytest.skip("../shared/data/gpumodeling is not present")
    return path


@pytest.fixture(scope="session")
def published_dir() -> Path:
    path = SHARED_DATA / "published"
    if not (path / "runs_dev.json").exists():
        pytest.skip("../shared/data/published is not present")
    return path
