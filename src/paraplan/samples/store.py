"""Sample records on disk: one Parquet file with the schema's columns and JSON metadata.

The metadata (under the Parquet schema key ``paraplan.samples``) records where the rows came
from and what was left out::

    {"schema_version": 1, "paraplan_version": "0.1.0", "created": "2026-...Z",
     "importer": "gpumodeling", "sources": ["operators_A100", ...],
     "excluded": {"reason": count, ...}, "tool_versions": {"pandas": ..., "pyarrow": ...},
     ... anything else the writer adds (notes, duplicates, ...)}

:func:`load_samples` returns the validated frame with that mapping in
``frame.attrs["samples_metadata"]``; :func:`read_samples_metadata` reads only the metadata.
Files are written to a temporary name and renamed, and an existing file is never replaced
unless asked.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paraplan.catalog.userdata import json_depth
from paraplan.files.atomic import check_output_path, sweep_stale, temp_path
from paraplan.samples.schema import SCHEMA_VERSION, validate_samples
from paraplan.specs import ConfigError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["METADATA_KEY", "check_samples_path", "load_samples", "read_samples_metadata", "save_samples", "tool_versions"]

#: The Parquet schema-metadata key holding paraplan's JSON metadata.
METADATA_KEY = b"paraplan.samples"
#: Where :func:`load_samples` puts the metadata on the returned frame.
ATTRS_KEY = "samples_metadata"
#: Deepest nesting accepted in the metadata (an importer writes three levels).
MAX_METADATA_DEPTH = 32


def tool_versions() -> dict[str, str]:
    """Versions of the software that wrote a samples file."""
    import numpy
    import pandas
    import pyarrow

    from paraplan._version import __version__

    return {
        "paraplan": __version__,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "pandas": pandas.__version__,
        "pyarrow": pyarrow.__version__,
    }


def _metadata(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    from paraplan._version import __version__

    extra = dict(extra or {})
    meta: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "paraplan_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "importer": "",
        "sources": [],
        "excluded": {},
        "tool_versions": tool_versions() | dict(extra.pop("tool_versions", None) or {}),
    }
    for key in ("schema_version", "paraplan_version"):
        extra.pop(key, None)
    meta.update(extra)
    return meta


def check_samples_path(
    path: str | os.PathLike[str], *, overwrite: bool = False, flag: str = "overwrite=True / --force"
) -> None:
    """Raise a one-line ConfigError unless a samples file can be written to ``path``: its
    folder exists, it is not a folder, and it does not exist unless ``overwrite``."""
    check_output_path(path, overwrite=overwrite, flag=flag, what="samples file")


def save_samples(
    frame: pd.DataFrame,
    path: str | os.PathLike[str],
    metadata: Mapping[str, Any] | None = None,
    *,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write ``frame`` (validated against the schema) to ``path`` as Parquet; returns the
    metadata written. ``metadata`` adds or overrides keys (``importer``, ``sources``,
    ``excluded``, ``tool_versions`` merged with the writer's own, ...); the schema and
    paraplan versions are always the writer's. An existing ``path`` is an error unless
    ``overwrite``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    check_samples_path(path, overwrite=overwrite)
    frame = validate_samples(frame, where=str(path))
    meta = _metadata(metadata)
    try:
        encoded = json.dumps(meta, sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{path}: metadata is not JSON-serialisable: {exc}") from None
    if json_depth(json.loads(encoded)) > MAX_METADATA_DEPTH:
        raise ConfigError(f"{path}: metadata is nested more than {MAX_METADATA_DEPTH} levels deep")
    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), METADATA_KEY: encoded})
    sweep_stale(path)  # what an earlier writer killed mid-write left beside the target
    tmp = temp_path(path)
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return meta


def _open_error(path: Path, exc: BaseException) -> ConfigError:
    if isinstance(exc, FileNotFoundError) or not path.exists():
        return ConfigError(f"{path}: no such file")
    if path.is_dir():
        return ConfigError(f"{path}: is a folder, not a samples file")
    reason = (str(exc).splitlines() or [type(exc).__name__])[0]
    return ConfigError(f"{path}: not a readable Parquet samples file ({reason})")


def _decode(path: Path, raw: Mapping[bytes, bytes] | None) -> dict[str, Any]:
    if not raw or METADATA_KEY not in raw:
        raise ConfigError(
            f"{path}: a Parquet file without paraplan samples metadata (not written by save_samples)"
        )
    try:
        meta = json.loads(raw[METADATA_KEY])
    except RecursionError:
        raise ConfigError(f"{path}: corrupt samples metadata (nested too deeply)") from None
    except ValueError:  # also UnicodeDecodeError
        raise ConfigError(f"{path}: corrupt samples metadata (not JSON)") from None
    if not isinstance(meta, dict):
        raise ConfigError(f"{path}: corrupt samples metadata (not a mapping)")
    if json_depth(meta) > MAX_METADATA_DEPTH:
        raise ConfigError(f"{path}: corrupt samples metadata (nested too deeply)")
    version = meta.get("schema_version")
    if not isinstance(version, int):
        raise ConfigError(f"{path}: samples metadata has no schema_version")
    if version > SCHEMA_VERSION:
        raise ConfigError(
            f"{path}: samples schema version {version} is newer than this paraplan reads "
            f"({SCHEMA_VERSION}); upgrade paraplan"
        )
    if version < SCHEMA_VERSION:
        raise ConfigError(
            f"{path}: samples schema version {version} is no longer read; re-import the samples"
        )
    return meta


def read_samples_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Only the metadata of a samples file (fast: the rows are not read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise _open_error(path, exc) from None
    return _decode(path, schema.metadata)


def load_samples(path: str | os.PathLike[str]) -> pd.DataFrame:
    """The validated samples of ``path``; the metadata is in ``frame.attrs["samples_metadata"]``.
    A missing, non-Parquet or corrupt file, or one that breaks the schema, is a one-line
    :class:`ConfigError`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise _open_error(path, exc) from None
    meta = _decode(path, table.schema.metadata)
    try:
        raw = table.to_pandas()
    except (pa.ArrowException, ValueError, TypeError) as exc:
        raise _open_error(path, exc) from None
    frame = validate_samples(raw, where=str(path))
    frame.attrs[ATTRS_KEY] = meta
    return frame
