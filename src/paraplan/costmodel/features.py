"""Regressor features of operators and collectives, read from the inventory.

One regressor serves every model that uses an operator because its features are the
inventory's counts (FLOPs, bytes, arithmetic intensity, the operator's own dimensions, all on
log scales) and the analytical estimate, not raw columns of a sample file.
"""

from __future__ import annotations

import hashlib
import json
import math

from paraplan.inventory import Collective, GroupLayout, Op
from paraplan.specs import ClusterSpec, GpuSpec, Phase

_LOG_FLOOR = 1.0


def _log(x: float) -> float:
    return math.log10(x if x > _LOG_FLOOR else _LOG_FLOOR)


def direction(phase: Phase) -> str:
    """'fwd' for the forward pass (and its recompute), 'bwd' for the backward pass."""
    return "bwd" if phase in (Phase.BWD_INPUT, Phase.BWD_WEIGHT) else "fwd"


def op_work(op: Op, phase_direction: str) -> tuple[float, float]:
    """(FLOPs, bytes) of the whole forward or the whole backward (input + weight gradients)."""
    if phase_direction == "fwd":
        return op.work(Phase.FWD)
    fi, bi = op.work(Phase.BWD_INPUT)
    fw, bw = op.work(Phase.BWD_WEIGHT)
    return fi + fw, bi + bw


def op_feature_names(op: Op) -> list[str]:
    return ["log_flops", "log_bytes", "log_intensity", "log_baseline_s", *(f"log_{k}" for k, _ in op.dims)]


def op_features(op: Op, phase_direction: str, baseline_s: float) -> list[float]:
    """Features in the order of :func:`op_feature_names`."""
    flops, traffic = op_work(op, phase_direction)
    return [
        _log(flops),
        _log(traffic),
        _log(flops) - _log(traffic),
        math.log10(baseline_s) if baseline_s > 0 else -9.0,
        *(_log(v) for _, v in op.dims),
    ]


COLLECTIVE_FEATURES = ["log_bytes", "size", "nodes", "per_node", "log_baseline_s"]


def collective_features(coll: Collective, layout: GroupLayout, baseline_s: float) -> list[float]:
    """Features in the order of :data:`COLLECTIVE_FEATURES`."""
    return [
        _log(coll.bytes),
        float(layout.size),
        float(layout.nodes),
        float(layout.per_node),
        math.log10(baseline_s) if baseline_s > 0 else -9.0,
    ]


def op_key(device: str, dtype: str, name: str, phase_direction: str) -> str:
    return f"op/{device}/{dtype}/{name}/{phase_direction}"


def collective_key(cluster: str, kind: str, layout: GroupLayout) -> str:
    """Collectives inside a node and across nodes get separate regressors: their residuals
    come from different links (and on Perlmutter, from anomalies of one of them)."""
    return f"collective/{cluster}/{kind}/{'inter' if layout.crosses_nodes else 'intra'}"


def gpu_fingerprint(gpu: GpuSpec) -> str:
    """What an operator residual is relative to: the GPU's peaks and efficiency curves."""
    data = gpu.model_dump(mode="json", include={"name", "peak_flops", "hbm_bandwidth_bytes_per_s", "efficiency"})
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def cluster_fingerprint(cluster: ClusterSpec) -> str:
    """What a collective residual is relative to: the node's GPUs and links (not its size)."""
    data = cluster.model_dump(mode="json", include={"gpus_per_node", "intra_node", "inter_node"})
    data["gpu"] = cluster.gpu.name
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
