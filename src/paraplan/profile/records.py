"""The journal a sampler appends its measurements to, so that nothing measured is ever lost.

A sweep writes one line per grid point to an append-only JSON Lines file (the *journal*)
as soon as the point is measured, and syncs it to disk (``fsync``) before measuring the next.
A sampler killed at any moment (SIGKILL, power loss) loses at most the point it was
measuring: restarted with the same command, it opens the same journal, skips every point in
:meth:`RecordStore.done_keys` and measures the rest. :meth:`RecordStore.finalize` turns the
journal into a samples file (Parquet, written atomically by
:func:`paraplan.samples.store.save_samples`).

The file::

    {"journal": "paraplan.records", "version": 1, "header": {...the sweep's identity...}}
    {"key": "linear1/fp32/mp=1,b=4,l=64,dim=64", "rows": [{...}, {...}], "extra": {...}}
    {"key": "flash_atten/fp8/...", "skipped": "fp8 needs a GPU with FP8 tensor cores"}

The first line names the sweep (device, dtype, grid ...); a journal is resumed only by the
sweep it names, so two different commands never mix their points in one file. Each later
line is one grid point: its ``key``, the schema rows it produced (an operator's forward and
backward come in one line, so a point is never half done), or the reason it was skipped
(out of memory, an unsupported shape or dtype), and anything else the sampler records
(``extra``: spreads, repeats). A last line cut short by a kill is dropped on opening. An
exclusive lock stops two samplers from writing one journal at once.

Usage::

    with RecordStore(path, header={"device": "cpu-core", ...}) as store:
        for key, point in grid:
            if key in store.done_keys():
                continue
            store.append(measure(point), key=key, extra={"spread": 0.01})
        store.finalize(out, metadata={"importer": "paraplan profile ops"})
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paraplan.specs import ConfigError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["JOURNAL_FORMAT", "JOURNAL_VERSION", "RecordStore", "journal_path", "row_key"]

JOURNAL_FORMAT = "paraplan.records"
JOURNAL_VERSION = 1
#: The schema columns that name what a row measured (everything but the time and provenance).
_IDENTITY = (
    "kind", "name", "variant", "phase", "mp", "b", "h", "l", "dim", "vp", "encoders",
    "bytes", "nodes", "gpus_per_node", "dtype", "device", "cluster",
)


def journal_path(out: str | os.PathLike[str]) -> Path:
    """The journal beside a samples file: ``h100.samples`` -> ``h100.samples.journal``."""
    out = Path(out)
    return out.with_name(out.name + ".journal")


def row_key(row: Mapping[str, Any]) -> str:
    """A key naming what ``row`` measured (its identity columns), for callers without keys."""
    return json.dumps({c: row.get(c) for c in _IDENTITY if row.get(c) not in (None, "")}, sort_keys=True)


class RecordStore:
    """An append-only, fsync'd journal of measured grid points (see the module docstring).

    ``header`` identifies the sweep (JSON-serialisable); opening an existing journal whose
    header differs is a :class:`ConfigError`. Use it in a ``with`` statement (or call
    :meth:`close`): it holds the file open and locked.
    """

    def __init__(self, path: str | os.PathLike[str], header: Mapping[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.header = json.loads(json.dumps(dict(header or {}), sort_keys=True))
        self._entries: list[dict[str, Any]] = []
        self._keys: set[str] = set()
        self._duplicates = 0
        self._fd: int | None = None
        self._open()

    # -- opening -------------------------------------------------------------------------
    def _open(self) -> None:
        if self.path.is_dir():
            raise ConfigError(f"{self.path}: is a folder, not a journal file")
        if not self.path.parent.is_dir():
            raise ConfigError(f"{self.path}: folder {self.path.parent} does not exist")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            _lock(fd, self.path)
            self._read(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _read(self, fd: int) -> None:
        data = _read_all(fd)
        if not data:
            first = {"journal": JOURNAL_FORMAT, "version": JOURNAL_VERSION, "header": self.header}
            _write_line(fd, first)
            return
        lines = data.split(b"\n")
        if data.endswith(b"\n"):
            lines.pop()
        else:  # the last line was cut short by a kill: drop it, keep every whole one
            keep = len(data) - len(lines.pop())
            os.ftruncate(fd, keep)
            os.fsync(fd)
        try:
            first = json.loads(lines[0]) if lines else None
        except ValueError:
            first = None
        if not isinstance(first, dict) or first.get("journal") != JOURNAL_FORMAT:
            raise ConfigError(f"{self.path}: not a paraplan journal (its first line is not a journal header)")
        if first.get("version") != JOURNAL_VERSION:
            raise ConfigError(f"{self.path}: journal version {first.get('version')!r} is not {JOURNAL_VERSION}")
        if first.get("header") != self.header:
            raise ConfigError(
                f"{self.path}: journal of a different sweep ({_difference(first.get('header'), self.header)}); "
                "run the command that wrote it, or use another --out"
            )
        for number, line in enumerate(lines[1:], 2):
            try:
                entry = json.loads(line)
            except ValueError:
                raise ConfigError(f"{self.path}: line {number} is not JSON (the journal is corrupt)") from None
            if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
                raise ConfigError(f"{self.path}: line {number} has no key (the journal is corrupt)")
            self._remember(entry)

    def _remember(self, entry: dict[str, Any]) -> None:
        if entry["key"] in self._keys:
            self._duplicates += 1
            return
        self._keys.add(entry["key"])
        self._entries.append(entry)

    # -- writing ---------------------------------------------------------------------------
    def append(
        self,
        rows: Mapping[str, Any] | Iterable[Mapping[str, Any]],
        *,
        key: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Record one measured point: a schema row (or several, written as one line so the
        point is whole or absent) under ``key`` (default: :func:`row_key` of the first row).
        The line is on disk when this returns."""
        rows = [dict(rows)] if isinstance(rows, Mapping) else [dict(r) for r in rows]
        if not rows:
            raise ValueError("append needs at least one row")
        entry: dict[str, Any] = {"key": key if key is not None else row_key(rows[0]), "rows": rows}
        if extra:
            entry["extra"] = dict(extra)
        self._write(entry)

    def skip(self, key: str, reason: str, *, extra: Mapping[str, Any] | None = None) -> None:
        """Record that the point ``key`` cannot be measured, and why (one line; not retried)."""
        entry: dict[str, Any] = {"key": key, "skipped": str(reason)}
        if extra:
            entry["extra"] = dict(extra)
        self._write(entry)

    def _write(self, entry: dict[str, Any]) -> None:
        if self._fd is None:
            raise ValueError(f"{self.path}: journal is closed")
        if entry["key"] in self._keys:
            raise ValueError(f"{self.path}: point {entry['key']!r} is recorded already")
        _write_line(self._fd, entry)
        self._remember(entry)

    # -- reading ---------------------------------------------------------------------------
    def done_keys(self) -> frozenset[str]:
        """Keys of every point recorded (measured or skipped)."""
        return frozenset(self._keys)

    def rows(self) -> list[dict[str, Any]]:
        """Every measured schema row, in the order measured, with ``source`` (the journal's
        file name) and ``row`` (its 0-based position among the rows) filled in."""
        out = []
        for entry in self._entries:
            for row in entry.get("rows", ()):
                out.append({**row, "source": row.get("source") or self.path.name, "row": len(out)})
        return out

    def entries(self) -> list[dict[str, Any]]:
        """Every recorded point as written (key, rows or skipped, extra), first of each key."""
        return [dict(e) for e in self._entries]

    def skipped(self) -> dict[str, int]:
        """Skipped points per reason."""
        counts: dict[str, int] = {}
        for entry in self._entries:
            if "skipped" in entry:
                counts[entry["skipped"]] = counts.get(entry["skipped"], 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    @property
    def duplicates(self) -> int:
        """Lines whose key was recorded before (ignored; none unless two writers raced)."""
        return self._duplicates

    def frame(self) -> pd.DataFrame:
        """The measured rows as a samples frame (validated against the schema)."""
        import pandas as pd

        from paraplan.samples.schema import COLUMNS, empty_samples, validate_samples

        rows = self.rows()
        if not rows:
            return empty_samples()
        frame = pd.DataFrame([{c: r.get(c) for c in COLUMNS} for r in rows])
        for column, dtype in COLUMNS.items():
            if dtype == "string":
                frame[column] = frame[column].fillna("")
        return validate_samples(frame, where=str(self.path))

    def finalize(
        self,
        out: str | os.PathLike[str],
        metadata: Mapping[str, Any] | None = None,
        *,
        overwrite: bool = False,
    ) -> dict[str, Any]:
        """Write the measured rows to the samples file ``out`` (Parquet, atomically); returns
        the metadata written. It adds ``journal`` (this file's name), ``points``, ``skipped``
        (count per reason) and ``excluded`` (the same counts) to ``metadata``."""
        from paraplan.samples.store import save_samples

        skipped = self.skipped()
        meta = {
            "journal": self.path.name,
            "points": len(self._entries),
            "measured_points": sum(1 for e in self._entries if "rows" in e),
            "skipped": skipped,
            "excluded": dict(skipped),
            **dict(metadata or {}),
        }
        return save_samples(self.frame(), out, meta, overwrite=overwrite)

    # -- closing ---------------------------------------------------------------------------
    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # also releases the lock
            self._fd = None

    def __enter__(self) -> RecordStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _lock(fd: int, path: Path) -> None:
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, one writer is the user's promise
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ConfigError(f"{path}: another sampler is writing this journal") from None


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _write_line(fd: int, entry: Mapping[str, Any]) -> None:
    """One JSON line in a single write, then fsync: on disk, or (killed) cut short at the end."""
    data = (json.dumps(entry, sort_keys=True, allow_nan=False) + "\n").encode()
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
    os.fsync(fd)


def _difference(old: Any, new: Mapping[str, Any]) -> str:
    """The first header field that differs, for the error message."""
    if not isinstance(old, dict):
        return "it has no header"
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            return f"{key}: journal {_short(old.get(key))}, this command {_short(new.get(key))}"
    return "headers differ"


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."
