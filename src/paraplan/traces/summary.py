"""Many ranks' decoded traces -> iteration statistics and components, as one record.

An iteration's time is the longest rank's time for that step (the job moves on when every rank
has). The straggler is the rank the others wait for in collectives; its own iteration can be the
shorter one, since a rank's iteration holds its waiting. The fastest and the median iteration are shown per rank and component; noise is how much
slower the typical (median) iteration is than the fastest one.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from paraplan.specs import ConfigError
from paraplan.traces.decode import Iteration, RankTrace, decode_trace
from paraplan.traces.kernels import top_unclassified
from paraplan.traces.reader import TraceFileError, device_names, read_top
from paraplan.traces.rules import P2P_KINDS

_TRACE_NAME = re.compile(r"rank|trace", re.I)
_SUFFIXES = (".json", ".json.gz")


@dataclass(frozen=True)
class RankShare:
    """One rank's medians over the iterations: where its time went."""

    rank: int
    iteration_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    overlap_s: float
    idle_s: float
    memory_s: float = 0.0  # memory copies/sets beneath neither compute nor communication

    @property
    def overlap_fraction(self) -> float:
        return self.overlap_s / self.comm_s if self.comm_s > 0 else 0.0


@dataclass(frozen=True)
class TraceSummary:
    ranks: tuple[RankTrace, ...]
    steps: tuple[int, ...]  # the steps every rank has
    step_times_s: dict[int, float]  # step -> longest rank's time
    skipped: tuple[tuple[Path, str], ...] = field(default=())

    @property
    def notes(self) -> tuple[str, ...]:
        """What the decoder says about each rank's trace (a dropped last step, steps that launched
        no GPU work, the GPU's waits for the host), prefixed with the rank."""
        return tuple(f"rank {r.rank}: {note}" for r in self.ranks for note in r.notes)

    @property
    def times(self) -> list[float]:
        return [self.step_times_s[s] for s in self.steps]

    def stats(self) -> dict[str, float]:
        t = sorted(self.times)
        n = len(t)
        p90 = t[min(n - 1, max(0, round(0.9 * (n - 1))))]
        return {
            "min_s": t[0],
            "median_s": statistics.median(t),
            "mean_s": statistics.fmean(t),
            "p90_s": p90,
            "max_s": t[-1],
            "std_s": statistics.pstdev(t) if n > 1 else 0.0,
        }

    @property
    def fastest_step(self) -> int:
        return min(self.steps, key=self.step_times_s.__getitem__)

    @property
    def median_step(self) -> int:
        """The step whose time is the median (the upper middle one for an even count, so that
        two iterations show the fastest and the other)."""
        ordered = sorted(self.steps, key=self.step_times_s.__getitem__)
        return ordered[len(ordered) // 2]

    @property
    def noise_pct(self) -> float:
        """How much slower the typical iteration is than the fastest, in percent."""
        return 100.0 * (statistics.median(self.times) / min(self.times) - 1.0)

    def iteration(self, rank: RankTrace, step: int) -> Iteration:
        return next(it for it in rank.iterations if it.step == step)

    def shares(self) -> list[RankShare]:
        out = []
        for r in self.ranks:
            its = [self.iteration(r, s) for s in self.steps]

            def med(f, its=its):
                return statistics.median(f(i) for i in its)

            out.append(RankShare(
                rank=r.rank, iteration_s=med(lambda i: i.iteration_s), compute_s=med(lambda i: i.compute_s),
                comm_s=med(lambda i: i.comm_s), exposed_comm_s=med(lambda i: i.exposed_comm_s),
                overlap_s=med(lambda i: i.overlap_s), idle_s=med(lambda i: i.idle_s),
                memory_s=med(lambda i: i.memory_s),
            ))
        return out

    def waits_caused(self) -> dict[int, float] | None:
        """Per rank, how long the other ranks waited for it in collectives (seconds, median over
        the iterations); None when no collective can be matched across ranks.

        The i-th collective of a kind and group in a step is the same call on every rank that
        makes it (a collective needs all of them); the rank that starts it last holds the others,
        each for the gap between its own start and that last one (the synchronisation skew
        TraceLens separates from transfer time). Point-to-point sends and receives are left out:
        only the receiver waits, for one sender. The traces' clocks are compared as they are:
        one host's ranks share a clock; across hosts, a skew of the clocks adds to these waits."""
        per_step: dict[int, dict[int, float]] = {}
        for step in self.steps:
            calls: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
            for r in self.ranks:
                for c in r.collectives:
                    if c.step == step and c.kind not in P2P_KINDS:
                        calls[(c.kind, c.group)][r.rank].append(c.start_us)
            caused = dict.fromkeys((r.rank for r in self.ranks), 0.0)
            matched = False
            for by_rank in calls.values():
                if len(by_rank) < 2 or len({len(v) for v in by_rank.values()}) != 1:
                    continue  # made by one rank only, or unequal counts: cannot be paired
                matched = True
                ranks = list(by_rank)
                for starts in zip(*by_rank.values(), strict=True):
                    last = max(range(len(starts)), key=starts.__getitem__)
                    caused[ranks[last]] += sum(starts[last] - t for t in starts) * 1e-6
            if matched:
                per_step[step] = caused
        if not per_step:
            return None
        return {r.rank: statistics.median(c[r.rank] for c in per_step.values()) for r in self.ranks}

    @property
    def slowest_rank(self) -> int:
        """The straggler: the rank the others wait for longest in collectives
        (``waits_caused``); without collectives to match, the rank with the most compute."""
        waits = self.waits_caused()
        if waits and max(waits.values()) > 0:
            return max(waits, key=waits.__getitem__)
        return max(self.shares(), key=lambda s: s.compute_s).rank

    def top_unclassified(self, limit: int = 5) -> list[tuple[str, float, float]]:
        """The kernels no rule of the kernel table names (class "other"), by their own name,
        most time first: (name, seconds over the whole trace and every rank, share of all the
        ranks' compute kernel time). Empty when every kernel has a class."""
        seconds: dict[str, float] = defaultdict(float)
        for r in self.ranks:
            for signature, s in r.unclassified_s.items():
                seconds[signature] += s
        total = sum(r.kernel_s for r in self.ranks)
        if not seconds or total <= 0:
            return []
        return [(name, s, s / total) for name, s in top_unclassified(seconds, limit)]

    def collective_totals(self) -> list[dict]:
        """Per rank, dimension and kind: count, bytes and busy seconds per iteration (means)."""
        acc: dict[tuple, list[float]] = defaultdict(lambda: [0, 0, 0.0, False])
        steps = set(self.steps)
        for r in self.ranks:
            for c in r.collectives:
                if c.step not in steps:
                    continue
                a = acc[(r.rank, c.dimension, c.kind, c.group, c.group_size)]
                a[0] += 1
                a[1] += c.bytes or 0
                a[2] += c.duration_s
                a[3] = a[3] or c.bytes is None
        n = len(self.steps)
        return [
            {"rank": k[0], "dimension": k[1], "kind": k[2], "group": k[3], "group_size": k[4],
             "count_per_iteration": a[0] / n, "bytes_per_iteration": None if a[3] else a[1] / n,
             "seconds_per_iteration": a[2] / n}
            for k, a in sorted(acc.items(), key=lambda kv: tuple(str(x) for x in kv[0]))
        ]


def trace_files(paths: list[Path]) -> list[Path]:
    """The trace files named, a directory standing for the traces in it (names with 'rank'
    or 'trace', else every .json / .json.gz file)."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(_SUFFIXES))
            named = [f for f in found if _TRACE_NAME.search(f.name)]
            if not (named or found):
                raise ConfigError(f"{p}: no .json or .json.gz trace files in this directory")
            files.extend(named or found)
        elif p.exists():
            files.append(p)
        else:
            raise ConfigError(f"{p}: no such file or directory")
    return files


def summarize(paths: list[Path], decoded: list[RankTrace] | None = None) -> TraceSummary:
    """Decode every rank's trace and summarise. A bad file among good ones is skipped and named
    in `skipped`; when nothing can be read, or the files do not belong together, TraceFileError."""
    if decoded is not None:  # decoded by the caller already: summarise those
        files, ranks, skipped = [r.path for r in decoded], list(decoded), []
    else:
        files, ranks, skipped = trace_files(paths), [], []
    for f in files if decoded is None else ():
        try:
            ranks.append(decode_trace(f))
        except TraceFileError as exc:
            if len(files) == 1:
                raise
            skipped.append((f, str(exc).removeprefix(f"{f}: ")))
    if not ranks:
        f, reason = skipped[0]
        raise TraceFileError(f"{f}: {reason} (and no other file could be read)")
    ranks = _assign_ranks(ranks)
    _check_together(ranks)
    steps = sorted(set.intersection(*(set(it.step for it in r.iterations) for r in ranks)))
    if not steps:
        spans = "; ".join(f"{r.path.name}: steps {_span(r)}" for r in ranks)
        raise TraceFileError(f"the files share no iteration (different runs?): {spans}")
    times = {s: max(next(it.iteration_s for it in r.iterations if it.step == s) for r in ranks) for s in steps}
    return TraceSummary(tuple(ranks), tuple(steps), times, tuple(skipped))


def _assign_ranks(ranks: list[RankTrace]) -> list[RankTrace]:
    from dataclasses import replace

    taken = {r.rank for r in ranks if r.rank is not None}
    free = (n for n in range(len(ranks) + len(taken)) if n not in taken)
    out = [r if r.rank is not None else replace(r, rank=next(free)) for r in ranks]
    return sorted(out, key=lambda r: r.rank)


#: Ranks of one run profile the same steps at the same moment, give or take the hosts' clock
#: skew (NTP keeps it to milliseconds); traces whose shared first step starts further apart on
#: the wall clock were recorded by different runs.
FAR_APART_S = 300.0
#: Microseconds since 1970 from 2001 on: a trace clock that is wall-clock time (older Kineto
#: writes such `ts`; newer, `ts` from `baseTimeNanoseconds`); anything smaller is a clock since
#: boot, which cannot be compared across files.
_WALL_CLOCK_US = 1e15


def _check_together(ranks: list[RankTrace]) -> None:
    """Refuse, in one line naming the mismatch, files that cannot be one run: a rank twice, or
    ranks that disagree on the world size, the GPU, the host name or when they ran."""
    seen: dict[int, Path] = {}
    for r in ranks:
        if r.rank in seen:
            raise TraceFileError(f"{r.path}: rank {r.rank} again (also {seen[r.rank]}): files of different runs?")
        seen[r.rank] = r.path
    if len(ranks) < 2:
        return
    tops = [read_top(r.path) for r in ranks]
    common = set.intersection(*(set(it.step for it in r.iterations) for r in ranks))
    facts = {
        "world size": [r.world_size for r in ranks],
        "GPU": [_gpu(top) for top in tops],
        "host name": _hosts(tops, ranks),
    }
    for what, values in facts.items():
        if len({v for v in values if v is not None}) > 1:
            which = ", ".join(f"{r.path.name}: {v}" for r, v in zip(ranks, values, strict=True))
            raise TraceFileError(f"the files disagree on the {what} ({which}): files of different runs?")
    starts = [_wall_start_s(top, r, common) for top, r in zip(tops, ranks, strict=True)]
    known = [(r, t) for r, t in zip(ranks, starts, strict=True) if t is not None]
    if len(known) > 1 and max(t for _, t in known) - min(t for _, t in known) > FAR_APART_S:
        first = min(t for _, t in known)
        which = ", ".join(f"{r.path.name}: {_utc(t)} (+{t - first:,.0f} s)" for r, t in known)
        raise TraceFileError(f"the files were recorded at different times ({which}): files of different runs?")


def _gpu(top: dict) -> str | None:
    return " + ".join(device_names(top)) or None


def _hosts(tops: list[dict], ranks: list[RankTrace]) -> list[str | None]:
    """Each file's host name where the run fits on one host (its world size at most the GPUs
    each host lists), so that its ranks must share one; else nothing to compare (the ranks of
    a many-host run differ in host name)."""
    world = next((r.world_size for r in ranks if r.world_size is not None), None)
    fits = world is not None and all(len(top.get("deviceProperties") or ()) >= world for top in tops)
    return [top.get("hostname") if fits and isinstance(top.get("hostname"), str) else None for top in tops]


def _wall_start_s(top: dict, r: RankTrace, common: set[int]) -> float | None:
    """When the first step the ranks share (else the rank's first step) began, in seconds
    since 1970; None when the trace's clock is not the wall clock."""
    its = [it for it in r.iterations if it.step in common] or list(r.iterations)
    if not its:
        return None
    base = top.get("baseTimeNanoseconds")
    start_us = min(its, key=lambda it: it.step).start_us + (base / 1e3 if isinstance(base, int) else 0.0)
    return start_us * 1e-6 if start_us >= _WALL_CLOCK_US else None


def _utc(t: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _span(r: RankTrace) -> str:
    steps = [it.step for it in r.iterations]
    return f"{min(steps)}-{max(steps)}" if steps else "none"
