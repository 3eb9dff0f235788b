"""Train a tiny GPT on the CPU over a few processes (gloo) and record profiler traces.

    python -m paraplan.traces.tinyrun --mode ddp --nproc 2 --out runs/ddp

writes one Chrome trace per rank (`rank0.json.gz`, ...) and `timers.json`, the wall-clock time
of every profiled iteration on every rank as the training loop measured it: the ground truth the
trace decoder is checked against. Modes: `ddp` (DistributedDataParallel), `fsdp` (fully_shard,
FSDP2) and `pipeline` (a GPipe schedule over `nproc` stages, torch.distributed.pipelining).
torch is imported inside the functions, as everywhere in paraplan.

The processes meet through a file store in a fresh temporary folder (no TCP port to race for)
and write Python's faulthandler output there: a process that dies of a signal (gloo aborts the
process when a socket fails under it) raises `TinyRunCrashed` with the rank, the signal, the
mode it was running and its Python stack, never a bare "process 1 terminated".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from paraplan.specs import ConfigError

MODES = ("ddp", "fsdp", "pipeline")
TIMERS_FILE = "timers.json"


class TinyRunCrashed(RuntimeError):
    """A worker process died of a signal: ``rank``, ``signal_name`` and what it had written
    (the mode it was running, faulthandler's Python stack of every thread) in ``fault_log``."""

    def __init__(self, rank: int, signal_name: str, fault_log: str):
        self.rank, self.signal_name, self.fault_log = rank, signal_name, fault_log
        lines = fault_log.splitlines()
        modes = [line for line in lines if line.startswith("mode ")]
        crashed = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), len(lines))
        frame = next((line.strip() for line in lines[crashed:] if line.strip().startswith("File ")), "")
        super().__init__(f"tiny run: process {rank} died of {signal_name} "
                         f"({modes[-1] if modes else 'before any mode'}{'; at ' + frame if frame else ''})")


def record_run(
    mode: str,
    out: Path,
    *,
    nproc: int = 2,
    active: int = 5,
    num_layers: int = 2,
    shapes: bool = True,
    force: bool = False,
    profile: bool = True,
    model: dict | None = None,
) -> Path:
    """Spawn `nproc` gloo processes that train and profile; return the directory of traces.
    ``profile=False`` times the iterations without the profiler (timers.json only); ``model``
    overrides TinyConfig's other fields (hidden_size, seq_length, micro_batch_size, ...)."""
    return record_runs({mode: out}, nproc=nproc, active=active, num_layers=num_layers, shapes=shapes, force=force,
                       profile=profile, model=model)[0]


def record_runs(
    runs: dict[str, Path],
    *,
    nproc: int = 2,
    wait: int = 1,
    warmup: int = 2,
    active: int = 5,
    num_layers: int = 2,
    shapes: bool = True,
    force: bool = False,
    profile: bool = True,
    model: dict | None = None,
) -> list[Path]:
    """Several modes, one after the other in the same processes (`{"ddp": dir, ...}`): the
    processes start and import torch once."""
    import dataclasses

    from paraplan.traces.tinygpt import TinyConfig

    for mode in runs:
        if mode not in MODES:
            raise ConfigError(f"--mode {mode!r}: choose one of {', '.join(MODES)}")
    if nproc < 1 or (nproc < 2 and "pipeline" in runs):
        raise ConfigError(f"--nproc {nproc}: {'a pipeline needs' if nproc >= 1 else 'needs'} at least "
                          f"{2 if nproc >= 1 else 1} process{'es' if nproc >= 1 else ''}")
    known = {f.name for f in dataclasses.fields(TinyConfig)} - {"num_layers"}
    for key, value in (model or {}).items():
        if key not in known:
            raise ConfigError(f"model.{key}: not a TinyConfig field (known: {', '.join(sorted(known))})")
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"model.{key}: expected a positive integer (got {value!r})")
    if num_layers < 1 or (num_layers % nproc and "pipeline" in runs):
        raise ConfigError(f"--layers {num_layers}: a pipeline needs a multiple of --nproc ({nproc})")
    cfg = TinyConfig(num_layers=num_layers, **(model or {}))
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ConfigError(f"--hidden {cfg.hidden_size}: not a multiple of the {cfg.num_attention_heads} heads")
    outs = [Path(out) for out in runs.values()]
    for out in outs:
        if out.exists() and any(out.iterdir()) and not force:
            raise ConfigError(f"{out}: exists and is not empty (use --force to write over it)")
    for out in outs:
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("rank*.json*"):
            old.unlink()
    jobs = [
        ({"mode": m, "nproc": nproc, "wait": wait, "warmup": warmup, "active": active, "shapes": shapes,
          "profile": profile}, str(o))
        for m, o in zip(runs, outs, strict=True)
    ]
    spawn(_worker, nproc, jobs, cfg)
    return outs


def spawn(worker, nproc: int, *args) -> None:
    """Run ``worker(rank, nproc, meet, *args)`` in ``nproc`` fresh processes; ``meet`` is a
    temporary folder for the file store and each rank's ``rank{r}.fault`` (faulthandler's
    output). A process killed by a signal raises `TinyRunCrashed` with what it wrote there."""
    import torch.multiprocessing as mp

    meet = Path(tempfile.mkdtemp(prefix="paraplan-tinyrun-"))
    try:
        mp.spawn(worker, args=(nproc, str(meet), *args), nprocs=nproc, join=True)
    except mp.ProcessExitedException as exc:
        if exc.signal_name is None:
            raise
        log = meet / f"rank{exc.error_index}.fault"
        raise TinyRunCrashed(exc.error_index, exc.signal_name,
                             log.read_text(errors="replace") if log.exists() else "") from None
    finally:
        shutil.rmtree(meet, ignore_errors=True)


def _worker(rank: int, world: int, meet: str, jobs: list, cfg) -> None:
    import faulthandler

    import torch
    import torch.distributed as dist

    with open(Path(meet) / f"rank{rank}.fault", "w", buffering=1) as fault:
        faulthandler.enable(fault, all_threads=True)
        try:  # faulthandler is off again before the file closes, however this ends
            torch.set_num_threads(1)
            dist.init_process_group("gloo", init_method=f"file://{meet}/store", rank=rank, world_size=world)
            for settings, out in jobs:
                fault.write(f"mode {settings['mode']}\n")
                _profile_one(rank, world, Path(out), settings, cfg)
                dist.barrier()
            fault.write("mode (all done)\n")
        finally:
            faulthandler.disable()
    # Every trace and timer file is written and closed, and every rank has passed the last
    # barrier: leave without gloo's teardown, which now and then aborts the process
    # ("terminate called without an active exception", SIGABRT) while its threads wind down
    # (destroy_process_group or the interpreter's exit alike). An exception above propagates to
    # torch.multiprocessing, which reports its traceback.
    os._exit(0)


def _profile_one(rank: int, world: int, out: Path, settings: dict, cfg) -> None:
    from torch.profiler import ProfilerActivity, profile, schedule

    from paraplan.traces.tinygpt import build_step

    step = build_step(settings["mode"], cfg, rank, world)
    wait, warmup, active = settings["wait"], settings["warmup"], settings["active"]
    trace = out / f"rank{rank}.json.gz"
    timers: list[dict] = []
    if not settings.get("profile", True):
        _time_only(step, wait + warmup, active, timers)
        _write_timers(rank, world, out, settings, cfg, timers)
        return
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=settings["shapes"],  # gives the collectives' bytes (and triples the size)
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(trace)),
    ) as prof:
        for n in range(wait + warmup + active):
            t0 = time.perf_counter()
            loss = step()
            t1 = time.perf_counter()
            if n >= wait + warmup:
                timers.append({"step": n, "seconds": t1 - t0, "loss": loss})
            prof.step()
    _write_timers(rank, world, out, settings, cfg, timers)


def _time_only(step, skip: int, active: int, timers: list[dict]) -> None:
    """Run ``skip`` warm-up iterations, then time ``active`` ones, without the profiler."""
    for n in range(skip + active):
        t0 = time.perf_counter()
        loss = step()
        t1 = time.perf_counter()
        if n >= skip:
            timers.append({"step": n, "seconds": t1 - t0, "loss": loss})


def _write_timers(rank: int, world: int, out: Path, settings: dict, cfg, timers: list[dict]) -> None:
    import torch
    import torch.distributed as dist

    gathered: list = [None] * world
    dist.all_gather_object(gathered, timers)
    if rank == 0:
        what = "profiled" if settings.get("profile", True) else "unprofiled"
        record = {
            **settings,
            "model": asdict(cfg),
            "torch": torch.__version__,
            "what": f"wall-clock seconds of each {what} iteration (time.perf_counter around the step)",
            "ranks": {str(r): t for r, t in enumerate(gathered)},
        }
        (out / TIMERS_FILE).write_text(json.dumps(record, indent=1) + "\n")


def load_timers(directory: Path) -> dict[int, dict[int, float]]:
    """rank -> step number -> wall-clock seconds, from a run's `timers.json`."""
    record = json.loads((Path(directory) / TIMERS_FILE).read_text())
    return {int(r): {t["step"]: t["seconds"] for t in steps} for r, steps in record["ranks"].items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m paraplan.traces.tinyrun", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=MODES, default="ddp")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--active", type=int, default=5, help="profiled iterations")
    parser.add_argument("--layers", type=int, default=2, help="transformer layers (a multiple of --nproc)")
    parser.add_argument(
        "--no-shapes", dest="shapes", action="store_false", help="record no shapes: a third of the size, no bytes"
    )
    parser.add_argument("--no-profile", dest="profile", action="store_false", help="only time the iterations")
    for flag, field, default in (("--hidden", "hidden_size", 64), ("--heads", "num_attention_heads", 4),
                                 ("--seq", "seq_length", 64), ("--micro-batch", "micro_batch_size", 4)):
        parser.add_argument(flag, dest=field, type=int, default=default)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--force", action="store_true", help="write over a non-empty --out")
    args = parser.parse_args(argv)
    model = {k: getattr(args, k) for k in ("hidden_size", "num_attention_heads", "seq_length", "micro_batch_size")}
    try:
        record_run(
            args.mode, args.out, nproc=args.nproc, active=args.active, num_layers=args.layers,
            shapes=args.shapes, force=args.force, profile=args.profile, model=model,
        )
    except ConfigError as exc:
        parser.exit(2, f"error: {exc}\n")


if __name__ == "__main__":
    main()
