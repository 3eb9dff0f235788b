"""Every command the README and the documentation pages show runs as written.

The shell (``bash``) blocks of README.md and of every docs/*.md page are read at test time:
each block's ``paraplan`` commands run in order (a later command may read what an earlier one
wrote), in a scratch directory laid out like a checkout (``examples/``, ``benchmarks/`` and
``tests/`` beside it, an empty ``docs/`` for what a command writes there, ``../shared`` when it
exists), and each must exit with 0. The ``python`` blocks run too. Blocks fenced ``sh`` or
``text`` are shown, not run. Blocks that read ``../shared`` skip cleanly without it; blocks
with a command that takes long (fitting, profiling, recording a trace, planning a sharding
and compiling it, starting worker processes, drawing pictures, searching the whole space) are
marked slow, and so are blocks of more than four commands and blocks that search, validate or
calibrate (2-10 s each): the fast tier runs the quick start and the short predict, compare and
export blocks.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHARED = ROOT.parent / "shared"
#: Commands that take more than a few seconds here (measured 2026-11-26 on a shared 2-core
#: machine: profile ops on the tiny grid 30 s, fit --quick 13 s, a sharding plan compiled 33 s,
#: trace record ~15 s; a search, a validation, a calibration or a report 2-10 s).
_SLOW = ("paraplan fit ", "paraplan profile ", "paraplan sharding ", "paraplan trace record ", "paraplan search ",
         "paraplan report ", "paraplan validate ", "paraplan calibrate ")
#: Searches fanned out to worker processes or Ray start those first (10-15 s here); pictures
#: import matplotlib and draw (a report 5 s), the whole search space takes seconds per search.
_SLOW_FLAGS = ("--executor", "--plot", "--pareto", "--space full")
#: Python blocks that plan a sharding (JAX compiles the step) are slow too.
_SLOW_PYTHON = ("paraplan.sharding",)
_FAST_COMMANDS = 4  # a block of more commands is slow (each starts a process: ~1 s)


def _blocks(page: Path, language: str) -> list[tuple[int, str]]:
    text = page.read_text()
    out = []
    for m in re.finditer(rf"^```{language}\n(.*?)^```", text, re.S | re.M):
        out.append((text[: m.start()].count("\n") + 1, m.group(1)))
    return out


def _where(page: Path, line: int) -> str:
    return f"{page.relative_to(ROOT)}:{line}"


def _commands(block: str) -> list[str]:
    """The block's ``paraplan`` commands, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    commands = []
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith("pip install") and "&& " in line:
            line = line.split("&& ", 1)[1]  # the install is CI's job; what follows it runs
        if not line.startswith("paraplan "):
            continue
        words = shlex.split(line, comments=True)
        commands.append(shlex.join(words[:-2]) + f" > {words[-1]}" if ">" in words else shlex.join(words))
    return commands


def _shell_blocks() -> list:
    params = []
    for page in PAGES:
        for line, block in _blocks(page, "bash"):
            commands = _commands(block)
            if not commands:
                continue
            slow = len(commands) > _FAST_COMMANDS or any(
                c.startswith(_SLOW) or any(f in c for f in _SLOW_FLAGS) for c in commands)
            marks = [pytest.mark.slow] if slow else []
            params.append(pytest.param(commands, id=_where(page, line), marks=marks))
    return params


def _python_blocks() -> list:
    params = []
    for page in PAGES:
        for line, code in _blocks(page, "python"):
            marks = [pytest.mark.slow] if any(s in code for s in _SLOW_PYTHON) else []
            params.append(pytest.param(_where(page, line), code, id=_where(page, line), marks=marks))
    return params


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A scratch directory that looks like a checkout: examples, the benchmarks' data and the
    test fixtures beside it, an empty docs folder, ../shared above."""
    work = tmp_path / "repo"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    (work / "benchmarks").symlink_to(ROOT / "benchmarks")
    (work / "tests").symlink_to(ROOT / "tests")
    (work / "docs").mkdir()  # a command that writes into docs/ writes here, never into the checkout
    if SHARED.is_dir():
        (tmp_path / "shared").symlink_to(SHARED)
    return work


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_the_readme_and_the_docs_show_commands_to_check():
    readme = [p for p in _shell_blocks() if p.id.startswith("README.md:")]
    assert len(readme) >= 3
    assert sum(len(p.values[0]) for p in readme) >= 12
    assert len(_shell_blocks()) >= 20
    assert sum(len(p.values[0]) for p in _shell_blocks()) >= 70


def test_the_readme_quick_start_needs_nothing_beside_the_checkout():
    first = _blocks(ROOT / "README.md", "bash")[0][1]
    assert "pip install -e . && paraplan predict" in first
    assert 'pip install -e ".[dev]" && python -m pytest' in first
    assert "../shared" not in first


@pytest.mark.parametrize("commands", _shell_blocks())
def test_every_documented_command_runs_as_written(commands, checkout):
    if any("../shared" in c for c in commands) and not SHARED.is_dir():
        pytest.skip("reads ../shared/data, absent here")
    for command in commands:
        done = _run(command, checkout)
        assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"


@pytest.mark.parametrize(("where", "code"), _python_blocks())
def test_every_documented_python_block_runs(where, code, checkout):
    if "../shared" in code and not SHARED.is_dir():
        pytest.skip("reads ../shared/data, absent here")
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=checkout, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert done.returncode == 0, f"{where}:\n{done.stderr[-2000:]}"
