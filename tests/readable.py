"""One check for every table a person reads (issue 14): rendered at 80 and at 200 columns,
nothing is cut to "…", no line is wider than the terminal, and every number the table model
holds appears whole in what is printed.

    from readable import WIDTHS, assert_readable, assert_readable_text
    assert_readable(render_catalog("gpus", rows))              # a renderable, every width
    assert_readable_text(result.output, 80, numbers=[...])     # what a command printed
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable

from rich.cells import cell_len
from rich.console import Console, Group
from rich.table import Table

from paraplan.report.layout import ReadableTable

WIDTHS = (80, 200)


def render(renderable, width: int) -> str:
    """The text a terminal of ``width`` columns shows."""
    console = Console(width=width, file=io.StringIO(), color_system=None, soft_wrap=False, record=True)
    console.print(renderable)
    return console.export_text()


def numbers_of(renderable) -> list[str]:
    """The number cells of every table in ``renderable``: a ReadableTable's number columns, a
    rich Table's right-aligned columns."""
    if isinstance(renderable, ReadableTable):
        return renderable.number_cells()
    if isinstance(renderable, Group):
        return [n for part in renderable.renderables for n in numbers_of(part)]
    if isinstance(renderable, Table):
        cells = []
        for column in renderable.columns:
            if column.justify == "right":
                cells += [str(getattr(c, "plain", c)) for c in column._cells]
        return [c for c in cells if c.strip() not in ("", "-")]
    return []


def _whole(number: str, text: str) -> bool:
    """``number`` appears in ``text``, and not as a piece of a longer number."""
    return re.search(rf"(?<![\w.,]){re.escape(number)}(?![\w.,])", text) is not None


def assert_readable_text(text: str, width: int, numbers: Iterable[str] = ()) -> None:
    assert "…" not in text, f"cut to '…' at {width} columns:\n{text}"
    wide = [line for line in text.splitlines() if cell_len(line.rstrip()) > width]
    assert not wide, f"lines wider than {width} columns: {wide}"
    missing = sorted({n for n in numbers if not _whole(n, text)})
    assert not missing, f"numbers not shown whole at {width} columns: {missing}\n{text}"


def assert_readable(renderable, numbers: Iterable[str] | None = None, widths: Iterable[int] = WIDTHS) -> dict[int, str]:
    """Render at each width and check it; returns the texts by width."""
    numbers = numbers_of(renderable) if numbers is None else list(numbers)
    texts = {}
    for width in widths:
        texts[width] = render(renderable, width)
        assert_readable_text(texts[width], width, numbers)
    return texts
