"""How the collective sampler is launched: the torchrun command of one machine or of each
node, and a SLURM batch script (text only; the CLI runs or writes them).

The batch script is the one users of Megatron-LM and torchtitan write: one task per node
(``--ntasks-per-node=1``) runs ``torchrun`` with one worker per GPU, the c10d rendezvous on
the first node of the allocation (``scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n
1``) and the job id as rendezvous id, under ``srun``.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence

__all__ = ["RDZV_PORT", "SAMPLER_MODULE", "local_command", "sbatch_script", "torchrun_command"]

RDZV_PORT = 29500
SAMPLER_MODULE = "paraplan.profile.comm"


def local_command(nproc_per_node: int, sweep_args: Sequence[str], python: str | None = None) -> list[str]:
    """torchrun on this machine only (``--standalone``: its own rendezvous on a free port)."""
    return [python or sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc_per_node}", "-m", SAMPLER_MODULE, *sweep_args]


def torchrun_command(nnodes: int, nproc_per_node: int, sweep_args: Sequence[str], master_addr: str,
                     port: int = RDZV_PORT) -> list[str]:
    """The command to run on every node of a ``nnodes``-node job (rendezvous at
    ``master_addr:port``, the first node)."""
    if nnodes == 1:
        return ["torchrun", "--standalone", f"--nproc-per-node={nproc_per_node}", "-m", SAMPLER_MODULE, *sweep_args]
    return ["torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={master_addr}:{port}", "--rdzv-id=paraplan-comm", "-m", SAMPLER_MODULE, *sweep_args]


def _flag_lines(args: Sequence[str]) -> list[str]:
    """``--flag value`` pairs, one to a line, quoted for the shell."""
    lines: list[list[str]] = []
    for arg in args:
        if arg.startswith("-") or not lines:
            lines.append([])
        lines[-1].append(shlex.quote(arg))
    return [" ".join(line) for line in lines]


def sbatch_script(
    nnodes: int,
    nproc_per_node: int,
    sweep_args: Sequence[str],
    *,
    gpus: bool = True,
    time_limit: str = "00:30:00",
    partition: str | None = None,
    account: str | None = None,
    job_name: str = "paraplan-comm",
) -> str:
    """A SLURM batch script that runs the sampler on ``nnodes`` nodes of ``nproc_per_node``
    workers. ``sweep_args`` should name ``--out`` by an absolute path on a shared file system
    (rank 0 writes it)."""
    head = ["#!/bin/bash", f"#SBATCH --job-name={job_name}", f"#SBATCH --nodes={nnodes}",
            "#SBATCH --ntasks-per-node=1"]
    if gpus:
        head.append(f"#SBATCH --gpus-per-node={nproc_per_node}")
    head += ["#SBATCH --exclusive", f"#SBATCH --time={time_limit}", "#SBATCH --output=%x-%j.out"]
    if partition is not None:
        head.append(f"#SBATCH --partition={partition}")
    if account is not None:
        head.append(f"#SBATCH --account={account}")
    sweep = " \\\n    ".join(_flag_lines(sweep_args))
    body = [
        "",
        "# paraplan's collective sampler: a size sweep of NCCL collectives within and across nodes,",
        "# the slowest rank's time of each. Submitted again, it resumes from the journal beside --out.",
        "set -euo pipefail",
        "",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_ADDR",
        f"export MASTER_PORT={RDZV_PORT}",
        "",
        "srun --ntasks-per-node=1 torchrun \\",
        '    --nnodes="$SLURM_NNODES" \\',
        f"    --nproc-per-node={nproc_per_node} \\",
        '    --rdzv-id="$SLURM_JOB_ID" \\',
        "    --rdzv-backend=c10d \\",
        '    --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" \\',
        f"    -m {SAMPLER_MODULE} \\",
        f"    {sweep}",
    ]
    return "\n".join(head + body) + "\n"
