"""Several samples files read as one table (``paraplan fit h100.samples net.samples``).

Files are concatenated in the order given. They conflict, and are refused with one line naming
both files and the first shared point, when two of them measure the same thing: the same
operator shape (or collective size and layout) in the same dtype on the same device or
cluster. That happens when one file is given twice, when a sweep's parts overlap, or when one
``--device-name`` was used for two machines; a single file may hold repeats of a point (the
GPUModeling files do), which stay.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paraplan.samples.schema import COLUMNS, validate_samples
from paraplan.samples.store import ATTRS_KEY, load_samples
from paraplan.specs import ConfigError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["IDENTITY_COLUMNS", "load_many"]

#: What a row measured: every column but the time and where the row came from.
IDENTITY_COLUMNS = tuple(c for c in COLUMNS if c not in ("time_s", "source", "row"))


def _describe(row: Any) -> str:
    parts = [f"{c}={row[c]}" for c in IDENTITY_COLUMNS if str(row[c]) not in ("", "<NA>", "nan")]
    return " ".join(parts)


def load_many(paths: Sequence[str | os.PathLike[str]]) -> pd.DataFrame:
    """The rows of every file, validated and concatenated; ``attrs["samples_metadata"]`` is
    ``{"files": [...], "sources": [...], "excluded": {...}, "metadata": {file: metadata}}``
    (one file: that file's metadata unchanged)."""
    import pandas as pd

    paths = [Path(p) for p in paths]
    if not paths:
        raise ConfigError("no samples file given")
    seen: dict[Path, Path] = {}
    for path in paths:
        key = path.resolve()
        if key in seen:
            raise ConfigError(f"{path}: given twice (as {seen[key]} too)")
        seen[key] = path
    frames = [load_samples(p) for p in paths]
    if len(frames) == 1:
        return frames[0]
    owner: dict[tuple, Path] = {}
    for path, frame in zip(paths, frames, strict=True):
        keys = frame[list(IDENTITY_COLUMNS)].astype(str).drop_duplicates()
        for index, key in zip(keys.index, keys.itertuples(index=False, name=None), strict=True):
            if key in owner:
                raise ConfigError(
                    f"{path}: conflicts with {owner[key]}: both measure {_describe(frame.loc[index])} "
                    "(overlapping sweeps, or one device name for two machines)"
                )
            owner[key] = path
    merged = validate_samples(pd.concat(frames, ignore_index=True), where=", ".join(map(str, paths)))
    metas = {str(p): f.attrs.get(ATTRS_KEY, {}) for p, f in zip(paths, frames, strict=True)}
    excluded: dict[str, int] = {}
    for meta in metas.values():
        for reason, n in (meta.get("excluded") or {}).items():
            excluded[reason] = excluded.get(reason, 0) + int(n)
    merged.attrs[ATTRS_KEY] = {
        "files": [str(p) for p in paths],
        "sources": [s for meta in metas.values() for s in (meta.get("sources") or [])],
        "excluded": excluded,
        "metadata": metas,
    }
    return merged
