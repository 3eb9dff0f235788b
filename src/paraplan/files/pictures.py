"""Pictures: the check before one is drawn (its name, its folder, matplotlib) and matplotlib's
pyplot, loaded only when a picture is checked or drawn."""

from __future__ import annotations

import os
from pathlib import Path

from paraplan.specs import ConfigError

#: The picture formats written, by file suffix.
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def check_plot_path(path: str | os.PathLike[str], *, overwrite: bool = False, flag: str = "--force") -> None:
    """Raise a one-line ConfigError unless a plot can be written to ``path``: a .png, .svg or
    .pdf name in an existing folder, not a folder, and not an existing file unless
    ``overwrite`` (``flag`` names the option that allows replacing it); and matplotlib, which
    draws it, is installed."""
    from paraplan.files.atomic import check_output_path  # secrets and hashlib: only when writing

    if Path(path).suffix.lower() not in PLOT_SUFFIXES:
        raise ConfigError(f"{path}: a plot file name ends in {', '.join(PLOT_SUFFIXES)}")
    check_output_path(path, overwrite=overwrite, flag=flag, what="plot file")
    load_pyplot()


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
