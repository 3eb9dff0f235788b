"""Tables of a sharding plan: the plan's totals, its blocks (layers folded), and the check of
the compiled plan against the analytic model."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from paraplan.units import format_bytes, format_seconds

_LAYER = re.compile(r"(?<=\.)\d+(?=\.)|^\d+(?=\.)")


def _comm(volume: dict[str, float]) -> str:
    return ", ".join(f"{k} {format_bytes(v)}" for k, v in sorted(volume.items()) if v) or "-"


def fold_blocks(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Blocks whose weight differs only by layer index and that share a strategy, as one row
    (``layers.*.qkv``) with their count and summed costs."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for b in blocks:
        key = (_LAYER.sub("*", b["weight"]), b["strategy"])
        row = rows.setdefault(key, {"weight": key[0], "strategy": key[1], "count": 0, "time_s": 0.0,
                                    "memory_bytes": 0.0, "comm_bytes": {}, "partition_spec": b["partition_spec"],
                                    "shape": b["shape"], "flops": b["flops"], "profile": b.get("profile")})
        row["count"] += 1
        row["time_s"] += b["time_s"]
        row["memory_bytes"] += b["memory_bytes"]
        for k, v in b["comm_bytes"].items():
            row["comm_bytes"][k] = row["comm_bytes"].get(k, 0.0) + v
    return list(rows.values())


def _spec(spec: list) -> str:
    if not spec:
        return "replicated"
    return "P(" + ", ".join("None" if d is None else (repr(d) if isinstance(d, str) else repr(tuple(d))) for d in spec) + ")"


def render_sharding(plan: dict[str, Any], check: dict[str, Any] | None) -> Group:
    mesh = " x ".join(f"{k}={v}" for k, v in plan["mesh"].items())
    budget = plan["memory_budget_bytes"]
    fits = "" if budget is None else (f" (budget {format_bytes(budget)}" + (")" if plan["fits"] else ", DOES NOT FIT)"))
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("mesh", f"{mesh} on {plan['cluster']}; batch sharded over {', '.join(plan['batch_axes']) or 'nothing'}")
    kind = plan.get("costs", "analytic")
    summary.add_row("time per step", f"{format_seconds(plan['time_s'])} ({kind}: contractions, their collectives; "
                                     "resharding analytic)")
    summary.add_row("memory per device", f"{format_bytes(plan['memory_bytes'])}{fits} (weights, grads, Adam, saved inputs)")
    summary.add_row("throughput", f"{plan['tflops_per_device']:.1f} TFLOP/s per device (contraction FLOPs)")
    summary.add_row("communication", _comm(plan["comm_bytes"]) + " per device per step")
    summary.add_row("analysis", f"{len(plan['blocks'])} blocks, {plan['blocks_costed']} costed "
                                f"(layers found: {plan['layers_found'] or 'none'}), {format_seconds(plan['analysis_s'])}")
    table = Table(title="Strategy per block (roles of the mesh axes; layers with the same strategy folded)")
    for name, justify in (("weight", "left"), ("blocks", "right"), ("strategy", "left"), ("PartitionSpec", "left"),
                          ("time", "right"), ("collectives", "left"), ("memory", "right")):
        table.add_column(name, justify=justify, no_wrap=name == "weight")
    for row in fold_blocks(plan["blocks"]):
        table.add_row(row["weight"], str(row["count"]), row["strategy"], _spec(row["partition_spec"]),
                      format_seconds(row["time_s"]), _comm(row["comm_bytes"]), format_bytes(row["memory_bytes"]))
    parts: list[Any] = [summary, table]
    if any(row["profile"] for row in fold_blocks(plan["blocks"])):
        parts.append(render_profile(fold_blocks(plan["blocks"])))
    if check is not None:
        parts.append(render_check(check))
    return Group(*parts)


def render_check(check: dict[str, Any]) -> Group:
    table = Table(title=f"Compiled plan against the analytic model (compile {format_seconds(check['compile_s'])})")
    for name in ("collective", "XLA (compiled)", "analytic", "difference"):
        table.add_column(name, justify="left" if name == "collective" else "right")
    kinds = sorted(set(check["xla_collective_bytes"]) | set(check["analytic_collective_bytes"]))
    for kind in kinds:
        x, a = check["xla_collective_bytes"].get(kind, 0.0), check["analytic_collective_bytes"].get(kind, 0.0)
        diff = "-" if max(x, a) == 0 else f"{(x - a) / max(x, a):+.1%}"
        table.add_row(kind, format_bytes(x), format_bytes(a), diff)
    x, a = sum(check["xla_collective_bytes"].values()), sum(check["analytic_collective_bytes"].values())
    table.add_row("total", format_bytes(x), format_bytes(a), f"{check['bytes_difference']:+.1%}", style="bold")
    if check["matches"] is None:
        numerics = Text("numerics: not run (shapes only); the plan compiled")
    elif check["matches"]:
        numerics = Text(f"numerics: the sharded step equals the unsharded one (max |error| {check['max_abs_error']:.1e})",
                        style="green")
    else:
        numerics = Text(f"numerics: MISMATCH (max |error| {check['max_abs_error']:.1e})", style="bold red")
    flag = Text(f"flagged: {check['flag']}", style="bold yellow") if check["flag"] else Text(
        "not flagged: compiled collectives within 5 % of the analytic bytes", style="green")
    return Group(table, numerics, flag)


def render_profile(rows: list[dict[str, Any]]) -> Table:
    """Each chosen block strategy compiled alone: XLA's collective bytes and FLOPs per device
    against the analytic ones, and its measured time where it was timed (GPUs)."""
    table = Table(title="Each block's strategy compiled alone (per block, per device)")
    for name in ("weight", "strategy", "XLA collectives", "analytic", "XLA FLOPs / analytic", "XLA memory", "measured"):
        table.add_column(name, justify="left" if name in ("weight", "strategy") else "right",
                         no_wrap=name == "weight")
    for row in rows:
        p = row["profile"]
        if p is None:
            continue
        n = row["count"]
        ratio = "-" if not p["xla_flops"] or not row["flops"] else f"{p['xla_flops'] / row['flops']:.3f}"
        table.add_row(row["weight"], row["strategy"], _comm(p["xla_comm_bytes"]), _comm(_own(row, n)), ratio,
                      "-" if p["xla_memory_bytes"] is None else format_bytes(p["xla_memory_bytes"]),
                      "-" if p["measured_s"] is None else format_seconds(p["measured_s"]))
    return table


def _own(row: dict[str, Any], count: int) -> dict[str, float]:
    """The block's own collectives per block: its all-reduces (resharding into it, all-gathers
    and all-to-alls, belongs to the edge, not the block)."""
    return {k: v / count for k, v in row["comm_bytes"].items() if k == "all-reduce"}


def no_plan_message(plan: dict[str, Any], budget: str, *, shown: int = 3) -> str:
    """"no plan fits ...": the budget, and the nearest plan (the search's least memory) named by
    its batch axes and its first ``shown`` folded weight strategies, with what it needs."""
    rows = fold_blocks(plan["blocks"])
    named = ", ".join(f"{r['weight']} {r['strategy']}" for r in rows[:shown])
    more = f" and {len(rows) - shown} more" if len(rows) > shown else ""
    mesh = ",".join(f"{k}={v}" for k, v in plan["mesh"].items())
    return (f"no plan fits the memory budget (memory_budget: {budget} per device) on mesh {mesh}; the nearest, "
            f"batch sharded over {', '.join(plan['batch_axes']) or 'nothing'}, {named}{more}, needs "
            f"{format_bytes(plan['memory_bytes'])} per device, over the budget; try a larger mesh (--mesh) "
            "or a larger --memory-budget")
