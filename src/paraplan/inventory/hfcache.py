"""The disk cache of traces (``inventory.hftrace``): one JSON file per (config, micro-batch,
sequence, dtype, torch and transformers versions, ``TRACE_VERSION``)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from paraplan.inventory.hfrecords import ModuleCall, SavedTensor, TracedLayer, TracedModel, TracedOp

TRACE_VERSION = 4  # bump when the recorded fields change: old cache entries are ignored


def cache_dir() -> Path:
    """Where traces are kept: $PARAPLAN_CACHE_DIR, else $XDG_CACHE_HOME/paraplan, else ~/.cache."""
    base = os.environ.get("PARAPLAN_CACHE_DIR")
    if base:
        return Path(base) / "hftrace"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "paraplan" / "hftrace"


def _key(config: dict[str, Any], micro_batch: int, seq_length: int, dtype: str) -> str:
    import importlib.metadata as md

    versions = []
    for dist in ("torch", "transformers"):
        try:
            versions.append(md.version(dist))
        except md.PackageNotFoundError:
            versions.append("-")
    blob = json.dumps([TRACE_VERSION, versions, config, micro_batch, seq_length, dtype], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _to_json(trace: TracedModel) -> dict[str, Any]:
    return dataclasses.asdict(trace)


def _from_json(data: dict[str, Any]) -> TracedModel:
    def op(d):
        return TracedOp(**{**d, "shapes": tuple(map(tuple, d["shapes"])), "out_shapes": tuple(map(tuple, d["out_shapes"])),
                           "extra": tuple(tuple(x) for x in d["extra"])})

    def call(d):
        def ends(xs):
            return tuple((int(k), tuple(shape), float(n)) for k, shape, n in xs)

        return ModuleCall(module=d["module"], module_type=d["module_type"], inputs=ends(d["inputs"]),
                          outputs=ends(d["outputs"]))

    layers = tuple(
        TracedLayer(
            kind=ld["kind"], indices=tuple(ld["indices"]), layer_type=ld["layer_type"], params=ld["params"],
            param_breakdown=tuple(tuple(x) for x in ld["param_breakdown"]),
            ops=tuple(op(o) for o in ld["ops"]),
            saved=tuple(SavedTensor(**{**s, "shape": tuple(s["shape"])}) for s in ld["saved"]),
            calls=tuple(call(c) for c in ld["calls"]),
        )
        for ld in data["layers"]
    )
    fields = {k: v for k, v in data.items() if k not in ("layers", "ends", "end_stage", "end_saved", "end_params",
                                                        "tp_plan", "pp_plan")}
    return TracedModel(**fields, layers=layers, ends=tuple(op(o) for o in data["ends"]),
                       end_stage=tuple(data.get("end_stage", ())),
                       end_saved=tuple((w, SavedTensor(**{**s, "shape": tuple(s["shape"])}))
                                       for w, s in data.get("end_saved", ())),
                       end_params=tuple((m, int(n)) for m, n in data.get("end_params", ())),
                       tp_plan=tuple(tuple(x) for x in data.get("tp_plan", ())),
                       pp_plan=tuple(data.get("pp_plan", ())))


def load(path: Path) -> TracedModel | None:
    """The trace kept at ``path``; None when there is none or it cannot be read."""
    try:
        return _from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(path: Path, trace: TracedModel) -> None:
    """Keep ``trace`` at ``path`` (atomically); a read-only cache directory keeps nothing."""
    try:
        from paraplan.files.atomic import temp_path

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path(path)
        tmp.write_text(json.dumps(_to_json(trace)))
        os.replace(tmp, path)
    except OSError:
        pass
