"""The collective sampler: time NCCL (GPUs) or gloo (CPU) collectives over a size sweep and
write them as sample records. Run it on every rank of a job::

    torchrun --nnodes 2 --nproc-per-node 8 -m paraplan.profile.comm --out net.samples
    paraplan profile comm --launcher local|torchrun|slurm ...    # the same, launched for you

It reads torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``), times
all-reduce, all-gather, reduce-scatter, all-to-all, broadcast and send/recv on groups within a
node and across nodes (:mod:`paraplan.profile.sweep`), each as the slowest rank's time
(:mod:`paraplan.profile.comm_timing`), and rank 0 appends each point to a journal
(:mod:`paraplan.profile.records`) the moment it is measured. A killed sweep, restarted with the
same command, skips the points already measured; at the end rank 0 writes ``--out`` (Parquet).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from paraplan.inventory import CollectiveKind
from paraplan.profile.comm_timing import CommGroups, TimingSettings, time_point
from paraplan.profile.ops import default_device_name
from paraplan.profile.records import RecordStore, journal_path
from paraplan.profile.sweep import ALL_KINDS, Point, parse_layouts, sweep_points, sweep_sizes
from paraplan.samples.store import check_samples_path
from paraplan.specs import ConfigError, Precision
from paraplan.units import UnitError, parse_bytes

__all__ = ["CommConfig", "collective_row", "device_name", "main", "parse_args", "point_key", "run_sweep", "validate_sweep"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommConfig:
    """One sweep, as the command line gives it."""

    out: Path
    min_bytes: int = 1024
    max_bytes: int = 64 * 2**20
    factor: float = 2.0
    dtype: str = "auto"  # bf16 on GPUs, fp32 on CPU
    kinds: tuple[CollectiveKind, ...] = ALL_KINDS
    layouts: str = "auto"
    device: str = "auto"  # cuda when torch sees a GPU, else cpu
    cluster: str = ""
    device_name: str = ""  # default: the operator sampler's name for the device
    force: bool = False
    timing: TimingSettings = field(default_factory=TimingSettings)


@dataclass(frozen=True)
class _Job:
    rank: int
    world: int
    local_world: int

    @property
    def nodes(self) -> int:
        return self.world // self.local_world


def point_key(point: Point) -> str:
    """The journal key of a point: ``all_gather/2x8/bf16/1048576``."""
    return f"{point.kind.value}/{point.layout}/{point.dtype.value}/{point.bytes}"


def collective_row(point: Point, time_s: float, device: str, cluster: str) -> dict[str, Any]:
    """The schema row of one measured point (``source`` and ``row`` are the journal's)."""
    return {
        "kind": "collective", "name": point.kind.value, "variant": "", "phase": "",
        "bytes": point.bytes, "nodes": point.layout.nodes, "gpus_per_node": point.layout.gpus_per_node,
        "dtype": point.dtype.value, "device": device, "cluster": cluster, "time_s": time_s,
    }


def _job_from_env() -> _Job:
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        raise ConfigError("RANK and WORLD_SIZE are not set: run under torchrun "
                          "(torchrun --nproc-per-node N -m paraplan.profile.comm ...)") from None
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world < 2:
        raise ConfigError(f"WORLD_SIZE {world}: a collective needs at least 2 ranks")
    if local < 1 or world % local:
        raise ConfigError(f"WORLD_SIZE {world} is not a whole number of nodes of LOCAL_WORLD_SIZE {local}")
    return _Job(rank, world, local)


def _device(config: CommConfig, job: _Job) -> Any:
    import torch

    kind = config.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: torch sees no GPU")
        index = int(os.environ.get("LOCAL_RANK", job.rank % job.local_world))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if kind != "cpu":
        raise ConfigError(f"--device {kind!r}: expected auto, cuda or cpu")
    return torch.device("cpu")


def device_name(config: CommConfig, device: Any) -> str:
    """The ``device`` column: ``--device-name``, else what the operator sampler files its rows
    under (torch's GPU name; ``cpu-core`` for processes on CPU cores)."""
    return config.device_name or default_device_name(str(device))


def _dtype(config: CommConfig, device: Any) -> Precision:
    name = config.dtype if config.dtype != "auto" else ("bf16" if device.type == "cuda" else "fp32")
    if name not in ("fp32", "fp16", "bf16"):
        raise ConfigError(f"--dtype {name!r}: expected fp32, fp16 or bf16")
    return Precision(name)


def _header(config: CommConfig, job: _Job, points: list[Point], device: str) -> dict[str, Any]:
    """What the journal is a journal of: a restart with another sweep is refused."""
    return {
        "sampler": "paraplan.profile.comm", "device": device, "cluster": config.cluster,
        "world_size": job.world, "local_world_size": job.local_world,
        "points": len(points), "first": point_key(points[0]), "last": point_key(points[-1]),
        "timing": asdict(config.timing),
    }


def run_sweep(
    config: CommConfig,
    hook: Callable[[Point, int], None] | None = None,
    progress: Callable[[int, int, Point], None] | None = None,
) -> Path | None:
    """Run the sweep on this rank of an initialised-by-environment job (torchrun's variables;
    the process group is created here and destroyed at the end). Rank 0 returns the samples
    file it wrote, the others None. ``hook(point, rank)`` runs inside every timed region
    (tests inject a slow rank with it); ``progress(done, total, point)`` on rank 0."""
    import torch.distributed as dist

    job = _job_from_env()
    device = _device(config, job)
    points = sweep_points(
        config.kinds,
        parse_layouts(config.layouts, job.nodes, job.local_world),
        _dtype(config, device),
        sweep_sizes(config.min_bytes, config.max_bytes, config.factor),
    )
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=job.rank, world_size=job.world,
                            **({"device_id": device} if device.type == "cuda" else {}))
    try:
        return _sweep(config, job, device, points, hook, progress)
    finally:
        dist.destroy_process_group()


def _open_store(config: CommConfig, header: dict[str, Any]) -> RecordStore:
    check_samples_path(config.out, overwrite=config.force, flag="--force")
    return RecordStore(journal_path(config.out), header)


def _sweep(config, job, device, points, hook, progress) -> Path | None:
    import torch.distributed as dist

    name = device_name(config, device)
    store, message = None, None
    if job.rank == 0:
        try:
            store = _open_store(config, _header(config, job, points, name))
        except ConfigError as exc:
            message = str(exc)
    try:
        # rank 0's verdict and the points it has already: every rank stops, or skips the same
        shared = [(message, sorted(store.done_keys()) if store is not None else [])]
        dist.broadcast_object_list(shared, src=0)
        message, done = shared[0]
        if message is not None:
            raise ConfigError(message)
        done_keys = set(done)
        todo = [p for p in points if point_key(p) not in done_keys]
        groups = CommGroups(job.local_world)
        start = time.perf_counter()
        for i, point in enumerate(todo, 1):
            timing = time_point(point, groups, device, config.timing, hook)
            if store is not None:
                row = collective_row(point, timing.time_s, name, config.cluster)
                store.append(row, key=point_key(point), extra={"repeats_s": list(timing.repeats_s)})
                if progress is not None:
                    progress(i, len(todo), point)
        if store is None:
            return None
        store.finalize(config.out, {
            "importer": "paraplan.profile.comm", "sources": [store.path.name],
            "backend": dist.get_backend(), "world_size": job.world, "local_world_size": job.local_world,
            "timing": asdict(config.timing) | {"reduction": "median of repeats of the slowest rank"},
            "sweep_s": round(time.perf_counter() - start, 3),
        }, overwrite=config.force)
        return config.out
    finally:
        if store is not None:
            store.close()


def validate_sweep(min_bytes: str, max_bytes: str, factor: float, dtype: str, collectives: str, layouts: str,
                   device: str, nnodes: int, nproc_per_node: int) -> None:
    """Check a command line's sweep before any process is launched (a ConfigError or a
    UnitError naming the flag)."""
    sweep_sizes(int(parse_bytes(min_bytes)), int(parse_bytes(max_bytes)), factor)
    if dtype not in ("auto", "fp32", "fp16", "bf16"):
        raise ConfigError(f"--dtype {dtype!r}: expected auto, fp32, fp16 or bf16")
    if device not in ("auto", "cuda", "cpu"):
        raise ConfigError(f"--device {device!r}: expected auto, cuda or cpu")
    try:
        _kinds(collectives)
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"--collectives {exc}") from None
    if nnodes * nproc_per_node < 2:
        raise ConfigError(f"{nnodes} node(s) x {nproc_per_node} process(es): a collective needs at least 2 ranks")
    parse_layouts(layouts, nnodes, nproc_per_node)


def _size(text: str) -> int:
    try:
        return int(parse_bytes(text))
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _kinds(text: str) -> tuple[CollectiveKind, ...]:
    if text == "all":
        return ALL_KINDS
    try:
        return tuple(CollectiveKind(k.strip()) for k in text.split(","))
    except ValueError:
        names = ", ".join(k.value for k in ALL_KINDS)
        raise argparse.ArgumentTypeError(f"{text!r}: expected 'all' or some of {names}") from None


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", "-o", type=Path, required=True, help="samples file to write (rank 0)")
    parser.add_argument("--min-bytes", type=_size, default=1024, help="smallest size (default 1 KiB)")
    parser.add_argument("--max-bytes", type=_size, default=64 * 2**20, help="largest size (default 64 MiB)")
    parser.add_argument("--factor", type=float, default=2.0, help="size step (default 2: 17 sizes to 64 MiB)")
    parser.add_argument("--dtype", default="auto", help="fp32, fp16, bf16 (default: bf16 on GPUs, fp32 on CPU)")
    parser.add_argument("--collectives", type=_kinds, default=ALL_KINDS, help="'all' or a comma list")
    parser.add_argument("--layouts", default="auto", help="'auto' or NODESxGPUS,... (e.g. 1x8,2x8,2x1)")
    parser.add_argument("--device", default="auto", help="auto, cuda or cpu")
    parser.add_argument("--cluster-name", default="", help="cluster the job runs on (paraplan fit: a catalog name "
                        "or the name in a --cluster file)")
    parser.add_argument("--device-name", default="", help="catalog GPU to file the rows under "
                        "(default: torch's name; cpu-core on CPU)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iters", type=int, default=5, help="calls per timing (1 once a call takes 10 ms)")
    parser.add_argument("--force", action="store_true", help="replace an existing --out")


def parse_args(argv: Sequence[str] | None = None) -> CommConfig:
    parser = argparse.ArgumentParser(prog="python -m paraplan.profile.comm", description=__doc__.split("\n\n")[0])
    add_sweep_arguments(parser)
    a = parser.parse_args(argv)
    if min(a.warmup, a.repeats - 1, a.iters - 1) < 0:
        parser.error("--warmup must be >= 0, --repeats and --iters >= 1")
    return CommConfig(
        out=a.out, min_bytes=a.min_bytes, max_bytes=a.max_bytes, factor=a.factor, dtype=a.dtype,
        kinds=a.collectives, layouts=a.layouts, device=a.device, cluster=a.cluster_name,
        device_name=a.device_name, force=a.force,
        timing=TimingSettings(warmup=a.warmup, repeats=a.repeats, iters=a.iters),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m paraplan.profile.comm``: 0 when done, 2 on bad input (one line, rank 0)."""
    config = parse_args(argv)

    def report(done: int, total: int, point: Point) -> None:
        log.info("%d/%d %s", done, total, point_key(point))

    try:
        out = run_sweep(config, progress=report)
    except ConfigError as exc:
        if os.environ.get("RANK", "0") == "0":
            log.error("error: %s", exc)
        return 2
    if out is not None:
        log.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO if os.environ.get("RANK", "0") == "0" else logging.WARNING,
                        format="%(message)s")
    sys.exit(main())
