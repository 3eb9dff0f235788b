"""The traced operator inventory of a Hugging Face model (``paraplan inventory trace``)."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from paraplan.inventory.hftrace import TracedModel
from paraplan.inventory.ops import Op
from paraplan.inventory.traced import Agreement
from paraplan.report.layout import ReadableTable


def _si(x: float, unit: str = "") -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.0f} {unit}".rstrip()


def _bytes(x: float) -> str:
    for scale, prefix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}"
    return f"{x:.0f} B"


def render_traced_layers(trace: TracedModel, layers: list[tuple[str, int, tuple[Op, ...]]],
                         kernels: str = "eager") -> Group:
    """One table per layer kind: each traced module (``kernels``: fused, each fused kernel) as a
    paraplan operator."""
    parts: list = [Text(
        f"{trace.model_type}: {trace.total_params:,} parameters ({trace.embedding_params:,} embedding, "
        f"{trace.head_params:,} output head); {trace.num_layers} layers in {len(trace.layers)} kind(s); "
        f"micro-batch {trace.micro_batch} x {trace.seq_length} tokens, {trace.dtype}; {kernels} kernels"
    )]
    for kind, count, ops in layers:
        table = ReadableTable(title=f"layer kind {kind} (x{count})")
        table.add_column("operator")
        table.add_column("kind", short="kind")
        table.add_column("fwd FLOPs", short="fwd", number=True)
        table.add_column("bwd FLOPs", short="bwd", number=True)
        table.add_column("fwd bytes", short="fwd B", number=True)
        table.add_column("saved", number=True)
        table.add_column("params", number=True)
        for op in ops:
            table.add_row(op.name, op.kind.value, _si(op.flops), _si(op.bwd_flops), _bytes(op.bytes),
                          _bytes(op.saved_bytes), f"{op.params:,.0f}")
        parts.append(table)
        notes = sorted({op.role for op in ops if op.role.startswith("uncalibrated:")})
        parts.extend(Text(note, style="yellow") for note in notes)
    return Group(*parts)


def render_agreement(rows: tuple[Agreement, ...], title: str) -> ReadableTable:
    """Traced beside hand-written, per quantity of one layer."""
    table = ReadableTable(title=title)
    table.add_column("quantity")
    table.add_column("traced", number=True)
    table.add_column("hand-written", short="hand", number=True)
    table.add_column("traced/hand - 1", short="diff", number=True)
    for row in rows:
        fmt = _bytes if "bytes" in row.quantity or "activations" in row.quantity else _si
        if row.quantity == "parameters":
            fmt = lambda x: f"{x:,.0f}"  # noqa: E731
        table.add_row(row.quantity, fmt(row.traced), fmt(row.hand), f"{row.relative * 100:+.2f} %")
    return table
