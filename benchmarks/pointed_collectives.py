"""All-reduce, all-gather and reduce-scatter inside a node against XLA's measured table: the
fitted curve alone (before) and the curve with its measured points (after), per GPU key,
collective and size band, on held-out rows.

    python benchmarks/pointed_collectives.py [../shared/data/xla_perf_tables/collectives.csv]

Both fit the curve as ``paraplan calibrate collective-table`` does on 80 % of the rows (a seeded
draw of whole message sizes, so a held-out size is priced between its measured neighbours, or
beyond the last one, never from its own rows) and score the other 20 %; "after" also keeps the
training rows' median call per group and size (``CollectiveCurve.points``;
``pointed_held_out_table``). Five draws (seeds 0-4), their held-out calls pooled.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from small_collectives import KEYS, _err  # this folder's: the same keys, the same error cells

from paraplan.calibrate.collective_table import pointed_held_out_table
from paraplan.catalog import load_cluster

OPCODES = ("all-reduce", "all-gather", "reduce-scatter")
WAYS = ("before_s", "after_s")
SEEDS = range(5)
BANDS = (("1 - 64 MiB", 2**20, 2**26), ("64 MiB - 1 GiB", 2**26, 2**30), ("> 1 GiB", 2**30, float("inf")))


def main(path: Path) -> None:
    frames = []
    print("median |err| %, signed median %: before (curve)   after (curve + measured points)")
    for key, node in KEYS.items():
        t = pd.concat([pointed_held_out_table(path, key, load_cluster(node), OPCODES, seed=seed) for seed in SEEDS]).assign(key=key)
        frames.append(t)
        for op, part in t.groupby("opcode"):
            for name, lo, hi in BANDS:
                band = part[(part.bytes > lo) & (part.bytes <= hi)] if lo > 2**20 else part[part.bytes <= hi]
                if len(band):
                    print(f"{key:12s} {op:14s} {name:14s} {len(band):4d} calls: "
                          + "   ".join(_err(band, w) for w in WAYS))
    every = pd.concat(frames)
    for op, part in every.groupby("opcode"):
        for name, lo, hi in BANDS:
            band = part[(part.bytes > lo) & (part.bytes <= hi)] if lo > 2**20 else part[part.bytes <= hi]
            print(f"all keys {op} {name} ({len(band)} held-out calls): "
                  + ", ".join(f"{w.removesuffix('_s')} {_err(band, w)}" for w in WAYS))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/xla_perf_tables/collectives.csv"))
