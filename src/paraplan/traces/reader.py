"""Read a Chrome / Kineto trace file (plain or gzipped JSON) one event at a time.

ijson (the `traces` extra) streams the `traceEvents` array, so a multi-GB trace never sits in
memory whole; without ijson the file is read with the standard library's json (whole). A file
that is empty, truncated, not JSON or not a trace raises `TraceFileError` naming the file.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from paraplan.specs import ConfigError

_GZIP_MAGIC = b"\x1f\x8b"
#: The trace's small top-level fields kept beside the events (Kineto writes them first).
HEADER_KEYS = ("schemaVersion", "distributedInfo", "deviceProperties", "baseTimeNanoseconds", "traceName",
               "hostname", "host_name")
#: Top-level fields newer Kineto writes after the events: read from the file's last bytes.
_TRAILER = {"baseTimeNanoseconds": re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)'),
            "hostname": re.compile(rb'"(?:hostname|host_name)"\s*:\s*"([^"\\]*)"')}
_ARRAY_END = re.compile(rb"}\s*]")
#: (path, mtime, size) -> the top-level fields seen when the file was last read (the trailer
#: when streamed, every field but the events when read whole)
_TRAILERS: dict[tuple, dict[str, Any]] = {}
#: The 2021 Kineto categories (PyTorch 1.8-1.9) under today's names, as the PyTorch profiler's
#: TensorBoard plugin maps them (pytorch/kineto tb_plugin/torch_tb_profiler/profiler/trace.py,
#: EventTypeMap); the events are otherwise the same, so such a trace decodes as a GPU trace.
KINETO_2021 = {"Operator": "cpu_op", "Runtime": "cuda_runtime", "Kernel": "kernel", "Memcpy": "gpu_memcpy",
               "Memset": "gpu_memset", "Python": "python_function"}


class TraceFileError(ConfigError):
    """A trace file paraplan cannot read; ``str(err)`` is one line starting with the file name."""


def _open(path: Path) -> IO[bytes]:
    with open(path, "rb") as probe:
        gz = probe.read(2) == _GZIP_MAGIC
    return gzip.open(path, "rb") if gz else open(path, "rb")


def _has_ijson() -> bool:
    try:
        import ijson  # noqa: F401
    except ImportError:
        return False
    return True


def read_header(path: Path) -> dict[str, Any]:
    """The trace's top-level fields that precede `traceEvents` (rank, process groups, ...)."""
    path = Path(path)
    _check_start(path)
    if not _has_ijson():
        return {k: v for k, v in _load_whole(path).items() if k in HEADER_KEYS}
    import ijson

    header: dict[str, Any] = {}
    with _guarded(path), _open(path) as f:
        builder, key, depth = None, None, 0
        for prefix, event, value in ijson.parse(f):
            if builder is not None:
                builder.event(event, value)
                depth += {"start_map": 1, "start_array": 1, "end_map": -1, "end_array": -1}.get(event, 0)
                if depth == 0:
                    header[key] = builder.value
                    builder = None
            elif prefix == "" and event == "map_key":
                if value == "traceEvents":
                    break
                key = value
                builder = ijson.ObjectBuilder() if key in HEADER_KEYS else None
            elif prefix == "" and event == "start_array":
                break  # a bare array of events has no header
    return header


def iter_events(path: Path, *, exact: bool = False) -> Iterator[dict[str, Any]]:
    """Every event of the trace, in file order. Raises TraceFileError when the file is bad.
    ``exact``: every number with a fraction as the ``Decimal`` the file writes, not a float (an
    epoch-based trace's microsecond timestamps, ~1.7e15, keep only a quarter of a microsecond
    in a float: differences of such timestamps need it)."""
    path = Path(path)
    _check_start(path)
    if not _has_ijson():
        yield from _whole_events(path, exact)
        return
    import ijson

    prefix = "item" if _check_start(path) == b"[" else "traceEvents.item"
    count, slow = 0, exact  # slow: ijson's own numbers (Decimals for fractions, integers of any size)
    if not exact:
        try:
            with _guarded(path, fast=True), _open(path) as f:
                tail = _Tail(f)
                for event in ijson.items(tail, prefix, use_float=True):
                    count += _checked(path, event)
                    yield event
        except _BigInteger:
            # ijson's C backend with use_float=True parses integers into a C long long and refuses
            # any above 2^63 (ICRAR/ijson#153), yet real traces hold such ids (HTA PR #324). Read on
            # from the same event without use_float: integers of any size, decimals turned to floats.
            slow = True
    if slow:
        done = count
        with _guarded(path), _open(path) as f:
            tail = _Tail(f)
            for n, event in enumerate(ijson.items(tail, prefix)):
                if n >= done:
                    count += _checked(path, event)
                    yield event if exact else _floats(event)
    if count == 0:
        _no_events(path)
    _TRAILERS[_key(path)] = _parse_trailer(tail.bytes())


def read_top(path: Path) -> dict[str, Any]:
    """The trace's top-level fields, before and after `traceEvents`; the host's name (Kineto
    writes `hostname` or `host_name`) as `hostname`. Without ijson, from the last whole read."""
    path = Path(path)
    if not _has_ijson():
        cached = _TRAILERS.get(_key(path))
        whole = _load_whole(path) if cached is None else cached
        return {**{k: v for k, v in whole.items() if k in HEADER_KEYS}, **_trailer_of(whole)}
    return {**read_header(path), **read_trailer(path)}


def device_names(top: dict[str, Any]) -> list[str]:
    """The GPU names a trace's ``deviceProperties`` lists (from ``read_top``), sorted, each once."""
    return sorted({d["name"] for d in top.get("deviceProperties") or ()
                   if isinstance(d, dict) and isinstance(d.get("name"), str) and d["name"]})


def read_trailer(path: Path) -> dict[str, Any]:
    """The top-level fields written after `traceEvents` (baseTimeNanoseconds, hostname): kept
    from the last read of the file by `iter_events`, else read from its end."""
    path = Path(path)
    cached = _TRAILERS.get(_key(path))
    if cached is not None:
        return _trailer_of(cached)
    if not _has_ijson():
        return _trailer_of(_load_whole(path))
    with _guarded(path), _open(path) as f:
        tail = _Tail(f)
        while tail.read(1 << 20):
            pass
    return _parse_trailer(tail.bytes())


def _key(path: Path) -> tuple:
    st = path.stat()
    return (str(path.resolve()), st.st_mtime_ns, st.st_size)


def _trailer_of(whole: dict[str, Any]) -> dict[str, Any]:
    found = {k: whole[k] for k in ("baseTimeNanoseconds", "hostname") if k in whole}
    if "host_name" in whole:
        found.setdefault("hostname", whole["host_name"])
    return found


def _parse_trailer(tail: bytes) -> dict[str, Any]:
    closes = list(_ARRAY_END.finditer(tail))  # the events' array closes before the trailer
    end = closes[-1].end() if closes else 0
    found: dict[str, Any] = {}
    for key, pattern in _TRAILER.items():
        matches = pattern.findall(tail, end)
        if matches:
            value = matches[-1].decode("utf-8", "replace")
            found[key] = int(value) if key == "baseTimeNanoseconds" else value
    return found


class _Tail:
    """A binary file that keeps the last bytes read from it (two reads' worth)."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.prev, self.last = f, b"", b""

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        if data:
            self.prev, self.last = self.last, data
        return data

    def bytes(self) -> bytes:
        return self.prev + self.last


class _BigInteger(Exception):
    """ijson's fast path met an integer it cannot hold."""


def _checked(path: Path, event: Any) -> int:
    """1 for an event (its 2021 category renamed to today's); TraceFileError for anything else."""
    if not isinstance(event, dict):
        raise TraceFileError(f"{path}: traceEvents holds a {type(event).__name__}, not events")
    cat = event.get("cat")
    today = KINETO_2021.get(cat) if type(cat) is str else None
    if today is not None:
        event["cat"] = today
        args = event.get("args")
        if isinstance(args, dict) and "external id" in args and "External id" not in args:
            args["External id"] = args.pop("external id")  # 2021 device events (same plugin file)
    return 1


def _floats(value: Any) -> Any:
    """The value with every Decimal (ijson's number with a fraction) turned into a float."""
    kind = type(value)
    if kind is dict:
        return {k: _floats(v) for k, v in value.items()}
    if kind is list:
        return [_floats(v) for v in value]
    if kind.__name__ == "Decimal":
        return float(value)
    return value


def _check_start(path: Path) -> bytes:
    """The file's first non-blank byte, which must open a JSON object or array."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise TraceFileError(f"{path}: {exc.strerror or exc}") from None
    if size == 0:
        raise TraceFileError(f"{path}: empty file")
    with _guarded(path), _open(path) as f:
        first = f.read(1)
        while first and first.isspace():
            first = f.read(1)
    if first not in (b"[", b"{"):
        raise TraceFileError(f"{path}: not a JSON trace (starts with {first!r})")
    return first


def _no_events(path: Path) -> None:
    with _guarded(path), _open(path) as f:
        import ijson

        keys = [v for p, e, v in ijson.parse(f) if p == "" and e == "map_key"]
    if "traceEvents" not in keys and keys:
        raise TraceFileError(f"{path}: not a profiler trace (no traceEvents; keys: {', '.join(keys[:5])})")
    raise TraceFileError(f"{path}: the trace holds no events")


def _load_whole(path: Path, exact: bool = False) -> dict[str, Any]:
    with _guarded(path), _open(path) as f:
        data = json.load(f, parse_float=Decimal) if exact else json.load(f)
    if isinstance(data, list):
        return {"traceEvents": data}
    if not isinstance(data, dict) or "traceEvents" not in data:
        raise TraceFileError(f"{path}: not a profiler trace (no traceEvents)")
    return data


def _whole_events(path: Path, exact: bool = False) -> Iterator[dict[str, Any]]:
    whole = _load_whole(path, exact)
    _TRAILERS[_key(path)] = {k: v for k, v in whole.items() if k != "traceEvents"}
    events = whole["traceEvents"]
    if not events:
        raise TraceFileError(f"{path}: the trace holds no events")
    for event in events:
        _checked(path, event)
        yield event


class _guarded:
    """Turn the many ways a file can be broken into one TraceFileError naming it."""

    def __init__(self, path: Path, fast: bool = False) -> None:
        self.path = path
        self.fast = fast  # ijson with use_float=True: an integer overflow means "read it slowly"

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is None or isinstance(exc, TraceFileError):
            return False
        if self.fast and type(exc).__name__ == "IncompleteJSONError" and "integer overflow" in str(exc):
            raise _BigInteger from None
        reason = _reason(exc)
        if reason is None:
            return False
        raise TraceFileError(f"{self.path}: {reason}") from None


def _reason(exc: BaseException) -> str | None:
    name = type(exc).__name__
    if isinstance(exc, EOFError | zlib.error | gzip.BadGzipFile):
        return f"truncated or corrupt gzip ({exc})"
    if name == "IncompleteJSONError" or isinstance(exc, json.JSONDecodeError):
        text = str(exc).splitlines()[0] if str(exc) else name
        if "premature EOF" in text or "Expecting" in text or "Unterminated" in text:
            return f"truncated or malformed JSON ({text})"
        return f"not valid JSON ({text})"
    if isinstance(exc, UnicodeDecodeError):
        return "not a text JSON file (binary content)"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return None
