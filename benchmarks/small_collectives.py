"""Small collectives against XLA's measured table: the curves' extrapolation, NCCL's LL model and
the measured small-call time, per GPU key, collective and group size (held-out rows).

    python benchmarks/small_collectives.py [../shared/data/xla_perf_tables/collectives.csv]

"curve" prices a call by the catalog curve's extrapolation (moved / bus(S), fitted on messages of
at least fit_bytes: the model before small_s); "nccl" by NCCL's LL model (``nccl_ll_latency_s``);
"small_s" by the curve with its small-call times, those fitted on 80 % of the rows (a seeded
draw of whole message sizes) and scored on the other 20 % (``small_call_table``). Calls of at
most 64 KiB, then the band from 64 KiB to the curve's fitted sizes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from paraplan.calibrate.collective_table import SMALL_BYTES, small_call_table
from paraplan.catalog import load_cluster

KEYS = {"sm_90": "dgx-h100", "sm_100_B200": "dgx-b200", "sm_100_GB200": "gb200-nvl72",
        "sm_103": "gb300-nvl72", "gfx942": "azure-nd-mi300x-v5", "gfx950": "crusoe-mi355x"}
WAYS = ("curve_s", "nccl_s", "small_s")


def _err(frame: pd.DataFrame, way: str) -> str:
    e = frame[way] / frame.measured_s - 1.0
    return f"{np.median(np.abs(e)) * 100:6.1f} {np.median(e) * 100:+7.1f}"


def main(path: Path) -> None:
    frames = []
    print("median |err| %, signed median %: curve   nccl   small_s")
    for key, node in KEYS.items():
        t = small_call_table(path, key, load_cluster(node))
        frames.append(t.assign(key=key))
        for (op, n), g in t[t.bytes <= SMALL_BYTES].groupby(["opcode", "n"]):
            print(f"{key:12s} {op:14s} {n:3d} {len(g):3d} calls, measured {g.measured_s.median() * 1e6:6.1f} us: "
                  + " ".join(_err(g, w) for w in WAYS))
    every = pd.concat(frames)
    for name, part in (("<= 64 KiB", every[every.bytes <= SMALL_BYTES]),
                       ("64 KiB - fitted sizes", every[every.bytes > SMALL_BYTES])):
        print(f"all held-out calls {name} ({len(part)}): "
              + ", ".join(f"{w} {_err(part, w)}" for w in WAYS if w != "nccl_s" or name.startswith("<=")))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/xla_perf_tables/collectives.csv"))
