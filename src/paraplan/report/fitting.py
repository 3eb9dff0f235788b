"""Tables of fitted regressors and learning curves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table


def fit_rows(models: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "key": key,
            "algorithm": m.algorithm,
            "samples": m.n_samples,
            "cv_error": m.cv_error,
            "holdout_error": m.holdout_error,
            "analytical_holdout_error": m.baseline_holdout_error,
            "fit_seconds": m.fit_seconds,
        }
        for key, m in models.items()
    ]


def render_fit(rows: list[dict[str, Any]], path: Path) -> Group:
    table = Table(title=f"Regressors written to {path} (errors: mean |pred - measured| / measured)", title_justify="left")
    for col in ("regressor", "algorithm", "samples", "CV error", "hold-out error", "analytical", "fit s"):
        table.add_column(col, justify="left" if col in ("regressor", "algorithm") else "right")
    for r in rows:
        table.add_row(
            r["key"],
            r["algorithm"],
            str(r["samples"]),
            f"{100 * r['cv_error']:.1f} %",
            f"{100 * r['holdout_error']:.1f} %",
            f"{100 * r['analytical_holdout_error']:.1f} %",
            f"{r['fit_seconds']:.1f}",
        )
    return Group(table)


def render_learning_curves(curves: dict[str, list[tuple[float, int, float]]]) -> Table:
    fractions = [f for f, _, _ in next(iter(curves.values()))] if curves else []
    table = Table(title="Learning curves: hold-out error by share of the training samples", title_justify="left")
    table.add_column("regressor")
    for f in fractions:
        table.add_column(f"{100 * f:g} %", justify="right")
    for key, curve in curves.items():
        table.add_row(key, *(f"{100 * e:.1f} % (n={n})" for _, n, e in curve))
    return table
