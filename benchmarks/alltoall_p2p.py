"""All-to-all and send/recv inside a node against XLA's measured table: the alpha-beta link
(before) and the fitted curves with their small-call times (after), per GPU key, collective and
group size, on held-out rows.

    python benchmarks/alltoall_p2p.py [../shared/data/xla_perf_tables/collectives.csv]

"before" prices a call as the cost model did without a measured curve of the kind: an
all-to-all (n-1) link latencies + moved / bus bandwidth (or NCCL's LL model), a send/recv one
link latency + bytes / p2p bandwidth. "after" fits the curve as ``paraplan calibrate
collective-table`` does on 80 % of the rows (a seeded draw of whole message sizes) and scores
the other 20 % (``held_out_table``). Collective-permutes are the send/recv (one pair each).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from small_collectives import KEYS, _err  # this folder's: the same keys, the same error cells

from paraplan.calibrate.collective_table import SMALL_BYTES, held_out_table
from paraplan.catalog import load_cluster

OPCODES = ("all-to-all", "collective-permute")
WAYS = ("before_s", "after_s")


def main(path: Path) -> None:
    frames = []
    print("median |err| %, signed median %: before (alpha-beta)   after (curve + small_s)")
    for key, node in KEYS.items():
        t = held_out_table(path, key, load_cluster(node), OPCODES)
        frames.append(t.assign(key=key))
        for (op, n), g in t.groupby(["opcode", "n"]):
            small = g[g.bytes <= SMALL_BYTES]
            size = f"small {small.measured_s.median() * 1e6:6.1f} us" if len(small) else "small      -   "
            print(f"{key:12s} {op:18s} {n:3d} {len(g):3d} calls, {size}: " + "   ".join(_err(g, w) for w in WAYS))
        for op, g in t.groupby("opcode"):
            print(f"{key:12s} {op:18s} all {len(g):3d} calls: " + "   ".join(_err(g, w) for w in WAYS))
    every = pd.concat(frames)
    for op, part in every.groupby("opcode"):
        bands = (("<= 64 KiB", part.bytes <= SMALL_BYTES), ("> 64 KiB", part.bytes > SMALL_BYTES),
                 ("64 KiB - 1 MiB", (part.bytes > SMALL_BYTES) & (part.bytes <= 2**20)),
                 ("1 - 64 MiB", (part.bytes > 2**20) & (part.bytes <= 2**26)), ("> 64 MiB", part.bytes > 2**26))
        for name, mask in bands:
            band = part[mask]
            print(f"all keys {op} {name} ({len(band)} held-out calls): "
                  + ", ".join(f"{w.removesuffix('_s')} {_err(band, w)}" for w in WAYS))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/xla_perf_tables/collectives.csv"))
