"""Strict decoders of XGBoost model documents (UBJSON and JSON), so that only a document
decoded and checked here reaches XGBoost's own parsers, which trust their input (a deep nesting
overflows the stack, a UBJSON length past the end reads beyond the buffer)."""

from __future__ import annotations

import json
import re
import struct
from typing import Any

import numpy as np

MAX_XGBOOST_DEPTH = 32  # nesting of an XGBoost model document (XGBoost writes 7 levels)

_INT64 = struct.Struct(">q")
_UBJ_SCALARS = {
    ord(marker): struct.Struct(fmt)
    for marker, fmt in (("i", ">b"), ("U", ">B"), ("I", ">h"), ("l", ">i"), ("L", ">q"), ("d", ">f"), ("C", ">b"))
}
# the typed arrays XGBoost's UBJSON reader accepts: f32, u8, i32, i64 (big-endian)
_UBJ_TYPED = {ord("d"): np.dtype(">f4"), ord("U"): np.dtype(">u1"), ord("l"): np.dtype(">i4"), ord("L"): np.dtype(">i8")}
_OBJ, _OBJ_END, _ARR, _ARR_END, _TYPE, _COUNT, _LEN, _STR, _NULL, _TRUE, _FALSE = (
    ord(c) for c in "{}[]$#LSZTF"
)


def decode_ubjson(data: bytes) -> Any:
    """The UBJSON document ``data`` as dicts, lists, scalars and (typed arrays) numpy arrays.

    Strict: the subset XGBoost's reader accepts, every length within the data, at most
    :data:`MAX_XGBOOST_DEPTH` levels, no repeated key (XGBoost keeps the first, a dict the
    last), nothing after the document. Raises ValueError otherwise.
    """
    n = len(data)
    int64 = _INT64.unpack_from
    typed = _UBJ_TYPED.get
    scalars = _UBJ_SCALARS.get

    def length(pos: int) -> tuple[int, int]:
        if pos + 9 > n or data[pos] != _LEN:
            raise ValueError("a length is not an int64")
        (value,) = int64(data, pos + 1)
        pos += 9
        if value < 0 or value > n - pos:
            raise ValueError("a length runs past the end")
        return value, pos

    def parse(pos: int, depth: int) -> tuple[Any, int]:
        # every read is guarded by the caller's pos < n or by an explicit bound
        c = data[pos]
        pos += 1
        if c == _ARR and data[pos : pos + 1] == b"$":  # typed array: the bulk of a model
            dtype = typed(data[pos + 1]) if pos + 3 < n else None
            if dtype is None or data[pos + 2] != _COUNT:
                raise ValueError("unsupported typed array")
            count, pos = length(pos + 3)
            end = pos + count * dtype.itemsize
            if end > n:
                raise ValueError("truncated")
            return np.frombuffer(data, dtype=dtype, count=count, offset=pos), end
        if c == _OBJ or c == _ARR:
            if depth >= MAX_XGBOOST_DEPTH:
                raise ValueError("nested too deeply")
            if pos >= n:
                raise ValueError("truncated")
        if c == _OBJ:
            obj: dict[bytes, Any] = {}
            while data[pos] != _OBJ_END:
                size, pos = length(pos)
                name = data[pos : pos + size]
                pos += size
                if name in obj or pos >= n:
                    raise ValueError("a key is repeated or truncated")
                obj[name], pos = parse(pos, depth + 1)
                if pos >= n:
                    raise ValueError("truncated")
            return {name.decode("utf-8"): v for name, v in obj.items()}, pos + 1
        if c == _ARR:
            items: list[Any] = []
            if data[pos] == _COUNT:
                count, pos = length(pos + 1)
                for _ in range(count):
                    if pos >= n:
                        raise ValueError("truncated")
                    item, pos = parse(pos, depth + 1)
                    items.append(item)
                return items, pos
            while data[pos] != _ARR_END:
                item, pos = parse(pos, depth + 1)
                items.append(item)
                if pos >= n:
                    raise ValueError("truncated")
            return items, pos + 1
        if c == _STR:
            if pos >= n:
                raise ValueError("truncated")
            size, pos = length(pos)
            return data[pos : pos + size].decode("utf-8"), pos + size
        scalar = scalars(c)
        if scalar is not None:
            if pos + scalar.size > n:
                raise ValueError("truncated")
            return scalar.unpack_from(data, pos)[0], pos + scalar.size
        if c == _NULL:
            return None, pos
        if c == _TRUE or c == _FALSE:
            return c == _TRUE, pos
        raise ValueError("unsupported marker")

    if not n:
        raise ValueError("empty")
    doc, end = parse(0, 0)
    if end != n:
        raise ValueError("data after the document")
    return doc


_JSON_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"{}[]")
_BRACKET_STEP = np.zeros(256, dtype=np.int64)
_BRACKET_STEP[list(b"{[")] = 1
_BRACKET_STEP[list(b"}]")] = -1


def decode_xgboost_json(data: bytes) -> Any:
    """The JSON document ``data``, strictly: no escapes (XGBoost writes none, and its reader
    might decode them differently), no repeated key, at most :data:`MAX_XGBOOST_DEPTH` levels
    (measured before parsing). Raises ValueError otherwise."""
    if b"\\" in data:
        raise ValueError("escapes in strings")
    brackets = np.frombuffer(_JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS), dtype=np.uint8)
    if brackets.size and int(np.cumsum(_BRACKET_STEP[brackets]).max()) > MAX_XGBOOST_DEPTH:
        raise ValueError("nested too deeply")

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            raise ValueError("a key is repeated")
        return obj

    return json.loads(data.decode("utf-8"), object_pairs_hook=unique)
