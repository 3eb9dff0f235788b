"""Tables of fitted regressors and learning curves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Group
from rich.text import Text

from paraplan.report.layout import ReadableTable


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


def _by_group(keys: list[str]) -> dict[str, list[tuple[str, str]]]:
    """Regressor keys by what they share: ``op/GPU/dtype`` or ``collective/cluster`` ->
    [(``operator/direction`` or ``collective/link``, key)]."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for key in keys:
        head, _, tail = key.rpartition("/")
        head, _, name = head.rpartition("/")
        if not head:  # a key of another shape: shown whole
            head, name, tail = "regressors", key, ""
        groups.setdefault(head, []).append((f"{name}/{tail}" if tail else name, key))
    return groups


def render_fit(rows: list[dict[str, Any]], path: Path) -> Group:
    """One table per GPU and precision, and per cluster (the regressor's name is the key with
    the table's title in front: ``op/A100-SXM4-80GB/fp16`` + ``/linear1/fwd``)."""
    by_key = {r["key"]: r for r in rows}
    items: list[Any] = [
        Text(f"Regressors written to {path} (errors: mean |pred - measured| / measured; analytical: "
             "the analytical estimate's hold-out error)", style="bold")
    ]
    for group, members in _by_group(list(by_key)).items():
        table = ReadableTable(f"{group}/...")
        table.add_column("regressor")
        table.add_column("algorithm")
        for col, short in (("samples", None), ("CV error", "CV"), ("hold-out error", "hold-out"),
                           ("analytical", None), ("fit s", None)):
            table.add_column(col, short=short, number=True)
        for name, key in members:
            r = by_key[key]
            table.add_row(
                name,
                r["algorithm"],
                str(r["samples"]),
                f"{100 * r['cv_error']:.1f} %",
                f"{100 * r['holdout_error']:.1f} %",
                f"{100 * r['analytical_holdout_error']:.1f} %",
                f"{r['fit_seconds']:.1f}",
            )
        items.append(table)
    return Group(*items)


def render_learning_curves(curves: dict[str, list[tuple[float, int, float]]]) -> Group:
    """Hold-out error of each regressor trained on a share of its training samples; n is the
    number of training samples at 100 % (the shares take that fraction of them)."""
    fractions = [f for f, _, _ in next(iter(curves.values()))] if curves else []
    items: list[Any] = [
        Text("Learning curves: hold-out error, %, by share of the training samples (n: training samples at 100 %)",
             style="bold")
    ]
    for group, members in _by_group(list(curves)).items():
        table = ReadableTable(f"{group}/...")
        table.add_column("regressor")
        table.add_column("n", number=True)
        for f in fractions:
            table.add_column(f"{100 * f:g} %", number=True)
        for name, key in members:
            curve = curves[key]
            table.add_row(name, str(curve[-1][1]), *(f"{100 * e:.1f}" for _, _, e in curve))
        items.append(table)
    return Group(*items)
