"""An optional module that is missing ends a command with one line naming the extra."""

from __future__ import annotations

from pathlib import Path

import pytest

from paraplan.specs.extras import EXTRA_OF_MODULE, missing_extra_message

ROOT = Path(__file__).resolve().parents[2]


def _extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_every_extra_the_table_names_is_one_pyproject_declares():
    assert set(EXTRA_OF_MODULE.values()) <= set(_extras())


#: The distribution that installs a module whose import name is not its own; jaxlib comes with jax.
_DISTRIBUTION = {"sklearn": ("scikit-learn",), "xgboost": ("xgboost-cpu", "xgboost"), "jaxlib": ("jax",)}


def test_the_extra_each_optional_module_names_installs_it():
    import re

    extras = _extras()
    wrong = []
    for module, extra in EXTRA_OF_MODULE.items():
        installed = {re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower() for requirement in extras[extra]}
        if not installed & set(_DISTRIBUTION.get(module, (module,))):
            wrong.append(f"{module}: '{extra}' installs {sorted(installed)}")
    assert wrong == []


def test_no_optional_module_is_a_core_dependency():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")
    core = " ".join(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]).lower()
    assert [m for m in EXTRA_OF_MODULE if m in core] == []


def test_a_missing_optional_module_names_its_extra():
    exc = ModuleNotFoundError("No module named 'sklearn'", name="sklearn")
    message = missing_extra_message(exc)
    assert message is not None and "paraplan[learned]" in message and "\n" not in message


def test_a_missing_submodule_counts_as_its_package():
    exc = ModuleNotFoundError("No module named 'matplotlib.pyplot'", name="matplotlib.pyplot")
    assert "paraplan[plot]" in (missing_extra_message(exc) or "")


def test_a_missing_module_no_extra_installs_is_a_bug_not_an_extra():
    assert missing_extra_message(ModuleNotFoundError("x", name="paraplan_nonexistent")) is None


def test_the_cli_turns_a_missing_extra_into_exit_2(monkeypatch, capsys):
    from paraplan.cli import common

    with pytest.raises(Exception) as info, common.user_errors():
        raise ModuleNotFoundError("No module named 'ray'", name="ray")
    assert getattr(info.value, "exit_code", None) == 2
