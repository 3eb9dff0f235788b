"""What every command shares: output consoles, formats, and turning bad input into exit 2."""

from __future__ import annotations

import contextlib
import enum
import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from paraplan.specs import (
    PLAN_ALIASES,
    ConfigError,
    FP8Recipe,
    Framework,
    InternalError,
    Precision,
    Schedule,
    format_validation_error,
)
from paraplan.specs.extras import missing_extra_message
from paraplan.units import UnitError

# --help as click prints it: option names whole at any width (rich's help panels cut long option
# names to "…" at 80 columns) and boolean flags as --flag or --flag / --no-flag, never "<bool>".
# Every Typer app of the command passes these.
HELP_SETTINGS: dict[str, Any] = {"rich_markup_mode": None}

# every command's --help ends with this; the README's table says the same
EXIT_CODES = ("Exit codes: 0 an answer; 1 a valid question with no answer (search, sharding: no plan fits "
              "or meets the bounds; the nearest plan is named); 2 bad input (one line naming the field); "
              "3 internal error (an impossible result: a bug to report).")

out = Console(soft_wrap=False)
err = Console(stderr=True)


class OutputFormat(str, enum.Enum):
    table = "table"
    json = "json"
    csv = "csv"


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Bad input ends with one line on stderr naming the field and the reason, exit code 2;
    an impossible prediction (a bug) with one line and exit code 3; an optional module that is
    not installed, with one line naming the extra that installs it, exit code 2."""
    try:
        yield
    except ModuleNotFoundError as exc:
        message = missing_extra_message(exc)
        if message is None:
            raise
        _fail(message)
    except InternalError as exc:
        err.print(f"[bold red]{escape(str(exc))}[/]", highlight=False, soft_wrap=True)
        raise typer.Exit(code=3) from None
    except ConfigError as exc:
        _fail(str(exc))
    except ValidationError as exc:
        _fail(format_validation_error(exc))
    except UnitError as exc:
        _fail(str(exc))


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


def usage_error(message: str) -> None:
    """A command line click refused: one line on stderr, exit code 2 (outside a command, so
    by ``sys.exit`` rather than ``typer.Exit``)."""
    err.print(f"[bold red]error:[/] {escape(' '.join(message.split()))}", highlight=False, soft_wrap=True)
    sys.exit(2)


def write_text(text: str) -> None:
    """Machine-readable output goes to stdout untouched by rich."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


# -- the flags of a job ------------------------------------------------------------------------
# predict, report and compare take the same job flags (one definition, here); search shares the
# model flags. A command names a parameter ``flags`` and is decorated with ``takes_flags(...)``:
# the parameter becomes these options, and the command receives their values as one mapping
# keyed as ``catalog.jobs.apply_overrides`` reads them (None: not given).


@dataclass(frozen=True)
class Flag:
    name: str  # the command's parameter
    key: str  # apply_overrides' key
    type: Any
    option: Any  # typer.Option(...)
    default: Any = None  # the value when the flag is not given

    @property
    def flag(self) -> str:
        """The option as a user types it, e.g. ``--tp``."""
        # typer.Option keeps its first name where a default would go (as Annotated reads it)
        first = self.option.default
        return first if isinstance(first, str) else f"--{self.name.replace('_', '-')}"


def cli_flag(name: str, type_: Any, *decls: str, key: str | None = None, default: Any = None, **kwargs: Any) -> Flag:
    return Flag(name, key or name, type_, typer.Option(*decls, **kwargs), default)


def choices(kind: type[enum.Enum]) -> str:
    """An enum's values as a flag's help lists them: ``fp32 | tf32 | ...``, from the enum
    itself, so that a new member is offered without editing the CLI."""
    return " | ".join(str(member.value) for member in kind)


def plan_flag(field: str, type_: Any, **kwargs: Any) -> Flag:
    """The flag of the plan's ``field``, named as job files name it (the plan's aliases): ``--tp``
    and ``--tensor-model-parallel-size`` for a field with a short name, ``--zero-stage`` for one
    without, ``--sequence-parallel/--no-sequence-parallel`` for a switch."""
    long = "--" + field.replace("_", "-")
    short = next((s for s, f in PLAN_ALIASES.items() if f == field), None)
    if type_ is bool:
        decls: tuple[str, ...] = (f"{long}/--no-{long[2:]}",)
    else:
        decls = (f"--{short}", long) if short else ()
    return cli_flag(short or field, type_ | None, *decls, key=field, **kwargs)


# the model: a catalog name, or a Hugging Face config.json, and the training sequence length
MODEL_FLAGS = (
    cli_flag("seq_length", int | None, "--seq-length",
          help="Tokens per training sequence (default: the job's model's)."),
    cli_flag("hf_config", Path | None, "--hf-config",
          help="A Hugging Face config.json (or its folder) as the model, instead of --model; the "
               "sequence length is --seq-length, else the job's (max_position_embeddings is the "
               "longest sequence the model accepts, not the training length)."),
)

# a plan switch predict and search both take (search keeps it on every plan it tries)
QUEUED_KERNEL_GAP = plan_flag("queued_kernel_gap", bool,
                              help="Add the GPU's measured idle gap between back-to-back queued kernels, once per launch "
                                   "(off by default: it was measured only under a profiler, which may cause part of it).")

JOB_FLAGS = (
    cli_flag("model", str | None, help="Catalog model name, e.g. llama-3-70b."),
    *MODEL_FLAGS,
    cli_flag("cluster", str | None, help="Catalog cluster name, e.g. dgx-h100."),
    cli_flag("gpu", str | None, help="Catalog GPU name, e.g. H100-SXM5-80GB."),
    cli_flag("num_nodes", int | None, help="Number of nodes."),
    cli_flag("gpus_per_node", int | None, help="GPUs per node."),
    cli_flag("price_per_gpu_hour", str | None, help="e.g. '2.5 USD'."),
    plan_flag("tensor_model_parallel_size", int, help="Tensor-parallel size."),
    plan_flag("pipeline_model_parallel_size", int, help="Pipeline-parallel size."),
    plan_flag("data_parallel_size", int, help="Data-parallel size (derived when omitted)."),
    plan_flag("context_parallel_size", int, help="Context-parallel size."),
    cli_flag("cp_comm_type", str | None, "--cp-comm-type", help="Context parallelism's K/V exchange: p2p | a2a | "
             "allgather (Megatron-Core), allgather | alltoall (torchtitan); default: the framework's."),
    plan_flag("virtual_pipeline_model_parallel_size", int, help="Interleaved stages per GPU."),
    plan_flag("sequence_parallel", bool),
    QUEUED_KERNEL_GAP,
    plan_flag("expert_model_parallel_size", int, help="Expert-parallel size (MoE models)."),
    plan_flag("expert_tensor_parallel_size", int, help="Expert tensor-parallel size (default: tp)."),
    plan_flag("expert_load_imbalance", float, help="Busiest expert-parallel rank's tokens over the mean (default 1.0)."),
    plan_flag("zero_stage", int, help="ZeRO / distributed-optimizer stage 0-3."),
    plan_flag("micro_batch_size", int),
    plan_flag("global_batch_size", int),
    plan_flag("recompute", str, help="none | selective | full (Megatron-LM) | layer | op (torchtitan, FSDP)"),
    plan_flag("schedule", str, help=choices(Schedule)),
    plan_flag("framework", str, help=choices(Framework)),
    cli_flag("precision", str | None, help=choices(Precision)),
    plan_flag("fp8_recipe", str, help=f"With precision fp8: {choices(FP8Recipe)} (default delayed)."),
    cli_flag("train_tokens", str | None, help="Tokens to train, e.g. 2T, for time and cost to train."),
    cli_flag("memory_headroom", float | None, help="Share of each GPU's memory to leave free, e.g. 0.05.",
             show_default="0.05, or the job file's"),
)

# the cost model (predict, report, compare)
Backend = Annotated[str, typer.Option(help="Cost model: analytical | learned (needs --models).")]
ModelsFile = Annotated[Path | None, typer.Option(help="Models file from `paraplan fit` (learned backend).")]
Format = Annotated[OutputFormat, typer.Option("--format", "-f", help="table | json | csv")]


def takes_flags(*groups: tuple[Flag, ...]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the options of ``groups`` in place of its ``flags`` parameter; it is
    called with ``flags``, their values keyed by ``Flag.key`` (paths as given)."""
    flags = [f for group in groups for f in group]

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(func, eval_str=True)
        params = list(signature.parameters.values())
        at = [p.name for p in params].index("flags")
        options = [inspect.Parameter(f.name, params[at].kind, default=f.default, annotation=Annotated[f.type, f.option])
                   for f in flags]

        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            return func(*args, flags={f.key: kwargs.pop(f.name) for f in flags}, **kwargs)

        command.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*params[:at], *options, *params[at + 1:]])
        return command

    return decorate
