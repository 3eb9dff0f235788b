"""Tables that stay readable at any terminal width, 80 columns included.

Rich shrinks a table that is too wide by cutting its cells to "…", numbers and names among
them. A :class:`ReadableTable` never does: it is laid out when it is printed, at the width it
gets, as the first of these that fits:

1. a boxed table with the full headers (a wide terminal);
2. a compact table (no vertical rules) with short headers and short cells, explained in a
   legend below it; ``setting`` columns every row shares are said once above it;
3. the compact table without its ``detail`` columns (long text), which follow in a second table
   keyed by the first column;
4. the compact table's columns wrapped into blocks, each block repeating the first column;
5. one block per row: the key, then ``header: value`` lines.

Number and name columns are never wrapped or cut; ``wrap`` columns (prose) break between words
and are never narrower than their longest word. Column widths are computed here and handed to
rich as fixed widths, so rich has nothing left to shrink.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

__all__ = ["Col", "ReadableTable"]

Cell = str | Text


@dataclass(frozen=True)
class Col:
    """A column: its full header; ``short``, the header used when the table is narrow, which
    the legend spells out as ``legend`` (default: the header); ``compact``, a shorter form of a
    cell for narrow tables (say which in ``legend``); ``number`` (right-aligned); ``wrap``: prose
    that may break between words; ``detail``: long text that moves to a second table when the
    table is narrow; ``setting``: said once above a narrow table when every row has one value."""

    header: str
    short: str | None = None
    number: bool = False
    wrap: bool = False
    detail: bool = False
    legend: str | None = None
    compact: Callable[[str], str] | None = None
    setting: bool = False

    @property
    def align(self) -> str:
        return "right" if self.number else "left"


@dataclass
class _Row:
    cells: list[Cell]
    end_section: bool = False
    style: str | None = None


def _plain(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def _longest_line(text: str) -> int:
    return max((cell_len(line) for line in text.split("\n")), default=0)


def _longest_word(text: str) -> int:
    return max((cell_len(word) for word in text.split()), default=0)


@dataclass
class ReadableTable:
    """A table model: columns (:class:`Col`) and rows of strings or rich Text; printed with the
    layout that fits the console's width (see the module's docstring)."""

    title: str = ""
    columns: list[Col] = field(default_factory=list)
    rows: list[_Row] = field(default_factory=list)
    shared: str = "every row"  # how the line of settings every row shares begins

    def add_column(self, header: str, **kwargs) -> None:
        self.columns.append(Col(header, **kwargs))

    def add_row(self, *cells: Cell | None, end_section: bool = False, style: str | None = None) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.columns)} columns")
        # plain strings are data, never rich markup ("[variant]" stays as written)
        self.rows.append(_Row([Text("" if c is None else c) if not isinstance(c, Text) else c for c in cells],
                              end_section, style))

    # -- what the table holds --------------------------------------------------------------------

    def number_cells(self) -> list[str]:
        """Every non-empty cell of a number column: what must appear intact in any layout."""
        index = [i for i, c in enumerate(self.columns) if c.number]
        return [_plain(row.cells[i]) for row in self.rows for i in index if _plain(row.cells[i]).strip() not in ("", "-")]

    # -- layout ------------------------------------------------------------------------------

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        for layout in (self._boxed, self._compact, self._split, self._blocks):
            rendered = layout(console, width)
            if rendered is not None:
                yield rendered
                return
        yield self._vertical(width)

    def _boxed(self, console: Console, width: int) -> RenderableType | None:
        indices = list(range(len(self.columns)))
        table = self._table(console, width, indices, short=False, compact=False)
        return None if table is None else Group(*self._title(self.title), table)

    def _compact(self, console: Console, width: int) -> RenderableType | None:
        indices = self._narrow_columns()
        table = self._table(console, width, indices, short=True, compact=True)
        return None if table is None else Group(*self._head(), table, *self._legend(indices))

    def _split(self, console: Console, width: int) -> RenderableType | None:
        details = [i for i, c in enumerate(self.columns) if c.detail]
        if not details:
            return None
        main = [i for i in self._narrow_columns() if i not in details]
        table = self._table(console, width, main, short=True, compact=True)
        if table is None:
            return None
        key = main[0]
        rows, seen = [], set()
        for row in self.rows:
            cells = tuple(_plain(row.cells[i]) for i in (key, *details))
            if all(not c.strip() for c in cells[1:]) or cells in seen:
                continue
            seen.add(cells)
            rows.append(_Row([self._cell(row, i, compact=True) for i in (key, *details)]))
        if len({_plain(r.cells[0]) for r in rows}) < len(rows):
            return None  # a key with two different details: the reader could not tell them apart
        second = ReadableTable(
            f"{' and '.join(self.columns[i].header for i in details)} by {self.columns[key].header}",
            [replace(self.columns[i], compact=None) for i in (key, *details)],  # cells already compact
            rows,
        )
        detail_table = second._table(console, width, list(range(len(second.columns))), short=False, compact=True)
        if detail_table is None:
            return None
        return Group(*self._head(), table, *self._legend(main), *self._title(second.title), detail_table)

    def _blocks(self, console: Console, width: int) -> RenderableType | None:
        """The compact table's columns in blocks as wide as fit, each repeating the key."""
        key, *rest = self._narrow_columns()
        if not rest:
            return None
        blocks: list[list[int]] = []
        tables: list[Table] = []
        for i in rest:
            wider = self._table(console, width, [key, *blocks[-1], i], short=True, compact=True) if tables else None
            if wider is not None:
                tables[-1] = wider
                blocks[-1].append(i)
                continue
            table = self._table(console, width, [key, i], short=True, compact=True)
            if table is None:
                return None
            tables.append(table)
            blocks.append([i])
        parts: list[RenderableType] = [*self._head()]
        for n, table in enumerate(tables):
            parts += [Text(""), table] if n else [table]
        return Group(*parts, *self._legend([key, *rest]))

    def _vertical(self, width: int) -> RenderableType:
        """One block per row: the key, then ``header: value`` lines; where even that is too wide,
        each value on a line of its own under its header."""
        parts: list[RenderableType] = [*self._head()]
        key_index, *shown = self._narrow_columns()
        labels = [f"  {self.columns[i].header}:" for i in shown]
        label_width = max((cell_len(label) for label in labels), default=0)
        value_width = max((_longest_line(_plain(row.cells[i])) if not self.columns[i].wrap
                           else _longest_word(_plain(row.cells[i])) for row in self.rows for i in shown), default=0)
        side_by_side = label_width + 1 + value_width <= width
        for row in self.rows:
            key = row.cells[key_index]
            parts.append(key if isinstance(key, Text) and key.style else Text(_plain(key), style="bold"))
            grid = Table.grid(padding=(0, 1))
            if side_by_side:
                grid.add_column(no_wrap=True)
                grid.add_column(overflow="fold")
            else:
                grid.add_column(overflow="fold")
            for label, cell in zip(labels, (row.cells[i] for i in shown), strict=True):
                if not _plain(cell).strip():
                    continue
                if side_by_side:
                    grid.add_row(Text(label, style="dim"), cell)
                else:
                    grid.add_row(Text(label, style="dim"))
                    grid.add_row(Padding(cell, (0, 0, 0, 4)))
            parts.append(grid)
        return Group(*parts)

    # -- the parts every narrow layout shares ----------------------------------------------------

    def _same(self) -> list[int]:
        """The ``setting`` columns whose value every row shares (with more than one row); never
        the first column, which keys the rows."""
        if len(self.rows) < 2:
            return []
        return [i for i, c in enumerate(self.columns)
                if i and c.setting and len({_plain(r.cells[i]) for r in self.rows}) == 1]

    def _narrow_columns(self) -> list[int]:
        """The columns a narrow layout shows: all but the settings said once above it."""
        same = self._same()
        return [i for i in range(len(self.columns)) if i not in same]

    def _head(self) -> list[Text]:
        """The title, then the settings every row shares."""
        same = ", ".join(f"{self.columns[i].header} {_plain(self.rows[0].cells[i])}" for i in self._same())
        return [*self._title(self.title), *([Text(f"{self.shared}: {same}")] if same else [])]

    @staticmethod
    def _title(title: str) -> list[Text]:
        return [Text(title, style="table.title")] if title else []

    def _legend(self, indices: Iterable[int]) -> list[Text]:
        pairs = [f"{c.short or c.header} = {c.legend or c.header}" for c in (self.columns[i] for i in indices)
                 if c.short or c.legend]
        return [Text("headers: " + "; ".join(pairs), style="dim")] if pairs else []

    def _cell(self, row: _Row, index: int, *, compact: bool) -> Text:
        cell, shorten = row.cells[index], self.columns[index].compact
        if not compact or shorten is None:
            return cell
        return Text(shorten(_plain(cell)), style=cell.style if isinstance(cell, Text) else "")

    def _table(self, console: Console, width: int, indices: Sequence[int], *, short: bool,
               compact: bool) -> Table | None:
        """The table of these columns fitted into ``width``, or None when it cannot fit."""
        cols = [self.columns[i] for i in indices]
        headers = [(c.short or c.header) if short else c.header for c in cols]
        table = self._empty_table(cols, headers, compact)
        cells = [[self._cell(r, i, compact=compact) for i in indices] for r in self.rows]
        widths = self._widths(cols, headers, [[_plain(c) for c in row] for row in cells],
                              width - self._overhead(console, len(cols), compact))
        if widths is None:
            return None
        for column, w in zip(table.columns, widths, strict=True):
            column.width = w
        for row, row_cells in zip(self.rows, cells, strict=True):
            table.add_row(*row_cells, end_section=row.end_section, style=row.style)
        return table

    @staticmethod
    def _empty_table(cols: Sequence[Col], headers: Sequence[str], compact: bool) -> Table:
        if compact:
            table = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0), pad_edge=False)
        else:
            table = Table()
        for col, header in zip(cols, headers, strict=True):
            # a header may break between words even where the cells below it may not
            table.add_column(Text(header, no_wrap=False, overflow="fold"), justify=col.align,  # type: ignore[arg-type]
                             no_wrap=not col.wrap,
                             overflow="fold" if col.wrap else "ellipsis")
        return table

    @classmethod
    def _overhead(cls, console: Console, count: int, compact: bool) -> int:
        """Columns of rules and padding a table of ``count`` columns adds to its cells."""
        probe = cls._empty_table([Col("")] * count, [""] * count, compact)
        for column in probe.columns:
            column.width = 1
        probe.add_row(*("x" * count))
        lines = console.render_lines(probe, console.options.update(width=10 * count + 10), pad=False)
        return max(sum(cell_len(s.text) for s in line) for line in lines) - count

    @staticmethod
    def _widths(cols: Sequence[Col], headers: Sequence[str], rows: Sequence[Sequence[str]],
                available: int) -> list[int] | None:
        """Each column's width: its natural width if all fit; else every column at least its
        longest word (wrapped prose and headers) or its widest cell (everything else), and the
        room left first to unwrapped headers, then to prose."""
        natural: list[int] = []
        least: list[int] = []
        for i, (col, header) in enumerate(zip(cols, headers, strict=True)):
            texts = [r[i] for r in rows]
            widest = max((_longest_line(t) for t in texts), default=0)
            natural.append(max(widest, _longest_line(header), 1))
            cell_least = max((_longest_word(t) for t in texts), default=0) if col.wrap else widest
            least.append(max(cell_least, _longest_word(header), 1))
        if sum(natural) <= available:
            return natural
        if sum(least) > available:
            return None
        widths = list(least)
        spare = available - sum(widths)
        # whole headers on number and name columns first, narrowest need first
        for i in sorted((i for i, c in enumerate(cols) if not c.wrap), key=lambda i: natural[i] - least[i]):
            grow = min(natural[i] - widths[i], spare)
            widths[i] += grow
            spare -= grow
        # then whole headers on prose columns, then prose in proportion to what each still lacks
        for i, col in enumerate(cols):
            if col.wrap:
                grow = max(0, min(min(natural[i], _longest_line(headers[i])) - widths[i], spare))
                widths[i] += grow
                spare -= grow
        lacking = {i: natural[i] - widths[i] for i, c in enumerate(cols) if c.wrap and natural[i] > widths[i]}
        total = sum(lacking.values())
        if total and spare:
            for i, need in lacking.items():
                widths[i] += min(need, spare * need // total)
            spare = available - sum(widths)
            for i in sorted(lacking, key=lambda i: lacking[i], reverse=True):
                grow = min(natural[i] - widths[i], spare)
                widths[i] += grow
                spare -= grow
        return widths
