"""Rows and tables for `paraplan catalog`."""

from __future__ import annotations

from typing import Any

from paraplan.catalog import catalog_names, load_gpu, load_model
from paraplan.catalog.loader import load_any_cluster
from paraplan.report.layout import ReadableTable
from paraplan.specs import HeteroClusterSpec


def _tflops(value: float | None) -> float | None:
    return None if value is None else round(value / 1e12, 1)


def _curves_status(gpu) -> str:
    """'measured' (every 16-bit kind curve measured on this GPU), 'partly measured',
    'transferred' (curves of a sibling GPU) or 'generic'."""
    from paraplan.specs import Precision

    eff = gpu.efficiency
    measured = [eff.measured(kind, Precision.BF16) for kind in ("gemm", "attention", "memory")]
    if all(measured):
        return "measured"
    if any(measured):
        return "partly measured"
    if any(c.transferred_from for c in (eff.gemm, eff.attention, eff.memory)):
        return "transferred"
    return "generic"


def _repositories(sources: Any) -> str:
    """The repositories (``owner/name``) a preset's sources cite, in order of first citation;
    a source naming none (a paper, a package) by its first two words ("Narayanan et al.")."""
    seen: dict[str, None] = {}
    for source in sources:
        words = source.replace(",", " ").split()
        first = words[0].rstrip(":") if words else ""
        if first.count("/") >= 1:
            seen["/".join(first.split("/")[:2])] = None
        else:
            seen[" ".join(words[:2]) + (" al." if words[1:2] == ["et"] else "")] = None
    return ", ".join(seen)


def framework_rows() -> list[dict[str, Any]]:
    """One row per framework preset: the name ``--framework`` takes, its version, the engine it
    is modelled with, the plan and model fields it sets (with when, where a default is
    conditional: "(tp>1)", "(sp)": with sequence parallelism), what it limits (``runs``), and the
    repositories its sources cite (``--format json`` and the YAML files say each source in full)."""
    from paraplan.catalog.presets import preset_sources, presets, when_short
    from paraplan.specs.preset import shown

    rows = []
    for preset in presets().values():
        sets = [f"{d.field} {shown(d.value)}" + (f" ({when_short(d)})" if when_short(d) else "") for d in preset.defaults]
        sets += [f"{d.field} {shown(d.value)}" for d in preset.model_defaults]
        sets += [f"runs {axis} {' | '.join(map(shown, values))} only" for axis, (values, _) in preset.runs.items()]
        rows.append({"name": preset.name, "version": preset.version, "engine": preset.engine.value,
                     "label": preset.label, "sets": ", ".join(sets),
                     "sources": _repositories(preset_sources(preset).values())})
    return rows


def catalog_rows(kind: str) -> list[dict[str, Any]]:
    if kind == "frameworks":
        return framework_rows()
    rows: list[dict[str, Any]] = []
    for name in catalog_names(kind):  # type: ignore[arg-type]
        if kind == "gpus":
            g = load_gpu(name)
            rows.append(
                {
                    "name": g.name,
                    **{f"{p}_tflops": _tflops(g.peak_flops.get(p)) for p in ("fp16", "bf16", "fp8")},
                    "hbm_gib": round(g.hbm_bytes / 2**30, 2),
                    "hbm_bandwidth_gb_per_s": g.hbm_bandwidth_bytes_per_s / 1e9,
                    "intra_node_gb_per_s": g.intra_node.bandwidth_bytes_per_s / 1e9 if g.intra_node else None,
                    "efficiency": _curves_status(g),
                    "aliases": ", ".join(g.aliases),
                }
            )
        elif kind == "models":
            m = load_model(name)
            rows.append(
                {
                    "name": m.name,
                    "num_layers": m.num_layers,
                    "hidden_size": m.hidden_size,
                    "num_attention_heads": m.num_attention_heads,
                    "num_query_groups": m.num_query_groups,
                    "ffn_hidden_size": m.ffn_hidden_size,
                    "seq_length": m.seq_length,
                    "vocab_size": m.vocab_size,
                    "activation": m.activation,
                    # routed experts x experts per token (a dense model: none)
                    "experts": f"{m.num_moe_experts}x{m.moe_router_topk}" if m.is_moe else None,
                }
            )
        elif isinstance(c := load_any_cluster(name), HeteroClusterSpec):
            price = c.price_per_hour_usd
            rows.append(
                {
                    "name": c.name,
                    "gpu": " + ".join(f"{g.num_nodes}x{g.gpus_per_node} {g.gpu.name}" for g in c.node_groups),
                    "gpus_per_node": c.gpus_per_node,
                    "domain_gpus": c.gpus_per_node,
                    "intra_node_gb_per_s": None,
                    "inter_node_gb_per_s_per_gpu": c.fabric.bandwidth_bytes_per_s / 1e9 if c.fabric else None,
                    "price_per_gpu_hour_usd": None if price is None else price / c.num_gpus,
                }
            )
        else:
            rows.append(
                {
                    "name": c.name,
                    "gpu": c.gpu.name,
                    "gpus_per_node": c.gpus_per_node,
                    "domain_gpus": c.scale_up_domain or c.gpus_per_node,  # GPUs on one NVLink domain
                    "intra_node_gb_per_s": c.intra_node.bandwidth_bytes_per_s / 1e9 if c.intra_node else None,
                    "inter_node_gb_per_s_per_gpu": c.inter_node.bandwidth_bytes_per_s / 1e9 if c.inter_node else None,
                    "price_per_gpu_hour_usd": c.price_per_gpu_hour,
                }
            )
    return rows


# Table headers of the row keys (the JSON/CSV keys stay as they are): (header, short header)
_HEADERS: dict[str, tuple[str, str | None]] = {
    "name": ("name", None),
    "fp16_tflops": ("fp16 TFLOP/s", "fp16"),
    "bf16_tflops": ("bf16 TFLOP/s", "bf16"),
    "fp8_tflops": ("fp8 TFLOP/s", "fp8"),
    "hbm_gib": ("HBM GiB", None),
    "hbm_bandwidth_gb_per_s": ("HBM GB/s", None),
    "intra_node_gb_per_s": ("intra-node GB/s", "intra GB/s"),
    "inter_node_gb_per_s_per_gpu": ("inter-node GB/s per GPU", "inter GB/s"),
    "efficiency": ("efficiency curves", "curves"),
    "aliases": ("aliases", None),
    "num_layers": ("layers", None),
    "hidden_size": ("hidden size", "hidden"),
    "num_attention_heads": ("attention heads", "heads"),
    "num_query_groups": ("query groups", "kv"),
    "ffn_hidden_size": ("FFN hidden size", "ffn"),
    "seq_length": ("sequence length", "seq"),
    "vocab_size": ("vocabulary", "vocab"),
    "activation": ("activation", None),
    "experts": ("experts x top-k", "experts"),
    "gpu": ("GPU", None),
    "gpus_per_node": ("GPUs per node", "GPUs/node"),
    "domain_gpus": ("GPUs per NVLink domain", "domain"),
    "price_per_gpu_hour_usd": ("$ per GPU-hour", "$/GPU-h"),
    "version": ("version", None),
    "engine": ("modelled as", "engine"),
    "label": ("framework", None),
    "sets": ("sets when the job does not", "sets"),
    "sources": ("sources", None),
}
_TEXT = {"name", "gpu", "aliases", "activation", "efficiency", "experts", "version", "engine", "label", "sets",
         "sources"}
_PROSE = {"gpu", "aliases", "efficiency", "label", "sets", "sources"}
_DETAIL = {"aliases", "domain_gpus", "label", "sets", "sources"}


def render_catalog(kind: str, rows: list[dict[str, Any]]) -> ReadableTable:
    """The catalog at any terminal width: numbers whole, headers shortened (with a legend) and
    the aliases moved under the table when the terminal is narrow."""
    table = ReadableTable(title=f"catalog: {kind}")
    if not rows:
        return table
    for column in rows[0]:
        header, short = _HEADERS.get(column, (column, None))
        table.add_column(header, short=short, number=column not in _TEXT, wrap=column in _PROSE,
                         detail=column in _DETAIL)
    for row in rows:
        table.add_row(*("-" if v is None else f"{v:g}" if isinstance(v, float) else str(v) for v in row.values()))
    return table
