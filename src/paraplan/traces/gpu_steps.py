"""GPU work belongs to the step that launched it.

Each kernel, memcpy and memset (one device thread's `starts`, `ends` and `correlations` arrays)
belongs to the step whose host window (a ProfilerStep, or a train-step region) holds the runtime
call that launched it: the `cuda_runtime`/`cuda_driver` event with the same `args.correlation`,
the link the profiler itself records (PyTorch's Kineto; HolisticTraceAnalysis attributes kernels
to steps the same way). A kernel whose launching call the trace lacks belongs where it ran. A
step's GPU iteration is the span of its work, first start to last end.
"""

from __future__ import annotations

from array import array

import numpy as np

#: A device event's correlation id when it has none (ids are non-negative).
NO_CORRELATION = -1

Window = tuple[int, float, float]  # (step, start, end), microseconds


def gpu_windows(threads, runtime_ids: array, runtime_ts: array, runtime_launches: array, windows: list[Window],
                source: str) -> tuple[list[Window], tuple[str, ...]]:
    """Each step's GPU span: first start to last end of the device work its host window launched
    (a step that launched nothing keeps its host window); the last step is dropped when it
    launched nothing or when its kernel launches miss more kernels than any other step's did."""
    starts = np.concatenate([np.frombuffer(t.starts, dtype=np.float64) for t in threads])
    ends = np.concatenate([np.frombuffer(t.ends, dtype=np.float64) for t in threads])
    ids = np.concatenate([np.frombuffer(t.correlations, dtype=np.int64) for t in threads])
    rt_ids = np.frombuffer(runtime_ids, dtype=np.int64)
    rt_ts = np.frombuffer(runtime_ts, dtype=np.float64)
    order = np.argsort(rt_ids, kind="stable")  # the first call of a repeated id wins
    sorted_ids = rt_ids[order]
    at = np.searchsorted(sorted_ids, ids)
    found = (at < len(sorted_ids)) & (ids != NO_CORRELATION)
    found[found] = sorted_ids[at[found]] == ids[found]
    when = starts.copy()
    when[found] = rt_ts[order[at[found]]]

    steps = [w[0] for w in windows]
    host_starts = np.array([w[1] for w in windows])
    host_ends = np.array([w[2] for w in windows])
    n = len(windows)

    def step_of(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(host_starts, t, side="right") - 1
        inside = (i >= 0) & (t < host_ends[np.maximum(i, 0)])
        return np.where(inside, i, n)  # n: no step

    mine = step_of(when)
    count = np.bincount(mine, minlength=n + 1)[:n]
    first = np.full(n + 1, np.inf)
    last = np.full(n + 1, -np.inf)
    np.minimum.at(first, mine, starts)
    np.maximum.at(last, mine, ends)
    # kernel launches whose kernel the trace lacks, per step
    launches = np.frombuffer(runtime_launches, dtype=np.int8).astype(bool)
    missing = launches & ~np.isin(rt_ids, ids)
    lost = np.bincount(step_of(rt_ts[missing]), minlength=n + 1)[:n]

    notes: list[str] = []
    out = []
    for i, (step, a, b) in enumerate(windows):
        if count[i]:
            out.append((step, float(first[i]), float(last[i])))
        else:
            out.append((step, a, b))
    if n > 1:  # a lone step is kept whatever it holds: it is all the trace has
        if count[-1] == 0 or lost[-1] > lost[:-1].max():
            why = ("launched no GPU work" if count[-1] == 0 else
                   f"is cut off by the end of the trace ({int(lost[-1])} of its kernel launches have no kernel)")
            notes.append(f"the last step ({source} {steps[-1]}) {why}: dropped")
            out.pop()
    waits = [max(0.0, out[i + 1][1] - out[i][2]) for i in range(len(out) - 1) if count[i] and count[i + 1]]
    spans = [b - a for i, (_, a, b) in enumerate(out) if count[i]]
    if waits and max(waits) > 0.005 * float(np.median(spans)):  # a wait under 0.5 % goes unsaid
        notes.append(f"between steps the GPU waited up to {max(waits) / 1e3:.3g} ms for the host "
                     f"(median {float(np.median(waits)) / 1e3:.3g} ms): no iteration counts it")
    empty = [steps[i] for i in range(len(out)) if not count[i]]
    if empty:
        notes.append(f"{source} {', '.join(map(str, empty))} launched no GPU work: the host's window is its time")
    unlinked = int((~found).sum())
    if unlinked:
        notes.append(f"{unlinked} of {len(ids)} GPU events have no launching runtime call in the trace: "
                     "each is placed by its own start")
    return sorted(out, key=lambda w: w[1]), tuple(notes)
