"""`paraplan sharding FILE.py:FUNCTION --mesh data=2,model=4`: the per-block sharding of a JAX
step function (CFP-style), proved by compiling it."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.markup import escape

from paraplan.cli.common import OutputFormat, err, out, user_errors, write_text

Opt = typer.Option


def sharding_command(
    target: Annotated[str, typer.Argument(help="The step function: FILE.py:FUNCTION or MODULE:FUNCTION, "
                                               "e.g. examples/sharding/gpt_block.py:train_step.")],
    mesh: Annotated[str, Opt(help="Mesh axes, outermost first, e.g. data=2,model=4.")] = "data=2,model=4",
    memory_budget: Annotated[str | None, Opt(help="Memory per device, e.g. 60GB, or 'none' "
                                                  "(default: the cluster GPU's memory).")] = None,
    cluster: Annotated[str, Opt(help="Catalog cluster whose GPUs and links cost the plan.")] = "dgx-h100",
    precision: Annotated[str, Opt(help="Peak FLOPs to use: fp32 | tf32 | bf16 | fp16 | fp8.")] = "fp32",
    args: Annotated[str | None, Opt("--args", help="Keyword arguments for the example-args function, "
                                                    "e.g. num_layers=32,hidden=1024.")] = None,
    example_args: Annotated[str, Opt(help="Function of the same module returning (params, batch, ...).")] = "example_args",
    shapes_only: Annotated[bool, Opt("--shapes-only", help="Trace with shapes only (big models): the plan is "
                                                            "compiled but not run.")] = False,
    profile: Annotated[bool, Opt("--profile", help="Also compile every block's strategies alone: XLA's bytes and "
                                                    "FLOPs per block; on GPUs their times replace the analytic "
                                                    "ones.")] = False,
    verify: Annotated[bool, Opt("--verify/--no-verify", help="Compile the plan, compare it with the unsharded "
                                                             "step and diff its collectives.")] = True,
    output: Annotated[OutputFormat, Opt("--format", "-f", help="table | json")] = OutputFormat.table,
) -> None:
    """Trace the step, group its operators into communication-free blocks, cost every block's
    strategies on the mesh, pick the cheapest chain within the memory budget, and compile it.

    This imports FILE.py (or MODULE) and runs its code (the module, the example-args function
    and the step itself), by design, with your permissions: run it only on code you trust."""
    from paraplan.sharding.request import ShardingRequest
    from paraplan.specs import ConfigError

    with user_errors():
        request = ShardingRequest.from_flags(mesh=mesh, memory_budget=memory_budget, cluster=cluster,
                                             precision=precision)
        if verify or profile:
            _ask_for_cpu_devices(request.devices)
        if output is OutputFormat.csv:
            raise ConfigError("format: sharding writes table or json")
        step, call_args = request.load(target, example_args, args, shapes_only)
        if profile:
            from rich.progress import Progress

            with Progress(console=err, transient=True) as bar:
                task = bar.add_task("compiling block strategies", total=None)
                plan = request.search(step, call_args, profiled=True,
                                      progress=lambda done, total: bar.update(task, completed=done, total=total))
        else:
            with err.status(f"tracing and searching {target} on {mesh}"):
                plan = request.search(step, call_args)
        check = None
        if verify:
            with err.status(f"compiling the plan on {request.devices} devices"):
                check = plan.verify(step.fn, call_args)
    data = plan.to_dict()
    from paraplan.report.sharding import no_plan_message

    missed = None if plan.fits else no_plan_message(data, request.memory_budget_text)
    if output is OutputFormat.json:
        from paraplan.report.formats import render_json

        result = {"plan": data, "verification": None if check is None else check.to_dict()}
        with user_errors():  # a non-finite number is an internal error (exit 3), never output
            write_text(render_json(result if missed is None else {**result, "no_plan": missed}))
    else:
        from paraplan.report.sharding import render_sharding

        out.print(render_sharding(data, None if check is None else check.to_dict()))
    if check is not None and check.matches is False:  # the compiled plan computes something else: a bug
        err.print(f"[bold red]internal error:[/] the sharded step's results differ from the unsharded step's "
                  f"(max |error| {check.max_abs_error:.2e}); the plan is not an answer; please report it to "
                  "paraplan with the step function", highlight=False, soft_wrap=True)
        raise typer.Exit(code=3)
    if missed is not None:  # a valid question with no answer: exit 1, the nearest plan named
        err.print(f"[bold red]{missed[:7]}[/]{escape(missed[7:])}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=1)


def _ask_for_cpu_devices(count: int) -> None:
    """On a machine without accelerators JAX has one CPU device; ask XLA for ``count`` (only
    takes effect before JAX starts, and only for the host platform)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
