"""Learning-curve plot: held-out error against training samples, one panel per operator or
collective kind, one line per regressor in it."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from paraplan.files.pictures import check_plot_path, load_pyplot

Curve = Sequence[tuple[float, int, float]]


def curve_panels(keys: Sequence[str]) -> dict[str, list[tuple[str, str]]]:
    """Small multiples: the panel title of every regressor key and its line label in it, as
    {title: [(key, label), ...]}. Operator keys (``op/GPU/dtype/name/direction``) share a panel
    per operator name, collective keys (``collective/cluster/kind/intra|inter``) one per kind;
    a label keeps only what tells the panel's lines apart."""
    panels: dict[str, list[tuple[str, list[str]]]] = {}
    for key in keys:
        parts = key.split("/")
        if parts[0] == "op" and len(parts) == 5:
            title, rest = f"{parts[3]}", [parts[1], parts[2], parts[4]]
        elif parts[0] == "collective" and len(parts) == 4:
            title, rest = f"{parts[2]} (collective)", [parts[1], parts[3]]
        else:
            title, rest = key or "learning curve", []
        panels.setdefault(title, []).append((key, rest))
    out = {}
    for title, entries in panels.items():
        varying = [i for i in range(max((len(r) for _, r in entries), default=0))
                   if len({r[i] if i < len(r) else "" for _, r in entries}) > 1]
        out[title] = [(key, " ".join(rest[i] for i in varying if i < len(rest)) or " ".join(rest)) for key, rest in entries]
    return out


def plot_learning_curves(
    rows: Mapping[str, Curve] | Curve, path: str | os.PathLike[str], title: str | None = None
) -> Path:
    """Write a PNG/SVG/PDF (by suffix) of :func:`~paraplan.regress.select.learning_curve` rows.

    ``rows`` is one curve, or a mapping from regressor key to its curve, drawn as small
    multiples: one panel per operator or collective kind (:func:`curve_panels`). The x axis is
    the number of training samples (log scale), the y axis the held-out error on time in percent.
    An existing file at ``path`` is replaced; any other unusable path is a one-line ConfigError
    (see :func:`paraplan.files.pictures.check_plot_path`).
    """
    import math

    check_plot_path(path, overwrite=True)
    plt = load_pyplot()
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    curves: Mapping[str, Curve] = rows if isinstance(rows, Mapping) else {"": rows}
    panels = curve_panels([k for k, c in curves.items() if c]) or {"learning curve": []}
    ncols = min(4, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.7 * ncols + 0.5, 2.7 * nrows + 0.9), layout="constrained",
                             squeeze=False)
    try:
        flat = [ax for row in axes for ax in row]
        for ax, (name, lines) in zip(flat, panels.items(), strict=False):
            for key, label in lines:
                n = [row[1] for row in curves[key]]
                err = [100.0 * row[2] for row in curves[key]]
                ax.plot(n, err, marker="o", linewidth=1.2, markersize=3, label=label)
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())  # 2x10^1, 3x10^1, ... collide
            ax.set_ylim(bottom=0)
            ax.grid(True, which="both", alpha=0.3)
            ax.set_title(name, fontsize="medium")
            ax.tick_params(labelsize="small")
            if any(label for _, label in lines):
                ax.legend(fontsize="x-small", loc="best", ncol=2 if len(lines) > 6 else 1)
        for ax in flat[len(panels):]:
            ax.set_visible(False)
        fig.supxlabel("training samples (log scale)", fontsize="medium")
        fig.supylabel("held-out error on time (%)", fontsize="medium")
        fig.suptitle(title or "Learning curves: error on the 20 % hold-out, one panel per operator", fontsize="large")
        out = Path(path)
        fig.savefig(out, dpi=120)
    finally:
        plt.close(fig)
    return out
