"""`paraplan inventory trace CONFIG`: the operators of a Hugging Face model, traced from its code."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from paraplan.cli.common import EXIT_CODES, HELP_SETTINGS, out, user_errors
from paraplan.specs import ConfigError

inventory_app = typer.Typer(
    name="inventory",
    help="The operator inventory of a model: traced from its own code.",
    no_args_is_help=True,
    **HELP_SETTINGS,
)


@inventory_app.command("trace", short_help="Trace one layer of each kind of a Hugging Face model.",
                       epilog=EXIT_CODES)
def trace_command(
    config: Annotated[Path, typer.Argument(help="A Hugging Face config.json, or a directory holding one.")],
    micro_batch: Annotated[int, typer.Option("--micro-batch", "-b", min=1, help="Sequences per micro-batch.")] = 1,
    seq_length: Annotated[int, typer.Option("--seq-length", "-s", min=1, help="Tokens per sequence.")] = 4096,
    compare: Annotated[bool, typer.Option(
        "--compare", help="Beside the hand-written inventory of the same config (its 11 model types).")] = False,
    trust_remote_code: Annotated[bool, typer.Option(
        "--trust-remote-code", help="Run the model's own code from its directory (auto_map); never by default.")]
    = False,
    kernels: Annotated[str, typer.Option(
        "--kernels", help="fused: each norm, rotary embedding, gated activation and residual add one kernel, q/k/v "
        "and gate/up one GEMM, as training frameworks run them (what predict costs by default); eager: each "
        "module's aten operators as HF's eager code runs them.")] = "fused",
) -> None:
    """Build the model from CONFIG on PyTorch's meta device (no weights), run one layer of each
    distinct kind forward and backward at the micro-batch and sequence length, and print each
    module as a paraplan operator (``--kernels``: fused, as predict costs it, or eager): FLOPs,
    bytes, saved activations and exact parameters. Needs
    the 'hf' extra (pip install 'paraplan[hf]'); traces are cached under ~/.cache/paraplan."""
    from paraplan.inventory.hftrace import read_config, trace_layer_ops
    from paraplan.inventory.traced import costed_layer_ops
    from paraplan.report.traced import render_traced_layers

    with user_errors():
        if kernels not in ("fused", "eager"):
            raise ConfigError(f"--kernels: {kernels!r} is not a kernels mode; choose fused or eager")
        data = read_config(config)
        trace = trace_layer_ops(data, micro_batch, seq_length, trust_remote_code=trust_remote_code)
        layers = [(layer.kind, layer.count, costed_layer_ops(layer, kernels)[0]) for layer in trace.layers]
        tables = []
        if compare:
            tables = _compare(config, trace, layers, micro_batch, seq_length, kernels)
    out.print(render_traced_layers(trace, layers, kernels))
    for table in tables:
        out.print(table)


def _compare(config: Path, trace, layers, micro_batch: int, seq_length: int, kernels: str) -> list:
    from paraplan.catalog.hf import model_from_hf_config
    from paraplan.inventory import count_layer_ops, shard_shape
    from paraplan.inventory.moe import count_moe_layer_ops
    from paraplan.inventory.traced import compare_layer
    from paraplan.report.traced import render_agreement
    from paraplan.specs import ModelSpec, Precision

    if trace.dtype != "bfloat16":
        raise ConfigError("--compare: only bfloat16 traces are compared")
    fields = model_from_hf_config(config, {"seq_length": seq_length})
    if kernels == "eager":
        # HF's eager MLP multiplies silu(gate) by up in two kernels, and its RMSNorm keeps a
        # float32 copy of its input: the hand-written eager SwiGLU and RMSNorm
        fields.setdefault("swiglu_fusion", False)
        if fields.get("normalization") == "rmsnorm":
            fields.setdefault("rmsnorm_fusion", False)
    model = ModelSpec(**fields)
    x = shard_shape(model, 1, 1, False, micro_batch, Precision.BF16)
    tables = []
    for kind, _count, ops in layers:
        moe = "moe" in kind.split("@")[0].split("-")
        hand = count_moe_layer_ops(model, x) if moe else count_layer_ops(model, x)
        tables.append(render_agreement(compare_layer(ops, hand),
                                       f"layer kind {kind}: traced vs hand-written ({kernels} kernels)"))
    return tables
