"""`paraplan profile comm`: time collectives over a size sweep, here (local processes), or
print the torchrun command, or write a SLURM batch script (paraplan.profile.comm runs it)."""

from __future__ import annotations

import enum
import shlex
import subprocess
from pathlib import Path
from typing import Annotated

import typer

from paraplan.cli.common import err, out, user_errors, write_text


class Launcher(str, enum.Enum):
    local = "local"
    torchrun = "torchrun"
    slurm = "slurm"


def _sweep_args(out_file: Path, min_bytes: str, max_bytes: str, factor: float, dtype: str, collectives: str,
                layouts: str, device: str, cluster_name: str, device_name: str, warmup: int, repeats: int, iters: int,
                force: bool) -> list[str]:
    args = ["--out", str(out_file), "--min-bytes", min_bytes, "--max-bytes", max_bytes, "--factor", f"{factor:g}",
            "--dtype", dtype, "--collectives", collectives, "--layouts", layouts, "--device", device,
            "--warmup", str(warmup), "--repeats", str(repeats), "--iters", str(iters)]
    if cluster_name:
        args += ["--cluster-name", cluster_name]
    if device_name:
        args += ["--device-name", device_name]
    return [*args, "--force"] if force else args


def comm_command(
    out_file: Annotated[Path, typer.Option("--out", "-o", help="Samples file to write (Parquet).")],
    launcher: Annotated[Launcher, typer.Option(help="local: run here; torchrun: print the command of each "
                                               "node; slurm: write a batch script.")] = Launcher.local,
    nproc_per_node: Annotated[int, typer.Option(help="Workers per node (one per GPU).", min=1)] = 2,
    nnodes: Annotated[int, typer.Option(help="Nodes (torchrun, slurm).", min=1)] = 1,
    min_bytes: Annotated[str, typer.Option(help="Smallest size (nccl-tests' convention).")] = "1 KiB",
    max_bytes: Annotated[str, typer.Option(help="Largest size.")] = "64 MiB",
    factor: Annotated[float, typer.Option(help="Step between sizes (2: 17 sizes from 1 KiB to 64 MiB; a regressor needs 10).")] = 2.0,
    dtype: Annotated[str, typer.Option(help="fp32, fp16, bf16 or auto (bf16 on GPUs, fp32 on CPU).")] = "auto",
    collectives: Annotated[str, typer.Option(help="'all' or a comma list (all_reduce,all_gather,...).")] = "all",
    layouts: Annotated[str, typer.Option(help="Groups: 'auto' or NODESxGPUS,... (1x8,2x8,2x1).")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cuda (NCCL) or cpu (gloo).")] = "auto",
    cluster_name: Annotated[str, typer.Option(help="Cluster the job runs on: a catalog name, or the name in "
                                              "the file you give `paraplan fit --cluster`.")] = "",
    device_name: Annotated[str, typer.Option(help="Catalog GPU to file the rows under (default: torch's "
                                             "name; cpu-core on CPU).")] = "",
    warmup: Annotated[int, typer.Option(min=0)] = 2,
    repeats: Annotated[int, typer.Option(min=1)] = 5,
    iters: Annotated[int, typer.Option(help="Calls per timing (1 once a call takes 10 ms).", min=1)] = 5,
    master_addr: Annotated[str, typer.Option(help="torchrun: the first node's address.")] = "$MASTER_ADDR",
    script: Annotated[Path | None, typer.Option(help="slurm: batch script to write [default: OUT.sbatch].")] = None,
    time_limit: Annotated[str, typer.Option("--time", help="slurm: the job's time limit.")] = "00:30:00",
    partition: Annotated[str | None, typer.Option(help="slurm: partition.")] = None,
    account: Annotated[str | None, typer.Option(help="slurm: account.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out (and --script).")] = False,
) -> None:
    """Time all-reduce, all-gather, reduce-scatter, all-to-all, broadcast and send/recv over
    a size sweep on groups within and across nodes; each point is the slowest rank's time.
    A killed sweep, started again with the same command, resumes from the journal beside --out."""
    from paraplan.profile.comm import validate_sweep
    from paraplan.profile.launch import local_command, sbatch_script, torchrun_command
    from paraplan.samples.store import check_samples_path
    from paraplan.specs import ConfigError

    with user_errors():
        check_samples_path(out_file, overwrite=force, flag="--force")
        validate_sweep(min_bytes, max_bytes, factor, dtype, collectives, layouts, device, nnodes, nproc_per_node)
        if launcher is Launcher.local and nnodes != 1:
            raise ConfigError(f"--nnodes {nnodes}: --launcher local runs on this machine only; "
                              "use --launcher torchrun or slurm")
        target = out_file.resolve() if launcher is Launcher.slurm else out_file
        args = _sweep_args(target, min_bytes, max_bytes, factor, dtype, collectives, layouts, device,
                           cluster_name, device_name, warmup, repeats, iters, force)
        if launcher is Launcher.torchrun:
            write_text(shlex.join(torchrun_command(nnodes, nproc_per_node, args, master_addr)))
            if nnodes > 1:
                err.print(f"run it on each of the {nnodes} nodes; {master_addr} is the first node's address",
                          highlight=False)
            return
        if launcher is Launcher.slurm:
            script = script or out_file.with_name(out_file.name + ".sbatch")
            check_samples_path(script, overwrite=force, flag="--force")
            script.write_text(sbatch_script(nnodes, nproc_per_node, args, gpus=device != "cpu",
                                            time_limit=time_limit, partition=partition, account=account))
            write_text(f"sbatch {shlex.quote(str(script))}")
            err.print(f"wrote {script}; submit it with the command above", highlight=False)
            return
        code = subprocess.run(local_command(nproc_per_node, args), check=False).returncode
        if code != 0:
            raise ConfigError(f"the sampler's processes failed (exit {code}); their messages are above")
        _summary(out_file)


def _summary(out_file: Path) -> None:
    from paraplan.report.profile_comm import comm_summary_rows, render_comm_summary
    from paraplan.samples import load_samples

    frame = load_samples(out_file)
    seconds = frame.attrs["samples_metadata"].get("sweep_s")
    title = f"{out_file}: {len(frame)} collective timings" + (f" ({seconds:.1f} s)" if seconds else "")
    out.print(render_comm_summary(comm_summary_rows(frame), title))

