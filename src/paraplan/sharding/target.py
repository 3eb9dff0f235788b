"""What ``paraplan sharding FILE.py:FUNCTION`` shards: the user's step function and the example
arguments to trace it with, from a Python file or an importable module.

The module provides the arguments through a function (``example_args`` unless named
otherwise) returning ``(params, batch, ...)``; ``--args hidden=1024,num_layers=32`` is passed
to it as keyword arguments, and ``shapes_only`` evaluates it abstractly (``jax.eval_shape``),
so that a model too big for this machine is still analysed (its plan is then compiled, not run).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from paraplan.specs import ConfigError


@dataclass
class Target:
    fn: Any
    module: ModuleType
    name: str  # as the user wrote it


def load_target(spec: str) -> Target:
    """``path/to/file.py:function`` or ``package.module:function``."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ConfigError(f"target: expected FILE.py:FUNCTION or MODULE:FUNCTION, got {spec!r}")
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where)
        if not path.is_file():
            raise ConfigError(f"target: {path} is not a file")
        module_name = f"_paraplan_target_{path.stem}"
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ConfigError(f"target: cannot load {path} as Python")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:  # the user's file: say what it raised, on one line
            raise ConfigError(f"target: {path} failed to load: {type(exc).__name__}: {_first_line(exc)}") from None
    else:
        try:
            module = importlib.import_module(where)
        except Exception as exc:
            raise ConfigError(f"target: cannot import {where!r}: {type(exc).__name__}: {_first_line(exc)}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"target: {where} has no function {name!r}")
    return Target(fn, module, spec)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def parse_kwargs(text: str | None) -> dict[str, Any]:
    """``hidden=1024,num_layers=32`` -> {"hidden": 1024, "num_layers": 32} (values read as YAML)."""
    from paraplan.catalog.userdata import load_yaml

    out: dict[str, Any] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ConfigError(f"args: expected NAME=VALUE pairs separated by commas, got {part.strip()!r}")
        out[key.strip()] = load_yaml(value.strip(), f"args: {key.strip()}")
    return out


def example_args(target: Target, function: str = "example_args", kwargs: dict[str, Any] | None = None,
                 shapes_only: bool = False) -> tuple:
    """The arguments to trace ``target`` with, from the module's ``function``."""
    make = getattr(target.module, function, None)
    if not callable(make):
        raise ConfigError(f"example_args: {target.name.rpartition(':')[0]} has no function {function!r} "
                          "returning (params, batch, ...) to trace the step with")
    kwargs = kwargs or {}
    import inspect

    try:
        inspect.signature(make).bind(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"args: {function}() does not take {sorted(kwargs)} ({exc})") from None
    try:
        if shapes_only:
            import jax

            args = jax.eval_shape(lambda: make(**kwargs))
        else:
            args = make(**kwargs)
    except Exception as exc:
        raise ConfigError(f"example_args: {function}() raised {type(exc).__name__}: {_first_line(exc)}") from None
    if not isinstance(args, (tuple, list)) or len(args) < 2:
        raise ConfigError(f"example_args: {function}() must return (params, batch, ...), got {type(args).__name__}")
    return tuple(args)


def parse_mesh(text: str) -> tuple[tuple[str, int], ...]:
    """``data=2,model=4`` -> (("data", 2), ("model", 4)), outermost axis first."""
    axes = []
    for part in text.split(","):
        name, sep, size = part.strip().partition("=")
        if not sep or not name.isidentifier() or not size.strip().isdigit() or int(size) < 1:
            raise ConfigError(f"mesh: expected NAME=SIZE pairs like data=2,model=4, got {part.strip()!r}")
        if name in (a for a, _ in axes):
            raise ConfigError(f"mesh: axis {name!r} is named twice")
        axes.append((name, int(size)))
    return tuple(axes)
