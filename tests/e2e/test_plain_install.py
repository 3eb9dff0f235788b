"""The plain install (`pip install -e .`, no extras) runs every core command, and a command that
needs an extra says which one in one line.

A fresh virtual environment (nothing inherited from the one running the tests) is built once for
this module; it takes the core dependencies from the package index, as a new user's would. This
is the check that a module imported by the core CLI but not declared in pyproject.toml's
``dependencies`` can never hide behind a package the ``dev`` extra happens to bring in.
"""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

import pytest

from paraplan.specs.extras import EXTRA_OF_MODULE

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TRACES = ROOT / "tests" / "fixtures" / "traces"

pytestmark = pytest.mark.slow

# prints every command path of the CLI, one a line ("" for the root), from inside the venv
_COMMANDS = """
import typer
from paraplan.cli.app import app
def walk(command, path):
    yield path
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from walk(sub, [*path, name])
for path in walk(typer.main.get_command(app), []):
    print(" ".join(path))
"""

# imports every module of the package; prints "name<TAB>missing-module" for those that need one
_IMPORT_ALL = """
import importlib, pkgutil, paraplan
for info in pkgutil.walk_packages(paraplan.__path__, "paraplan."):
    if info.name.endswith("__main__"):  # runs the command line
        continue
    try:
        importlib.import_module(info.name)
    except ModuleNotFoundError as exc:
        print(f"{info.name}\\t{exc.name}")
"""


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin folder of a fresh venv with `pip install -e .` and nothing else."""
    home = tmp_path_factory.mktemp("plain") / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(home)
    bin_dir = home / ("Scripts" if os.name == "nt" else "bin")
    done = subprocess.run([bin_dir / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           "-e", str(ROOT)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return bin_dir


def _run(bin_dir: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", COLUMNS="100")
    return subprocess.run(list(args), capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def test_the_plain_install_has_no_optional_package(plain: Path):
    found = _run(plain, str(plain / "python"), "-c",
                 "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m)))",
                 *EXTRA_OF_MODULE)
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == [], "the fresh venv should hold only the core dependencies"


def test_the_readme_first_command_predicts_the_demo_job_on_the_plain_install(plain: Path, tmp_path: Path):
    done = _run(plain, str(plain / "paraplan"), "predict", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "iteration time" in done.stdout


def test_every_command_help_runs_on_the_plain_install(plain: Path):
    listed = _run(plain, str(plain / "python"), "-c", _COMMANDS)
    assert listed.returncode == 0, listed.stderr
    paths = [line.split() for line in listed.stdout.splitlines()]
    assert ["predict"] in paths and ["search"] in paths and len(paths) > 10
    for path in paths:
        done = _run(plain, str(plain / "paraplan"), *path, "--help")
        assert done.returncode == 0, f"paraplan {' '.join(path)} --help: {done.stderr[-2000:]}"
        assert "Usage" in done.stdout


#: The only parts of the package that may need an extra to be imported, each with the extra (as
#: pyproject.toml declares it): the learned backend's regressors and samples, the profiler, the tiny
#: GPT that `trace record` trains, and the web page. Every other module is one the core commands may
#: import, so it must import on the plain install.
NEEDS_AN_EXTRA = {
    "paraplan.regress": "learned",
    "paraplan.samples": "learned",
    "paraplan.profile": "learned",
    "paraplan.traces.tinygpt": "profile",
    "paraplan.web": "web",
}


def _part(module: str) -> str | None:
    return next((p for p in NEEDS_AN_EXTRA if module == p or module.startswith(p + ".")), None)


def test_every_module_outside_the_named_optional_parts_imports_on_the_plain_install(plain: Path):
    done = _run(plain, str(plain / "python"), "-c", _IMPORT_ALL)
    assert done.returncode == 0, done.stderr[-3000:]
    failed = dict(line.split("\t") for line in done.stdout.splitlines())
    assert [f"{m} imports {missing}" for m, missing in failed.items() if _part(m) is None] == [], \
        "modules the core commands may import that need a package the plain install lacks"
    assert [f"{m} imports {missing}" for m, missing in failed.items()
            if missing.split(".")[0] not in EXTRA_OF_MODULE] == [], "modules that import a package no extra declares"
    # and the package each part lacks is one its extra installs
    assert {m: EXTRA_OF_MODULE.get(missing.split(".")[0]) for m, missing in failed.items()} == \
        {m: NEEDS_AN_EXTRA[_part(m)] for m in failed}


@pytest.mark.parametrize(
    "args",
    [
        ["predict", str(EXAMPLES / "mistral-7b-one-node.yaml"), "--format", "json"],
        ["predict", "--tp", "8", "--pp", "2", "--explain"],
        ["predict", "--format", "csv"],
        ["compare", str(EXAMPLES / "llama-3-70b-dgx-h100-tp8-pp4.yaml"), "--vs", "tp=4"],
        ["search", "--model", "gpt2-xl", "--gpu", "A100-SXM4-80GB", "--num-nodes", "1", "--top", "3"],
        ["export", "megatron", str(EXAMPLES / "llama-3-70b-dgx-h100-tp8-pp4.yaml")],
        ["export", "deepspeed", str(EXAMPLES / "llama-3-70b-dgx-h100-tp8-pp4.yaml")],
        ["export", "torchtitan", str(EXAMPLES / "llama-3-70b-dgx-h100-tp8-pp4.yaml")],
        ["export", "slurm", str(EXAMPLES / "llama-3-70b-dgx-h100-tp8-pp4.yaml")],
        ["catalog", "gpus"],
        ["validate", "runs", str(ROOT / "benchmarks" / "data" / "runs_moe_dev.json")],
        ["validate", "trace", str(EXAMPLES / "tiny-cpu" / "ddp.yaml"), str(TRACES / "ddp")],
        ["trace", "summarize", str(TRACES / "ddp")],
    ],
    ids=lambda args: " ".join(a for a in args[:2] if "/" not in a),
)
def test_core_commands_answer_on_the_plain_install(plain: Path, tmp_path: Path, args: list[str]):
    done = _run(plain, str(plain / "paraplan"), *args, cwd=tmp_path)
    assert done.returncode == 0, f"paraplan {' '.join(args)}: {done.stderr[-3000:]}"
    assert done.stdout.strip()


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["predict", "--plot", "breakdown.png"], "plot"),
        (["predict", "--backend", "learned", "--models", "models.zip"], "learned"),
        (["fit", str(ROOT), "-o", "models.zip"], "learned"),
        (["profile", "ops", "-o", "samples.parquet"], "learned"),
        (["sharding", str(EXAMPLES / "sharding" / "gpt_block.py")], "sharding"),
        (["serve", "--port", "8765"], "web"),
        (["report", "-o", "report.html"], "plot"),
        (["search", "--model", "gpt2-xl", "--gpu", "A100-SXM4-80GB", "--num-nodes", "1", "--pareto", "p.png"], "plot"),
        (["samples", "import", "gpumodeling", str(ROOT), "--out", "s.parquet"], "learned"),
        (["calibrate", "trace", str(TRACES / "ddp-shapes"), "--job", str(EXAMPLES / "tiny-cpu" / "ddp.yaml"),
          "-o", "c.yaml"], "calibrate"),
        (["inventory", "trace", str(ROOT / "tests" / "fixtures" / "hf" / "gpt2.json")], "hf"),
        (["trace", "record", "--out", "traces"], "profile"),
        (["search", "--model", "gpt2-xl", "--gpu", "A100-SXM4-80GB", "--num-nodes", "1", "--global-batch-size", "64",
          "--clusters", "dgx-a100,dgx-h100", "--executor", "ray"], "ray"),
    ],
    ids=lambda v: " ".join(v[:2]) if isinstance(v, list) else v,
)
def test_a_command_needing_an_extra_names_it_in_one_line(plain: Path, tmp_path: Path, args: list[str], extra: str):
    done = _run(plain, str(plain / "paraplan"), *args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"paraplan[{extra}]" in lines[0] or f".[{extra}]" in lines[0]
    assert "Traceback" not in done.stderr

