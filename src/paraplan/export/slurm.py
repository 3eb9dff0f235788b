"""A plan as a SLURM batch script that launches Megatron-LM's ``pretrain_gpt.py`` with torchrun.

One task per node (``--ntasks-per-node=1``) runs ``torchrun`` with one worker per GPU and the
c10d rendezvous on the first node (``--rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500``).
The Megatron-LM arguments are those of :mod:`paraplan.export.megatron`.

``--time`` is the predicted time to train ``train_tokens`` times :data:`TIME_MARGIN`, rounded up
to the minute: the analytical backend under-predicts the published Selene runs by up to 12.7 %
(README, Validation), and start-up, checkpointing and evaluation come on top. Without
``train_tokens`` the script carries ``--time=EDIT-ME``, which sbatch rejects until it is edited.
The data arguments default to Megatron-LM's ``--mock-data`` with ``NullTokenizer`` (the plan's
vocabulary size), so the script measures the predicted iteration time as it is; the optimiser
values are marked placeholders.

Checkpoints and resume (``CKPT_ARGS``): ``--save`` and ``--load`` name the same folder, so the same
script submitted again (or chained with ``sbatch --dependency=afterany:<jobid>``) resumes from the
latest checkpoint there; Megatron-LM starts from iteration 0 when the folder holds none.
``--save-interval`` is about :data:`SAVE_EVERY_S` of predicted iterations, and
``--exit-duration-in-mins`` makes Megatron-LM save and exit :data:`EXIT_BEFORE_S` before
``--time`` runs out. The flag names are those of ``CheckpointConfig`` and ``TrainingConfig`` in
NVIDIA/Megatron-LM ``megatron/training/config/training_config.py`` (commit 008e9cd, 2026), from
which Megatron-LM builds its command line (``ArgumentGroupFactory``: ``save_interval`` is
``--save-interval``).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from paraplan.export import megatron
from paraplan.export._common import (
    EDIT,
    NOTE,
    PLACEHOLDER,
    check_prediction,
    comment,
    format_duration,
    header_lines,
)
from paraplan.specs import Framework, Job

if TYPE_CHECKING:
    from paraplan.prediction import Prediction

TIME_MARGIN = 1.15
RDZV_PORT = 29500
SAVE_EVERY_S = 3600.0  # a checkpoint about every hour of predicted training
EXIT_BEFORE_S = 900.0  # save and exit this long before --time ends the job


def notes(job: Job, prediction: Prediction | None = None) -> list[str]:
    """The Megatron-LM notes, plus what the batch script itself cannot promise."""
    out = megatron.notes(job, prediction)
    walltime = _walltime_s(job, prediction)
    if walltime is not None and walltime > 2 * 86400:
        out.append(f"--time is {format_duration(walltime)}; most clusters cap a job's walltime (often 1-2 days): "
                   "split the run into chained jobs: set --time to the cap and --exit-duration-in-mins 15 min below "
                   "it, and submit this script again with sbatch --dependency=afterany:<jobid>; each job resumes "
                   "from the checkpoints in CKPT_DIR (--save/--load)")
    return out


def render_slurm(job: Job, prediction: Prediction | None = None) -> str:
    """The batch script text. Without a prediction and with ``train_tokens``, one is made here."""
    check_prediction(job, prediction)
    if prediction is None and job.train_tokens is not None:
        from paraplan.prediction.entry import predict_any

        prediction = predict_any(job)
    c, p = job.cluster, job.parallel
    walltime = _walltime_s(job, prediction)
    if walltime is None:
        time_line = f"#SBATCH --time={PLACEHOLDER}"
        time_note = f"{EDIT} --time: the job has no train_tokens, so paraplan cannot predict the walltime"
    else:
        time_line = f"#SBATCH --time={_slurm_time(walltime)}"
        time_note = (f"--time = predicted time to train x {TIME_MARGIN} margin "
                     f"({format_duration(prediction.time_to_train_s)} x {TIME_MARGIN})")

    head = ["#!/bin/bash"]
    head += [f"#SBATCH --job-name={_job_name(job.name)}",
             f"#SBATCH --nodes={c.num_nodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={c.gpus_per_node}",
             "#SBATCH --exclusive",
             time_line,
             "#SBATCH --output=%x-%j.out"]
    about = header_lines(job, prediction, f"SLURM batch script for Megatron-LM ({megatron.TARGET})",
                         Framework.MEGATRON)
    about.append(time_note)
    about += [
        "Resume: --save and --load (CKPT_ARGS) name one folder; submitted again, or chained with",
        "  sbatch --dependency=afterany:<jobid> <this script>, the job loads the latest checkpoint there",
        "  (Megatron-LM starts from iteration 0 when there is none). Keep --ckpt-format and the data",
        "  arguments when resuming; --exit-duration-in-mins saves and exits before --time runs out.",
    ]
    about += [f"{NOTE} {n}" for n in notes(job, prediction)]
    about.append(f"{EDIT} add #SBATCH --partition/--account lines for your cluster")

    env = [
        "set -euo pipefail",
        "",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_ADDR",
        f"export MASTER_PORT={RDZV_PORT}",
    ]
    if (p.tp > 1 or p.cp > 1) and p.zero_stage < 2:
        env.append("export CUDA_DEVICE_MAX_CONNECTIONS=1   # Megatron-LM asserts it with tp>1 or cp>1 "
                   "(before Blackwell)")
    env += ["", f"# {EDIT} where Megatron-LM is checked out",
            'MEGATRON_LM_DIR=${MEGATRON_LM_DIR:-$HOME/Megatron-LM}']

    args = megatron.render_megatron(job, prediction)
    args_block = "\n".join(line for line in args.splitlines() if not line.startswith("#"))
    data = [
        f"# {EDIT} data and tokenizer: --mock-data runs synthetic tokens (checks the predicted iteration time);",
        "# replace with --data-path <prefix> --split 99,1,0 --tokenizer-type <type> --tokenizer-model <path>",
        "DATA_ARGS=(",
        "    --mock-data",
        f"    --tokenizer-type NullTokenizer --vocab-size {job.model.vocab_size}",
        ")",
        f"# {EDIT} optimiser and schedule: placeholders, not part of the plan",
        "TRAIN_ARGS=(",
        "    --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine --lr-warmup-fraction 0.01",
        "    --weight-decay 0.1 --adam-beta2 0.95   # --adam-beta1 0.9 and --clip-grad 1.0 are Megatron-LM's defaults",
        "    --log-interval 10",
    ]
    if job.train_tokens is None:
        data.append(f"    --train-iters 100   # {EDIT} no train_tokens in the job: a short benchmark run")
    data.append(")")

    data += ["", *_checkpoint_block(job, prediction, walltime)]

    launch = [
        "srun --kill-on-bad-exit=1 torchrun \\",
        '    --nnodes "$SLURM_NNODES" \\',
        f"    --nproc-per-node {c.gpus_per_node} \\",
        '    --rdzv-id "$SLURM_JOB_ID" \\',
        "    --rdzv-backend c10d \\",
        f'    --rdzv-endpoint "$MASTER_ADDR:{RDZV_PORT}" \\',
        '    "$MEGATRON_LM_DIR/pretrain_gpt.py" \\',
        '    "${MEGATRON_ARGS[@]}" "${DATA_ARGS[@]}" "${TRAIN_ARGS[@]}" "${CKPT_ARGS[@]}"',
    ]
    sections = ["\n".join(head), comment(about), "\n".join(env), args_block, "\n".join(data), "\n".join(launch)]
    return "\n\n".join(sections) + "\n"


def _checkpoint_block(job: Job, prediction: Prediction | None, walltime: float | None) -> list[str]:
    """``CKPT_DIR`` and ``CKPT_ARGS``: where checkpoints go, how often, and the exit before --time."""
    if prediction is not None:
        interval = max(1, math.floor(SAVE_EVERY_S / prediction.iteration_s))
        every = f"about every {format_duration(interval * prediction.iteration_s)} of predicted iterations"
    else:
        interval, every = 1000, f"{EDIT} no prediction: every 1000 iterations"
    lines = [
        f"# {EDIT} checkpoints: a folder on a file system every node sees. --save and --load name the same",
        "# folder, so running this script again resumes from the latest checkpoint in it.",
        f'CKPT_DIR=${{CKPT_DIR:-$PWD/checkpoints/{_job_name(job.name)}}}',
        "CKPT_ARGS=(",
        '    --save "$CKPT_DIR" --load "$CKPT_DIR"',
        f"    --save-interval {interval}   # {every}",
    ]
    if walltime is not None:
        minutes = math.ceil(walltime / 60) - math.ceil(EXIT_BEFORE_S / 60)
        if minutes > 0:
            lines.append(f"    --exit-duration-in-mins {minutes}   # save and exit "
                         f"{EXIT_BEFORE_S / 60:.0f} min before --time; change it with --time")
    lines.append(")")
    return lines


def _walltime_s(job: Job, prediction: Prediction | None) -> float | None:
    if prediction is None or prediction.time_to_train_s is None:
        return None
    return prediction.time_to_train_s * TIME_MARGIN


def _slurm_time(seconds: float) -> str:
    """SLURM's ``days-hours:minutes:seconds``, rounded up to the minute."""
    minutes = math.ceil(seconds / 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00"


def _job_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")
    return cleaned or "paraplan"
