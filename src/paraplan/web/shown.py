"""The figures as the command line writes them: the page shows the CLI's own tables (the
renderables of ``report.tables``, ``report.compare`` and ``report.search``), each cell the very
string the terminal prints, so every number on the page reads as the CLI's (GiB, the interval's
``17.240 s (80 %: 16.9-21.9 s)``); the JSON beside them stays the CLI's ``--format json``."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from paraplan.report.layout import ReadableTable


def _plain(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else "" if cell is None else str(cell)


def blocks(group: Any) -> list[dict[str, Any]]:
    """A rich Group of the CLI's output as the page's blocks: a line of text, or a table (its
    title, header and rows of cells as printed)."""
    out: list[dict[str, Any]] = []
    for item in getattr(group, "renderables", [group]):
        if isinstance(item, Table):
            cells = [[_plain(c) for c in column._cells] for column in item.columns]
            header = [_plain(c.header) for c in item.columns] if item.show_header else []
            out.append({"title": _plain(item.title), "header": header,
                        "rows": [list(row) for row in zip(*cells, strict=True)],
                        "numbers": [c.justify == "right" for c in item.columns]})
        elif isinstance(item, ReadableTable):
            out.append({"title": item.title, "header": [c.header for c in item.columns],
                        "rows": [[_plain(c) for c in row.cells] for row in item.rows],
                        "numbers": [c.number for c in item.columns]})
        else:
            out.append({"line": _plain(item)})
    return out


def prediction_shown(pred: Any, interval: Any) -> dict[str, Any]:
    """The predict page's text: the cards (each figure with its interval, as ``paraplan
    predict`` prints it), the CLI's tables, the interval's rule and widening lines, and the
    memory of each stage."""
    from paraplan.report.tables import render_interval, render_prediction
    from paraplan.units import format_bytes

    shown = blocks(render_prediction(pred, interval))
    tables = [t for t in shown if "rows" in t]
    summary = {row[0]: row[1] for t in tables if not t["header"] for row in t["rows"]}
    memory = pred.memory
    worst = memory.worst
    cards = [["iteration", summary["iteration time"]], ["tokens / s", summary["tokens / s"]], ["MFU", summary["MFU"]],
             ["memory / GPU", f"{format_bytes(worst.total)} of {format_bytes(memory.hbm)} HBM"]]
    for label, key in (("$ / hour", "cluster $ / hour"), ("$ / M tokens", "$ per million tokens")):
        if key in summary:
            cards.append([label, summary[key]])
    cards += [[key.removesuffix(" tokens"), value] for key, value in summary.items() if key.startswith("time to train")]
    if "cost to train" in summary:
        cards.append(["cost to train", summary["cost to train"]])
    rule = [text.plain for text in render_interval(interval)]
    return {
        "seq_length": f"seq_length {pred.job.model.seq_length:,} tokens per sequence",  # as paraplan predict says
        "cards": cards,
        "fits": bool(memory.fits),
        "tables": tables,
        "lines": [t["line"] for t in shown if "line" in t and t["line"] not in rule],
        "interval": rule,
        "stages": [[str(m.stage), format_bytes(m.total), str(t.num_layers)]
                   for m, t in zip(memory, pred.stages, strict=False)],
    }


def comparison_shown(comparison: Any, bounds: Any) -> list[dict[str, Any]]:
    """``paraplan compare``'s output with its intervals, as the page's blocks."""
    from paraplan.report.compare import render_comparison

    names = (comparison.a.job.name, comparison.b.job.name)  # the page's job names, as the CLI's file names
    return blocks(render_comparison(comparison, names, bounds))


def plans_shown(rows: list[dict[str, Any]], several_configurations: bool) -> dict[str, Any]:
    """``paraplan search``'s plan table of ``rows`` in its narrow layout (as at 80 columns): the
    settings every plan shares said once (``every plan: cp 1, vpp 1``), then the full headers of
    the other columns and each row's cells."""
    from paraplan.report.search import plans_table

    if not rows:
        return {"shared": "", "header": [], "rows": [], "numbers": []}
    table = plans_table("", rows, several_configurations)
    same = table._same()  # the CLI's own choice of the settings every row shares
    shown = [i for i in range(len(table.columns)) if i not in same]
    return {"shared": ", ".join(f"{table.columns[i].header} {_plain(table.rows[0].cells[i])}" for i in same),
            "header": [table.columns[i].header for i in shown], "numbers": [table.columns[i].number for i in shown],
            "rows": [[_plain(row.cells[i]) for i in shown] for row in table.rows]}
