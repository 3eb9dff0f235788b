"""`paraplan calibrate operators|links DIR`: fit a GPU's efficiency curves or a cluster's links
to measured samples (docs/calibration.md)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from paraplan.cli.common import HELP_SETTINGS, err, out, user_errors, write_text
from paraplan.specs import ConfigError

calibrate_app = typer.Typer(
    name="calibrate",
    help="Fit the analytical cost model to measured samples: a GPU's efficiency curves, a cluster's links.",
    no_args_is_help=True,
    **HELP_SETTINGS,
)

T = TypeVar("T")

# The choices of paraplan.calibrate (OP_CURVE_MODES, SOFTMAX_TAGS, LOSSES, TOPOLOGIES), spelled
# out so that `paraplan --version` does not import the cost model; a test keeps them equal.
OpCurves = enum.Enum("OpCurves", {m: m for m in ("none", "memory", "memory+bmm", "all")}, type=str)
Compare = enum.Enum("Compare", {m: m for m in ("none", "memory", "memory+bmm", "all", "off")}, type=str)
SoftmaxCurve = enum.Enum("SoftmaxCurve", {m: m for m in ("softmax", "ScaledUpperTriangMaskedSoftmax", "both")}, type=str)
Loss = enum.Enum("Loss", {m: m for m in ("linear", "soft_l1", "huber", "cauchy")}, type=str)
Topology = enum.Enum("Topology", {m: m for m in ("auto", "mesh", "switch")}, type=str)

Seed = Annotated[int, typer.Option(help="Seed of the random hold-out split.")]
Holdout = Annotated[float, typer.Option(help="Hold-out fraction (fitted on the rest, scored on it).")]
LossOpt = Annotated[Loss, typer.Option(help="least_squares loss on the log errors (linear = plain least squares).")]
Date = Annotated[str | None, typer.Option(help="Date written into the source string.", show_default="today")]
Out = Annotated[Path | None, typer.Option("--out", "-o", help="Write the fitted YAML block to this file, not stdout.")]
Force = Annotated[bool, typer.Option("--force", help="Replace --out when it exists.")]


def _log(line: str) -> None:
    err.print(line, highlight=False, markup=False, soft_wrap=True)


def _prepare(folder: Path, out_file: Path | None, force: bool) -> None:
    """Everything checked before seconds of fitting: the extra, DIR and --out."""
    from paraplan.calibrate import check_dependencies
    from paraplan.files.atomic import check_output_path

    check_dependencies()
    if not folder.is_dir():
        raise ConfigError(f"DIR {folder}: {'not a directory' if folder.exists() else 'no such directory'}")
    if out_file is not None:
        check_output_path(out_file, overwrite=force, flag="--force", what="YAML file")


def _prepare_csv(path: Path) -> None:
    """Checked before fitting: the extra is installed and CSV is a file."""
    from paraplan.calibrate import check_dependencies

    check_dependencies()
    if not path.is_file():
        raise ConfigError(f"CSV {path}: no such file")


def _named(flag: str, load: Callable[[str], T], name: str) -> T:
    """A catalog entry; an unknown name is a ConfigError naming ``flag``."""
    try:
        return load(name)
    except ConfigError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def _finish(result: Any, render: Callable[[Any], Any], out_file: Path | None, force: bool) -> None:
    """Tables on stdout; the YAML block on stdout, or in --out."""
    from paraplan.calibrate import write_new_file

    out.print(render(result))
    if out_file is None:
        write_text("\n" + result.block)
    else:
        write_new_file(out_file, result.block, overwrite=force, flag="--force")
        _log(f"wrote the fitted YAML block to {out_file}")


@calibrate_app.command("operators", short_help="Fit a GPU's efficiency curves to operator timings.")
def operators_command(
    folder: Annotated[Path, typer.Argument(metavar="DIR", help="Folder of GPUModeling operator CSVs.", show_default=False)],
    gpu: Annotated[str, typer.Option(help="Catalog GPU, e.g. A100-SXM4-80GB.", show_default=False)],
    update_catalog: Annotated[bool, typer.Option("--update-catalog", help="Replace the efficiency block in the GPU's catalog YAML.")] = False,
    op_curves: Annotated[OpCurves, typer.Option(help="Which operators get a curve of their own.")] = OpCurves("memory+bmm"),
    min_samples: Annotated[int, typer.Option(help="Fewest samples of an operator and direction for a curve.")] = 40,
    compare: Annotated[Compare, typer.Option(help="Also fit this --op-curves mode on the same 80 % (off: skip).")] = Compare("none"),
    softmax_curve: Annotated[SoftmaxCurve, typer.Option(help="Which sampled softmax fits the softmax curve.")] = SoftmaxCurve("softmax"),
    kernel_overhead_us: Annotated[float | None, typer.Option(help="Keep kernel_overhead_s at this many us.", show_default="fitted")] = None,
    precision: Annotated[str, typer.Option(help="Precision whose peak FLOP/s applies.")] = "fp16",
    max_nfev: Annotated[int, typer.Option(help="Cap on residual evaluations per fit.")] = 400,
    seed: Seed = 0, holdout: Holdout = 0.2, loss: LossOpt = Loss("linear"), date: Date = None,
    out_file: Out = None, force: Force = False,
) -> None:
    """Fit a GPU's efficiency curves (its catalog efficiency: block) to single-operator timings."""
    from paraplan.calibrate import (
        OperatorOptions,
        calibrate_operators,
        catalog_file,
        replace_efficiency_block,
    )
    from paraplan.catalog import load_gpu
    from paraplan.report.calibration import render_operators

    with user_errors():
        _prepare(folder, out_file, force)
        spec = _named("--gpu", load_gpu, gpu)
        options = OperatorOptions(
            op_curves=op_curves.value, min_samples=min_samples, compare=compare.value,
            softmax_curve=softmax_curve.value, kernel_overhead_us=kernel_overhead_us, precision=precision,
            max_nfev=max_nfev, seed=seed, holdout=holdout, loss=loss.value, date=date,
        )
        result = calibrate_operators(folder, spec, options, log=_log)
        _finish(result, render_operators, out_file, force)
        if update_catalog:
            path = catalog_file("gpus", spec.name)
            replace_efficiency_block(path, result.block)
            _log(f"wrote the efficiency block into {path}")


@calibrate_app.command("links", short_help="Fit a cluster's links to NCCL timings.")
def links_command(
    folder: Annotated[Path, typer.Argument(metavar="DIR", help="Folder of GPUModeling NCCL CSVs.", show_default=False)],
    cluster: Annotated[str, typer.Option(help="Catalog cluster: GPU, GPUs per node, nominal bandwidths.", show_default=False)],
    intra_topology: Annotated[Topology, typer.Option(help="Intra-node topology; auto fits both, keeps the better.")] = Topology("auto"),
    seed: Seed = 0, holdout: Holdout = 0.2, loss: LossOpt = Loss("linear"), date: Date = None,
    out_file: Out = None, force: Force = False,
) -> None:
    """Fit a cluster's link efficiency, p2p efficiency and latency to NCCL timings."""
    from paraplan.calibrate import LinkOptions, calibrate_links
    from paraplan.catalog import load_cluster
    from paraplan.report.calibration import render_links

    with user_errors():
        _prepare(folder, out_file, force)
        name = _named("--cluster", load_cluster, cluster).name
        options = LinkOptions(intra_topology.value, seed=seed, holdout=holdout, loss=loss.value, date=date)
        result = calibrate_links(folder, name, options, log=_log)
        _log("files (exclusions as checked against the chosen topology):\n" + "\n".join(result.notes))
        _finish(result, render_links, out_file, force)


@calibrate_app.command("gemm-table", short_help="Fit a GPU's GEMM curve to XLA's GEMM table.")
def gemm_table_command(
    table: Annotated[Path, typer.Argument(metavar="CSV", help="XLA's GEMM table (xla_perf_tables/matmul.csv).", show_default=False)],
    gpu_key: Annotated[str, typer.Option(help="The table's GPU key, e.g. sm_90.", show_default=False)],
    gpu: Annotated[str, typer.Option(help="Catalog GPU the key measured, e.g. H100-SXM5-80GB.", show_default=False)],
    dtype: Annotated[str, typer.Option(help="The table's dtype key.")] = "bf16xbf16->bf16",
    min_flops: Annotated[float, typer.Option(help="Fit GEMMs of at least this many FLOPs.")] = 1e10,
    seed: Seed = 0, holdout: Holdout = 0.2,
) -> None:
    """Fit a GPU's GEMM curve (BF16, or FP8 for an FP8 dtype) to XLA's measured GEMM table."""
    from paraplan.calibrate.curves import fit_curve, load_gemm_table
    from paraplan.catalog import load_gpu
    from paraplan.report.calibration import render_curve

    with user_errors():
        _prepare_csv(table)
        spec = _named("--gpu", load_gpu, gpu)
        result = fit_curve(load_gemm_table(table, gpu_key, dtype, spec, min_flops), spec, seed=seed, holdout=holdout)
    out.print(render_curve(result, spec.name))
    write_text(result.block)


@calibrate_app.command("attention", short_help="Fit a GPU's attention curve to benchmark points.")
def attention_command(
    gpu: Annotated[str, typer.Option(help="Catalog GPU the points were measured on.", show_default=False)],
    points: Annotated[Path | None, typer.Argument(metavar="CSV", help="Benchmark points (default: FlashAttention-2 on H100, from the FA3 paper).", show_default=False)] = None,
    seed: Seed = 0, holdout: Holdout = 0.2,
) -> None:
    """Fit a GPU's attention curve to published attention benchmark points."""
    from paraplan.calibrate.curves import ATTENTION_POINTS, fit_curve, load_attention_points
    from paraplan.catalog import load_gpu
    from paraplan.report.calibration import render_curve

    with user_errors():
        path = points or ATTENTION_POINTS
        _prepare_csv(path)
        spec = _named("--gpu", load_gpu, gpu)
        result = fit_curve(load_attention_points(path), spec, seed=seed, holdout=holdout)
    out.print(render_curve(result, spec.name))
    write_text(result.block)


@calibrate_app.command("collective-table", short_help="Fit a node's collective curves to XLA's table.")
def collective_table_command(
    table: Annotated[Path, typer.Argument(metavar="CSV", help="XLA's collective table (xla_perf_tables/collectives.csv).", show_default=False)],
    gpu_key: Annotated[str, typer.Option(help="The table's GPU key, e.g. sm_90.", show_default=False)],
    cluster: Annotated[str, typer.Option(help="Catalog cluster whose node the key measured, e.g. dgx-h100.", show_default=False)],
    min_mib: Annotated[float, typer.Option(help="Fit messages of at least this many MiB.", min=0.0)] = 1.0,
    seed: Seed = 0, holdout: Holdout = 0.2,
) -> None:
    """Fit an intra-node link's all-reduce / all-gather / reduce-scatter / all-to-all curves (bus
    bandwidth against message and group size) and its send/recv curve (XLA's collective-permutes,
    one pair each) to XLA's measured collective table."""
    from paraplan.calibrate.collective_table import fit_collective_table
    from paraplan.catalog import load_cluster
    from paraplan.report.calibration import render_collective_table

    with user_errors():
        _prepare_csv(table)
        spec = _named("--cluster", load_cluster, cluster)
        result = fit_collective_table(table, gpu_key, spec, min_bytes=min_mib * 2**20, seed=seed, holdout=holdout)
    out.print(render_collective_table(result, spec.name))
    write_text(result.block)


@calibrate_app.command("trace", short_help="Fit a cluster's curves and links to a profiler trace of a job.")
def trace_command(
    paths: Annotated[list[Path], typer.Argument(
        metavar="TRACE", help="A directory of rank traces, or trace files (record_shapes=True).", show_default=False)],
    job_file: Annotated[Path, typer.Option(
        "--job", help="The job the trace ran (its cluster is the starting point).", show_default=False)],
    seed: Seed = 0, holdout: Holdout = 0.2, date: Date = None,
    out_file: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Write the calibrated cluster file here, not stdout.")] = None,
    force: Force = False,
) -> None:
    """Fit the job's GPU efficiency curves (GEMM, attention, memory, norms and activations) to
    the operators a profiler trace timed, and its links to the collectives it timed; write the
    job's cluster with the fitted numbers as a cluster file for `paraplan predict --cluster`."""
    from paraplan.calibrate import check_dependencies, cluster_file_yaml, write_new_file
    from paraplan.calibrate.trace import calibrate_from_trace
    from paraplan.catalog import load_job
    from paraplan.files.atomic import check_output_path
    from paraplan.report.calibration import render_trace_calibration
    from paraplan.specs import Job
    from paraplan.traces.summary import trace_files

    with user_errors():
        check_dependencies()
        if out_file is not None:
            check_output_path(out_file, overwrite=force, flag="--force", what="cluster file")
        job = load_job(job_file)
        if not isinstance(job, Job):
            raise ConfigError(f"--job {job_file}: a cluster of one GPU type is calibrated from a trace")
        result = calibrate_from_trace(trace_files(paths), job, seed=seed, holdout=holdout, date=date, log=_log)
        header = [
            f"{result.cluster.name} calibrated by paraplan calibrate trace on {result.source.rsplit(' on ', 1)[-1]}",
            f"from {len(result.files)} rank trace(s) of job {job.name} ({job_file})",
            f"use it: paraplan predict JOB.yaml --cluster {out_file or 'THIS_FILE.yaml'}",
        ]
        text = cluster_file_yaml(result.cluster, header)
    out.print(render_trace_calibration(result))
    if out_file is None:
        write_text("\n" + text)
    else:
        with user_errors():
            write_new_file(out_file, text, overwrite=force, flag="--force")
        _log(f"wrote the calibrated cluster to {out_file}")
