"""Launch recipes: a job's parallel plan as the files that run it.

One pure function per target, ``render_<target>(job, prediction=None) -> str`` (nothing is
printed or written here):

- :func:`render_megatron`: Megatron-LM ``pretrain_gpt.py`` arguments (a bash array; Megatron Core
  0.16 or newer);
- :func:`render_deepspeed`: a DeepSpeed config JSON (DeepSpeed 0.19.8);
- :func:`render_torchtitan`: a torchtitan configuration, a Python module whose
  ``paraplan_config()`` returns the ``Trainer.Config`` (torchtitan 0.3.0);
- :func:`render_slurm`: a SLURM batch script running Megatron-LM under torchrun, saving and
  resuming from checkpoints.

Each recipe's header names the framework release it targets.

A ``prediction`` (of the same job) adds the predicted iteration time, memory and time to train
to the recipe's comments; the SLURM script needs it for ``--time`` and makes one itself when the
job has ``train_tokens`` and none is given.

**Plan features a target cannot express are never dropped silently.** The rule:

- if the target cannot run the plan at all, or only with a different precision or a forbidden
  combination, ``render_*`` raises :class:`~paraplan.specs.ConfigError` naming the field
  (torchtitan with fp16; DeepSpeed's pipeline engine with ZeRO-2/3 and pp > 1; Megatron-LM
  with cp > 1 and seq_length not divisible by 2*cp);
- if the target runs the same degrees and batch but implements a feature differently (ZeRO-1
  in torchtitan, GPipe in Megatron-LM, GPT-NeoX's parallel residual in Megatron-LM, tensor and
  pipeline degrees that DeepSpeed takes from its launching framework...), the recipe carries a
  ``NOTE(paraplan): <field>: ...`` line (a comment; in the DeepSpeed JSON the ``_paraplan.notes``
  list, a block DeepSpeed ignores; in the torchtitan module its docstring). :func:`export_notes` returns the same notes, for the CLI to
  show on stderr.
- values a plan does not contain (data, tokenizer, learning rate, walltime without
  ``train_tokens``) are marked ``EDIT:``, and where a value is required, ``EDIT-ME``, which the
  target rejects until the user replaces it.

Each module's docstring names the source files its keys and flags were checked against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from paraplan.export import deepspeed, megatron, slurm, torchtitan
from paraplan.export.deepspeed import render_deepspeed
from paraplan.export.megatron import render_megatron
from paraplan.export.slurm import render_slurm
from paraplan.export.torchtitan import render_torchtitan
from paraplan.specs import ConfigError, Job

if TYPE_CHECKING:
    from paraplan.prediction import Prediction

TARGETS = ("megatron", "deepspeed", "torchtitan", "slurm")
_MODULES = {"megatron": megatron, "deepspeed": deepspeed, "torchtitan": torchtitan, "slurm": slurm}
_RENDER = {"megatron": render_megatron, "deepspeed": render_deepspeed,
           "torchtitan": render_torchtitan, "slurm": render_slurm}

__all__ = [
    "TARGETS",
    "export_notes",
    "render",
    "render_deepspeed",
    "render_megatron",
    "render_slurm",
    "render_torchtitan",
]


def render(target: str, job: Job, prediction: Prediction | None = None) -> str:
    """The recipe for ``target`` (one of :data:`TARGETS`)."""
    return _RENDER[_check(target)](job, prediction)


def export_notes(target: str, job: Job, prediction: Prediction | None = None) -> list[str]:
    """The ``NOTE(paraplan)`` lines the ``target`` recipe carries for ``job``."""
    return _MODULES[_check(target)].notes(job, prediction)


def _check(target: str) -> str:
    if target not in TARGETS:
        raise ConfigError(f"target: unknown export target {target!r} (one of: {', '.join(TARGETS)})")
    return target
