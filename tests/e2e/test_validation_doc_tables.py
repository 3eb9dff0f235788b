"""docs/validation.md's tables are what the benchmark scripts print today.

The page says its tables come from ``benchmarks/validation_report.py`` and
``benchmarks/ablation_published.py``; these tests run both and look for every table row they
print on the page, so a number changed in the code without regenerating the page fails here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "validation.md"


def _rows_missing_from_the_page(script: str, data: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), str(data)],
        capture_output=True, text=True, check=True, timeout=600,
    )
    rows = [line.rstrip() for line in done.stdout.splitlines() if line.startswith("|")]
    assert rows, f"{script} printed no table"
    page = {line.rstrip() for line in PAGE.read_text(encoding="utf-8").splitlines()}
    return [row for row in rows if row not in page]


def test_every_row_the_validation_report_prints_is_on_the_validation_page(published_dir, gpumodeling_dir):
    assert published_dir.parent == gpumodeling_dir.parent
    assert _rows_missing_from_the_page("validation_report.py", published_dir.parent) == []


@pytest.mark.slow
def test_every_row_of_the_ablation_table_is_on_the_validation_page(published_dir):
    assert _rows_missing_from_the_page("ablation_published.py", published_dir.parent) == []
