"""Worker functions the collective-sampler tests start in several CPU processes (gloo); a
module of their own so the spawned processes can import them."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from paraplan.profile.comm import CommConfig, point_key, run_sweep


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(worker, nprocs: int, *args, local_world: int | None = None) -> None:
    """Run ``worker(rank, *args)`` in ``nprocs`` processes set up as torchrun sets them up;
    ``local_world`` ranks per emulated node (default: all on one node)."""
    import torch.multiprocessing as mp

    mp.spawn(_entry, args=(nprocs, local_world or nprocs, free_port(), worker, args), nprocs=nprocs, join=True)


def _entry(rank, world, local_world, port, worker, args):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(local_world),
                      LOCAL_RANK=str(rank % local_world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      OMP_NUM_THREADS="1")
    worker(rank, *args)


def sweep_recording_buffers(rank: int, config: CommConfig, log: Path) -> None:
    """The sweep, with every all-gather's and reduce-scatter's buffer sizes written down."""
    import torch.distributed as dist

    calls = []

    def recorder(name, real):
        def call(output, input, *args, **kwargs):
            calls.append({"call": name, "out": output.numel() * output.element_size(),
                          "in": input.numel() * input.element_size()})
            return real(output, input, *args, **kwargs)
        return call

    for name in ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_single", "reduce_scatter_tensor"):
        if hasattr(dist, name):
            setattr(dist, name, recorder(name, getattr(dist, name)))
    run_sweep(config)
    Path(f"{log}.{rank}").write_text(json.dumps(calls))


def slow_rank(point, rank: int) -> None:
    if rank == 1:
        time.sleep(0.05)


def sweep_slow_rank(rank: int, config: CommConfig) -> None:
    run_sweep(config, hook=slow_rank)


def _first_calls(seen: list[str], limit: int | None = None):
    """A hook that writes down the keys of the points timed and kills the process (exit 9)
    as it starts timing point ``limit`` + 1."""

    def hook(point, rank):
        if point_key(point) not in seen:
            seen.append(point_key(point))
        if limit is not None and len(seen) > limit:
            os._exit(9)

    return hook


def sweep_killed(rank: int, config: CommConfig, after: int) -> None:
    """The sweep, every process killed as it starts timing point ``after`` + 1."""
    run_sweep(config, hook=_first_calls([], after))


def sweep_logging_points(rank: int, config: CommConfig, log: Path) -> None:
    """The sweep, the keys of the points this rank timed written down."""
    seen: list[str] = []
    run_sweep(config, hook=_first_calls(seen))
    Path(f"{log}.{rank}").write_text(json.dumps(seen))
