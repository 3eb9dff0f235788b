"""What `paraplan trace summarize` shows: iteration statistics, where each rank's time went,
and the components of the fastest and the median iteration (tables within 80 columns)."""

from __future__ import annotations

import re
import statistics
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from paraplan.traces.decode import Iteration
from paraplan.traces.rules import COMPUTE_CLASSES
from paraplan.traces.summary import TraceSummary

_RANK_COLUMNS = 4  # more ranks than this: min / median / max over ranks
TOP_UNCLASSIFIED = 5  # unclassified kernels listed
_KERNEL_WIDTH = 52  # a kernel's name in the unclassified table: the table fits 80 columns
_SPLIT_AT = "..."  # where a long name was shortened (rich's own cut is "…": never a name's)


def short_kernel_name(name: str, width: int = _KERNEL_WIDTH) -> str:
    """``name`` within ``width`` characters, shortened only at whole words: the leading
    namespaces first (``...::foo``), then the middle words of the kernel's own name
    (``cutlass_80_tensorop_..._align4``); a number is never cut."""
    if len(name) <= width:
        return name
    parts = name.split("::")
    for i in range(1, len(parts)):
        shorter = _SPLIT_AT + "::" + "::".join(parts[i:])
        if len(shorter) <= width:
            return shorter
    words = re.findall(r"[^_]+_?|_", parts[-1])  # each word with its trailing underscore
    head, tail, i, j = [], [], 0, len(words)  # words[i:j] are not placed yet
    room = width - len(_SPLIT_AT)
    while i < j:
        front = len(head) <= len(tail)  # from the front and the back in turn
        word = words[i] if front else words[j - 1]
        if len(word) > room:
            break
        room -= len(word)
        if front:
            head.append(word)
            i += 1
        else:
            tail.insert(0, word)
            j -= 1
    if head or tail:
        return "".join(head) + _SPLIT_AT + "".join(tail)
    cut = width - len(_SPLIT_AT)  # one word longer than the width: cut it, never within a number
    while cut > 0 and parts[-1][cut - 1].isdigit() and parts[-1][cut].isdigit():
        cut -= 1
    return parts[-1][:cut] + _SPLIT_AT


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.2f}"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


def _components(it: Iteration) -> dict[str, float]:
    """One iteration's components, in the order tables show them."""
    rows = {f"compute {k}": v for k, v in it.compute_by_class.items()}
    rows.update({f"comm {k}": v for k, v in it.comm_by_kind.items()})
    rows.update({f"exposed comm {k}": v for k, v in it.exposed_by_dimension.items()})
    rows["overlapped comm"] = it.overlap_s
    if it.memory_s > 0:
        rows["memory"] = it.memory_s
    rows["idle"] = it.idle_s
    return rows


def _order(name: str) -> tuple:
    head = name.split(" ")[0]
    rank = {"compute": 0, "comm": 1, "exposed": 2, "overlapped": 3, "memory": 4, "idle": 5}.get(head, 6)
    klass = name.removeprefix("compute ")
    return (rank, COMPUTE_CLASSES.index(klass) if rank == 0 and klass in COMPUTE_CLASSES else 0, name)


def trace_record(s: TraceSummary) -> dict[str, Any]:
    """The summary as plain data (`--format json`); seconds throughout."""
    def per_rank(step: int) -> list[dict[str, Any]]:
        return [
            {"rank": r.rank, "iteration_s": (it := s.iteration(r, step)).iteration_s, "compute_s": it.compute_s,
             "comm_s": it.comm_s, "exposed_comm_s": it.exposed_comm_s, "memory_s": it.memory_s,
             "components_s": _components(it)}
            for r in s.ranks
        ]

    return {
        "files": [str(r.path) for r in s.ranks],
        "skipped": [{"file": str(f), "reason": why} for f, why in s.skipped],
        "device": s.ranks[0].device,
        "backend": s.ranks[0].backend,
        "iteration_source": s.ranks[0].iteration_source,
        "iterations": {"count": len(s.steps), "steps": list(s.steps), **s.stats()},
        "iteration_s": {str(k): v for k, v in s.step_times_s.items()},
        "noise_pct": s.noise_pct,
        "notes": list(s.notes),
        "fastest": {"step": s.fastest_step, "ranks": per_rank(s.fastest_step)},
        "median": {"step": s.median_step, "ranks": per_rank(s.median_step)},
        "ranks": [
            {**vars(sh), "overlap_fraction": sh.overlap_fraction} for sh in s.shares()
        ],
        "slowest_rank": s.slowest_rank,
        "waits_caused_s": {str(k): v for k, v in (s.waits_caused() or {}).items()},
        "collectives": s.collective_totals(),
        "unclassified_kernels": [{"kernel": name, "seconds": sec, "share_of_kernel_time": share}
                                 for name, sec, share in s.top_unclassified(TOP_UNCLASSIFIED)],
    }


def render_trace_summary(s: TraceSummary) -> Group:
    first = s.ranks[0]
    steps = f"#{s.steps[0]}-#{s.steps[-1]}" if len(s.steps) > 1 else f"#{s.steps[0]}"
    head = Text(
        f"{len(s.steps)} iterations ({first.iteration_source} {steps}) on {len(s.ranks)} ranks, "
        f"{first.device} trace" + (f", {first.backend}" if first.backend else "")
    )
    st = s.stats()
    times = Table(box=box.SIMPLE_HEAD)
    for col in ("min", "median", "mean", "p90", "max", "std"):
        times.add_column(col, justify="right", no_wrap=True)
    times.add_row(*(_ms(st[f"{c}_s"]) for c in ("min", "median", "mean", "p90", "max", "std")))
    noise = Text(
        f"Noise: the typical (median) iteration is {s.noise_pct:.1f} % slower than the fastest "
        f"(#{s.fastest_step}, {_ms(s.step_times_s[s.fastest_step])} ms)."
    )
    notes = [Text(f"note: {n}") for n in s.notes]
    return Group(
        head, _title("Iteration time (ms; a step takes its longest rank's time)"), times, noise, *notes,
        _shares(s),
        _title(f"Components of the fastest iteration, #{s.fastest_step} (ms)"),
        _iteration_table(s, s.fastest_step),
        _title(f"Components of the median iteration, #{s.median_step} (ms)"),
        _iteration_table(s, s.median_step),
        *_unclassified(s),
    )


def _unclassified(s: TraceSummary) -> list:
    """The kernels no rule names (class other), most time first; nothing when there are none."""
    top = s.top_unclassified(TOP_UNCLASSIFIED)
    if not top:
        return []
    t = Table(box=box.SIMPLE_HEAD)
    t.add_column("kernel", no_wrap=True)
    t.add_column("ms", justify="right", no_wrap=True)
    t.add_column("share", justify="right", no_wrap=True)
    for name, seconds, share in top:
        t.add_row(short_kernel_name(name), _ms(seconds), f"{100 * share:.1f} %")
    return [_title(f"Unclassified kernels (class other), top {len(top)}: whole trace, every rank"), t,
            Text("share: of all compute kernels' time. A rule in a table named by $PARAPLAN_KERNEL_CLASSES "
                 "classifies them (see paraplan/traces/kernel_classes.yaml).")]


def _title(text: str) -> Text:
    return Text("\n" + text, style="bold")


def _shares(s: TraceSummary) -> Group:
    t = Table(box=box.SIMPLE_HEAD)
    for col in ("rank", "iteration", "compute", "comm", "exposed", "overlap", "memory", "idle"):
        t.add_column(col, justify="right", no_wrap=True)
    shares = s.shares()
    for sh in shares:
        t.add_row(str(sh.rank), _ms(sh.iteration_s), _ms(sh.compute_s), _ms(sh.comm_s), _ms(sh.exposed_comm_s),
                  _pct(sh.overlap_s, sh.comm_s), _ms(sh.memory_s), _ms(sh.idle_s))
    slow = next(x for x in shares if x.rank == s.slowest_rank)
    waits = s.waits_caused()
    if waits and waits[slow.rank] > 0:
        why = (f"the others wait {_ms(waits[slow.rank])} ms per iteration for it in collectives; a rank's "
               "iteration holds its waiting, so the straggler's can be the shorter")
    else:
        rest = [x.compute_s for x in shares if x.rank != slow.rank]
        more = f", {_ms(slow.compute_s - statistics.median(rest))} ms more than the others' median" if rest else ""
        why = f"no collective to time it by: the most compute, {_ms(slow.compute_s)} ms{more}"
    note = Text(f"Straggler: rank {slow.rank} ({why}). Overlap: the share of communication time hidden "
                "under compute; memory: copies and sets beneath neither.")
    return Group(_title("Per rank (ms, median over its iterations)"), t, note)


def _iteration_table(s: TraceSummary, step: int) -> Table:
    comps = {r.rank: _components(s.iteration(r, step)) for r in s.ranks}
    names = sorted({n for c in comps.values() for n in c}, key=_order)
    t = Table(box=box.SIMPLE_HEAD)
    t.add_column("component", no_wrap=True)
    few = len(s.ranks) <= _RANK_COLUMNS
    headers = [f"rank {r.rank}" for r in s.ranks] if few else ["min", "median", "max", "max rank"]
    for h in headers:
        t.add_column(h, justify="right", no_wrap=True)
    for name in [*names, "iteration"]:
        values = {
            rank: (s.iteration(next(r for r in s.ranks if r.rank == rank), step).iteration_s
                   if name == "iteration" else c.get(name, 0.0))
            for rank, c in comps.items()
        }
        if few:
            t.add_row(name, *(_ms(values[r.rank]) for r in s.ranks), end_section=name == names[-1])
        else:
            top = max(values, key=values.__getitem__)
            v = list(values.values())
            t.add_row(name, _ms(min(v)), _ms(statistics.median(v)), _ms(max(v)), str(top),
                      end_section=name == names[-1])
    return t
