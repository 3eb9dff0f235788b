"""Every command the README shows runs as written.

The shell blocks of README.md are read at test time: each block's ``paraplan`` commands run
in order (a later command may read what an earlier one wrote), in a scratch directory laid
out like a checkout (``examples/`` beside it, ``../shared`` when it exists), and each must
exit with 0. The README's Python blocks run too. Blocks that read ``../shared`` skip cleanly
without it. Blocks of more than four commands, and blocks that run a command of several seconds
(fitting the learned backend takes minutes; a search, a JAX compile, a profile, a recorded
trace, a validation or a report take 2-10 s), are marked slow: the fast tier runs the quick
start and the README's short ``predict`` and ``export`` blocks.
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
README = ROOT / "README.md"
SHARED = ROOT.parent / "shared"
_SLOW = ("paraplan fit ", "paraplan search ", "paraplan sharding ", "paraplan profile ", "paraplan trace record ",
         "paraplan report ", "paraplan validate ", "paraplan calibrate ")
_FAST_COMMANDS = 4  # a block of more commands is slow (each starts a process: ~1 s)


def _blocks(language: str) -> list[tuple[int, str]]:
    text = README.read_text()
    out = []
    for m in re.finditer(rf"```{language}\n(.*?)```", text, re.S):
        out.append((text[: m.start()].count("\n") + 1, m.group(1)))
    return out


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
    for line, block in _blocks("bash"):
        commands = _commands(block)
        if not commands:
            continue
        slow = len(commands) > _FAST_COMMANDS or any(c.startswith(_SLOW) for c in commands)
        marks = [pytest.mark.slow] if slow else []
        params.append(pytest.param(commands, id=f"README line {line}", marks=marks))
    return params


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A scratch directory that looks like a checkout: examples, the benchmarks' data and the
    test fixtures beside it, ../shared above."""
    work = tmp_path / "repo"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    (work / "benchmarks").symlink_to(ROOT / "benchmarks")
    (work / "tests").symlink_to(ROOT / "tests")
    if SHARED.is_dir():
        (tmp_path / "shared").symlink_to(SHARED)
    return work


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_the_readme_shows_commands_to_check():
    assert len(_shell_blocks()) >= 4
    assert sum(len(p.values[0]) for p in _shell_blocks()) >= 15


@pytest.mark.parametrize("commands", _shell_blocks())
def test_every_readme_command_runs_as_written(commands, checkout):
    if any("../shared" in c for c in commands) and not SHARED.is_dir():
        pytest.skip("reads ../shared/data, absent here")
    for command in commands:
        done = _run(command, checkout)
        assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"


@pytest.mark.parametrize(("line", "code"), [
    pytest.param(n, c, id=f"README line {n}", marks=[pytest.mark.slow] if "paraplan.sharding" in c else [])
    for n, c in _blocks("python")
])
def test_every_readme_python_block_runs(line, code, checkout):
    if "../shared" in code and not SHARED.is_dir():
        pytest.skip("reads ../shared/data, absent here")
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=checkout, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert done.returncode == 0, f"README line {line}:\n{done.stderr[-2000:]}"
