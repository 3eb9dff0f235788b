"""What the operator and link fits share: error statistics, the hold-out split, group
weights, paths in source strings, and the lazy import of the ``calibrate`` extra."""

from __future__ import annotations

import dataclasses
import importlib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

from paraplan.specs import ConfigError

US = 1e-6
#: The command a fitted source string names.
COMMAND = "paraplan calibrate"
#: The repository root when paraplan runs from its source tree (src/paraplan/calibrate/..).
REPO = Path(__file__).resolve().parents[3]
EXTRA_HINT = 'pip install -e ".[calibrate]"'


def silent(_: str) -> None:
    """The default ``log``: library code never prints."""


def import_extra(name: str) -> ModuleType:
    """``importlib.import_module(name)`` for scipy / pandas; a one-line ConfigError naming the
    ``calibrate`` extra when it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ConfigError(f"calibrate: needs scipy and pandas ({exc}); {EXTRA_HINT}") from None


def check_dependencies() -> None:
    """A one-line ConfigError unless scipy and pandas (the ``calibrate`` extra) import."""
    for name in ("pandas", "scipy.optimize", "scipy.sparse"):
        import_extra(name)


def rel_path(path: Path) -> str:
    """``path`` relative to the repository's parent (``shared/data/...``) when possible."""
    path = Path(path).resolve()
    for base in (REPO, REPO.parent):
        try:
            return str(path.relative_to(base))
        except ValueError:
            continue
    return str(path)


@dataclasses.dataclass(frozen=True)
class ErrorStats:
    """Errors of predictions against measurements, err = predicted/measured - 1, in %."""

    median_abs: float
    mean_abs: float
    median: float


def err_stats(pred: np.ndarray, meas: np.ndarray) -> ErrorStats:
    """(median |err| %, mean |err| %, median signed err %) with err = pred/measured - 1."""
    err = pred / meas - 1.0
    return ErrorStats(
        float(np.median(np.abs(err)) * 100),
        float(np.mean(np.abs(err)) * 100),
        float(np.median(err) * 100),
    )


def split_mask(keys: Sequence[object], fraction: float, seed: int) -> np.ndarray:
    """True for hold-out samples: a random ``fraction`` of the distinct ``keys`` (a repeated
    grid point, or the fwd and bwd of one row, stay on the same side)."""
    uniq = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    draw = np.random.default_rng(seed).random(len(uniq)) < fraction
    return np.array([draw[uniq[k]] for k in keys], dtype=bool)


def group_weights(groups: Sequence[object]) -> np.ndarray:
    """1/sqrt(n) per sample of a group of n, so every group weighs the same in the loss."""
    groups = list(groups)
    counts = Counter(groups)
    return 1.0 / np.sqrt(np.array([counts[g] for g in groups], dtype=float))


def check_fit_options(seed: int, holdout: float, loss: str) -> None:
    """The options both fits share; a one-line ConfigError naming the bad one."""
    if not 0.0 < holdout < 1.0:
        raise ConfigError(f"holdout: expected a fraction between 0 and 1 (got {holdout:g})")
    if loss not in LOSSES:
        raise ConfigError(f"loss: expected one of {', '.join(LOSSES)} (got {loss!r})")
    if seed < 0:
        raise ConfigError(f"seed: expected a non-negative integer (got {seed})")


#: ``scipy.optimize.least_squares`` losses on the log errors (linear = plain least squares).
LOSSES = ("linear", "soft_l1", "huber", "cauchy")
