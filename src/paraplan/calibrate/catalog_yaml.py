"""Fitted numbers as catalog YAML: a GPU's ``efficiency:`` block and a cluster's links."""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import yaml

from paraplan.calibrate._common import COMMAND, US
from paraplan.calibrate.params import CURVES
from paraplan.catalog.loader import catalog_key as _catalog_key
from paraplan.specs import ClusterSpec, ConfigError, EfficiencyCurve, EfficiencySpec, LinkSpec

__all__ = [
    "catalog_file",
    "cluster_file_yaml",
    "efficiency_yaml",
    "links_yaml",
    "replace_efficiency_block",
    "write_new_file",
]


def efficiency_yaml(spec: EfficiencySpec, flops_keys: Sequence[str] = ()) -> str:
    """The ``efficiency:`` block of a GPU catalog file (``flops_keys``: per-operator curves
    whose half_work is in FLOPs; the others are in bytes)."""
    units = {"gemm": "FLOPs", "attention": "FLOPs", "memory": "bytes"}
    lines = [f"efficiency:                 # fitted by {COMMAND} operators (see docs/calibration.md)"]
    for name in CURVES:
        c: EfficiencyCurve = getattr(spec, name)
        note = f"# half_work in {units[name]}"
        if name == "memory" and spec.ops:
            note += "; memory-bound operators without an ops: curve"
        lines.append(
            f"  {name}: {{max_fraction: {c.max_fraction:.4f}, half_work: {c.half_work:.4g}}}"
            f"{' ' * max(1, 20 - len(f'{c.half_work:.4g}') - len(name))}{note}"
        )
    lines.append(f"  kernel_overhead_s: {spec.kernel_overhead_s / US:.2f} us")
    if spec.ops:
        lines.append(
            "  ops:                      # per-operator curves (GPT-NeoX kernels as sampled); "
            "half_work in FLOPs for bmm/baddbmm/GEMM/attention, else bytes"
        )
        width = max(len(k) for k in spec.ops) + 3
        for key, c in spec.ops.items():
            lines.append(
                f"    {(chr(34) + key + chr(34) + ':').ljust(width)} "
                f"{{max_fraction: {c.max_fraction:.4f}, half_work: {c.half_work:.4g}}}"
                + ("  # FLOPs" if key in flops_keys else "")
            )
    escaped = spec.source.replace('"', "'")
    lines.append(f'  source: "{escaped}"')
    return "\n".join(lines)


def links_yaml(cluster: ClusterSpec, source: str) -> str:
    """The fitted link parameters of ``cluster`` as the YAML of a catalog cluster's
    ``intra_node`` / ``inter_node`` (bandwidths are the catalog's nominal per-GPU values), with
    ``source`` as a closing comment."""
    lines = ["# YAML (link parameters; bandwidths are the catalog's nominal per-GPU values)"]
    for side in ("intra_node", "inter_node"):
        link: LinkSpec | None = getattr(cluster, side)
        if link is None:
            continue
        lines.append(f"{side}:")
        lines.append(f"  bandwidth: {link.bandwidth_bytes_per_s / 1e9:g} GB/s")
        if side == "intra_node":
            lines.append(f"  topology: {link.topology}")
        lines.append(f"  latency: {link.latency_s / US:.1f} us")
        lines.append(f"  efficiency: {link.efficiency:.4f}")
        if link.p2p_efficiency is not None:
            lines.append(f"  p2p_efficiency: {link.p2p_efficiency:.4f}")
    lines.append(f"# source: {source}")
    return "\n".join(lines)


def cluster_file_yaml(cluster: ClusterSpec, header: Sequence[str]) -> str:
    """A whole cluster file (the GPU inline) that ``paraplan predict --cluster FILE`` loads:
    every field that differs from its default, numbers to 4 significant digits, a curve's
    ``source`` left out where it repeats the efficiency block's, ``header`` as comments."""
    data = cluster.model_dump(mode="json", exclude_defaults=True)
    shared = data.get("gpu", {}).get("efficiency", {}).get("source")
    body = yaml.safe_dump(_tidy(data, shared), sort_keys=False, width=100, allow_unicode=True)
    return "".join(f"# {line}\n" for line in header) + body


def _tidy(value, shared: str | None):
    if isinstance(value, dict):
        curve = "max_fraction" in value  # a curve: its source is the block's
        return {k: _tidy(v, shared) for k, v in value.items() if not (curve and k == "source" and v == shared)}
    if isinstance(value, list):
        return [_tidy(v, shared) for v in value]
    if isinstance(value, float):
        return float(f"{value:.4g}")
    return value


def replace_efficiency_block(path: Path, block: str) -> None:
    """Replace the top-level ``efficiency:`` block of a catalog YAML (or append one); every
    other line of the file is left as it is."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("efficiency:")), None)
    if start is None:
        while lines and not lines[-1].strip():
            lines.pop()
        new = [*lines, *block.splitlines()]
    else:
        end = start + 1
        while end < len(lines) and (not lines[end].strip() or lines[end][0] in " \t#"):
            end += 1
        new = [*lines[:start], *block.splitlines(), *lines[end:]]
    path.write_text("\n".join(new) + "\n", encoding="utf-8")


def catalog_file(kind: str, name: str) -> Path:
    """The YAML file of the catalog entry ``name`` of ``kind`` ("gpus", "clusters") in the
    package's catalog folder."""
    folder = Path(str(resources.files("paraplan.catalog") / kind))
    for path in sorted(folder.glob("*.yaml")):
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        if _catalog_key(str(raw.get("name", ""))) == _catalog_key(name):
            return path
    raise ConfigError(f"no catalog {kind} file named {name}")


def write_new_file(
    path: str | os.PathLike[str], text: str, *, overwrite: bool = False, flag: str = "overwrite=True"
) -> None:
    """Write ``text`` (and a final newline) to ``path``; an existing file is replaced only with
    ``overwrite`` (otherwise a one-line ConfigError naming ``flag``, e.g. ``--force``)."""
    try:
        with open(path, "w" if overwrite else "x", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")
    except FileExistsError:
        raise ConfigError(f"{path}: already exists (pass {flag} to replace it)") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write ({exc.strerror})") from None
