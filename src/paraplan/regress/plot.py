"""Learning-curve plot: held-out error against training samples, one line per regressor."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from paraplan.specs import ConfigError

Curve = Sequence[tuple[float, int, float]]
#: The formats :func:`plot_learning_curves` writes, by file suffix.
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def check_plot_path(path: str | os.PathLike[str], *, overwrite: bool = False, flag: str = "--force") -> None:
    """Raise a one-line ConfigError unless a plot can be written to ``path``: a .png, .svg or
    .pdf name in an existing folder, not a folder, and not an existing file unless
    ``overwrite`` (``flag`` names the option that allows replacing it)."""
    from paraplan.regress.store import check_output_path

    if Path(path).suffix.lower() not in PLOT_SUFFIXES:
        raise ConfigError(f"{path}: a plot file name ends in {', '.join(PLOT_SUFFIXES)}")
    check_output_path(path, overwrite=overwrite, flag=flag, what="plot file")


def load_pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display); a missing matplotlib is a
    one-line ConfigError naming the extra that installs it."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("pictures need matplotlib: pip install 'paraplan[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_learning_curves(
    rows: Mapping[str, Curve] | Curve, path: str | os.PathLike[str], title: str | None = None
) -> Path:
    """Write a PNG/SVG/PDF (by suffix) of :func:`~paraplan.regress.select.learning_curve` rows.

    ``rows`` is one curve, or a mapping from regressor key to its curve. The x axis is the
    number of training samples (log scale), the y axis the held-out error on time in percent.
    An existing file at ``path`` is replaced; any other unusable path is a one-line ConfigError
    (see :func:`check_plot_path`).
    """
    check_plot_path(path, overwrite=True)
    plt = load_pyplot()

    curves: Mapping[str, Curve] = rows if isinstance(rows, Mapping) else {"": rows}
    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    try:
        for key, curve in curves.items():
            if not curve:
                continue
            n = [row[1] for row in curve]
            err = [100.0 * row[2] for row in curve]
            ax.plot(n, err, marker="o", linewidth=1.2, markersize=3, label=key or None)
        ax.set_xscale("log")
        ax.set_xlabel("training samples")
        ax.set_ylabel("held-out error on time (%)")
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(title or "Learning curves: error on the 20 % hold-out")
        if any(curves):
            ax.legend(fontsize="x-small", ncol=2 if len(curves) > 12 else 1, loc="upper right")
        out = Path(path)
        fig.savefig(out, dpi=120)
    finally:
        plt.close(fig)
    return out
