"""`paraplan predict`: one job in, iteration time / breakdown / memory / cost out."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from paraplan.cli.common import OutputFormat, err, out, user_errors, write_text

Opt = typer.Option


def predict_command(
    job_file: Annotated[Path | None, typer.Argument(help="Job file (YAML/JSON). Omit for the built-in demo job.")] = None,
    model: Annotated[str | None, Opt(help="Catalog model name, e.g. llama-3-70b.")] = None,
    cluster: Annotated[str | None, Opt(help="Catalog cluster name, e.g. dgx-h100.")] = None,
    gpu: Annotated[str | None, Opt(help="Catalog GPU name, e.g. H100-SXM5-80GB.")] = None,
    num_nodes: Annotated[int | None, Opt(help="Number of nodes.")] = None,
    gpus_per_node: Annotated[int | None, Opt(help="GPUs per node.")] = None,
    price_per_gpu_hour: Annotated[str | None, Opt(help="e.g. '2.5 USD'.")] = None,
    tp: Annotated[int | None, Opt("--tp", "--tensor-model-parallel-size", help="Tensor-parallel size.")] = None,
    pp: Annotated[int | None, Opt("--pp", "--pipeline-model-parallel-size", help="Pipeline-parallel size.")] = None,
    dp: Annotated[int | None, Opt("--dp", "--data-parallel-size", help="Data-parallel size (derived when omitted).")] = None,
    cp: Annotated[int | None, Opt("--cp", "--context-parallel-size", help="Context-parallel size.")] = None,
    vpp: Annotated[int | None, Opt("--vpp", "--virtual-pipeline-model-parallel-size", help="Interleaved stages per GPU.")] = None,
    sequence_parallel: Annotated[bool | None, Opt("--sequence-parallel/--no-sequence-parallel")] = None,
    ep: Annotated[int | None, Opt("--ep", "--expert-model-parallel-size", help="Expert-parallel size (MoE models).")] = None,
    etp: Annotated[int | None, Opt("--etp", "--expert-tensor-parallel-size", help="Expert tensor-parallel size (default: tp).")] = None,
    expert_load_imbalance: Annotated[float | None, Opt(help="Busiest expert-parallel rank's tokens over the mean (default 1.0).")] = None,
    zero_stage: Annotated[int | None, Opt(help="ZeRO / distributed-optimizer stage 0-3.")] = None,
    micro_batch_size: Annotated[int | None, Opt()] = None,
    global_batch_size: Annotated[int | None, Opt()] = None,
    recompute: Annotated[str | None, Opt(help="none | selective | full (Megatron-LM) | layer | op (torchtitan, FSDP)")] = None,
    schedule: Annotated[str | None, Opt(help="gpipe | 1f1b | interleaved | zb-h1 | zb-v")] = None,
    framework: Annotated[str | None, Opt(help="megatron | deepspeed | fsdp")] = None,
    precision: Annotated[str | None, Opt(help="fp32 | fp16 | bf16 | fp8")] = None,
    train_tokens: Annotated[str | None, Opt(help="Tokens to train, e.g. 2T, for time and cost to train.")] = None,
    backend: Annotated[str, Opt(help="Cost model: analytical | learned (needs --models).")] = "analytical",
    models: Annotated[Path | None, Opt(help="Models file from `paraplan fit` (learned backend).")] = None,
    output: Annotated[OutputFormat, Opt("--format", "-f", help="table | json | csv")] = OutputFormat.table,
    explain: Annotated[bool, Opt("--explain", help="Also show the per-operator table of one layer.")] = False,
    plot: Annotated[list[Path] | None, Opt(
        help="Also draw a picture (.png/.svg/.pdf; repeatable): the kind the file name names "
        "(breakdown.png, run-timeline.svg, memory.pdf) or --plot-kind; a name with no kind "
        "(out.png) draws all three: out-breakdown.png, out-timeline.png, out-memory.png.")] = None,
    plot_kind: Annotated[str | None, Opt(help="breakdown | timeline | memory (for one --plot file).")] = None,
    force: Annotated[bool, Opt("--force", help="Replace existing --plot files.")] = False,
) -> None:
    """Predict one training iteration: time, breakdown, memory per GPU, MFU and cost."""
    from paraplan.catalog.jobs import demo_job_mapping, read_job_file
    from paraplan.catalog.origin import resolve_with_flags
    from paraplan.prediction import predict
    from paraplan.report.formats import render_csv, render_json

    flags = dict(
        model=model, cluster=cluster, gpu=gpu, num_nodes=num_nodes, gpus_per_node=gpus_per_node,
        price_per_gpu_hour=price_per_gpu_hour, tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp, data_parallel_size=dp, context_parallel_size=cp,
        virtual_pipeline_model_parallel_size=vpp, sequence_parallel=sequence_parallel,
        expert_model_parallel_size=ep, expert_tensor_parallel_size=etp, expert_load_imbalance=expert_load_imbalance,
        zero_stage=zero_stage, micro_batch_size=micro_batch_size,
        global_batch_size=global_batch_size, recompute=recompute, schedule=schedule,
        framework=framework, precision=precision, train_tokens=train_tokens,
    )
    from paraplan.prediction.backends import BACKENDS, load_model_file, make_cost_model
    from paraplan.report.plots import check_plots, render_plot
    from paraplan.specs import ConfigError, HeteroJob

    with user_errors():
        plots = check_plots(plot or [], plot_kind, overwrite=force)  # before the work, not after
        if backend not in BACKENDS:
            raise ConfigError(f"backend: unknown backend {backend!r} (available: {', '.join(BACKENDS)})")
        if job_file is not None:
            raw, base, origin = read_job_file(job_file), job_file.parent, str(job_file)
        else:
            raw, base, origin = demo_job_mapping(), Path("."), "the demo job"
        job = resolve_with_flags(raw, flags, base, origin)
        if isinstance(job, HeteroJob):  # node groups of different GPUs
            if backend != "analytical" or models is not None:
                raise ConfigError("backend: a cluster with node groups of different GPUs is predicted analytically")
            from paraplan.prediction.hetero import predict_hetero

            cost_model, pred = None, predict_hetero(job, keep_timeline=bool(plots))
        else:
            fitted = load_model_file(models) if models is not None else None
            cost_model = make_cost_model(job, backend, fitted)
            pred = predict(job, cost_model, keep_timeline=bool(plots))
    for path, kind in plots:
        err.print(f"wrote {kind} picture to {render_plot(pred, kind, path)}", highlight=False)
    for note in getattr(cost_model, "notes", ()):
        err.print(f"note: {models}: {note}", highlight=False)
    with user_errors():  # a non-finite number is an internal error (exit 3), never output
        if output is OutputFormat.json:
            data = pred.to_dict()
            if explain:
                from dataclasses import asdict

                data["layer_ops"] = [asdict(o) for o in pred.layer_ops]
                data["layer_collectives"] = [asdict(c) for c in pred.layer_collectives]
            write_text(render_json(data))
        elif output is OutputFormat.csv:
            write_text(render_csv([pred.to_dict()]))
        else:
            from paraplan.report.tables import render_explain, render_prediction

            out.print(f"seq_length {pred.job.model.seq_length:,} tokens per sequence", highlight=False)
            out.print(render_prediction(pred))
            if explain:
                out.print(render_explain(pred))
