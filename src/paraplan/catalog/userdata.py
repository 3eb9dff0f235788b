"""Read YAML and JSON that a user (or an attacker) wrote, with limits: job files, cluster
files, HF configs and run records go through :func:`load_yaml` / :func:`load_json`; model
manifests and sample metadata use :func:`json_depth`.

A document is refused, with one line naming the limit, when it nests deeper than
:data:`MAX_DEPTH`, when YAML aliases (``*name``) would expand it beyond :data:`MAX_VALUES`
values (a few hundred bytes of nested aliases otherwise expand to gigabytes), when an alias
refers to the node that holds it, or when a mapping repeats a key (YAML names both lines,
JSON the key). The checks walk the parsed node graph, never the expanded data.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from paraplan.specs import ConfigError, short_repr

#: Deepest nesting of mappings and lists a document may have (a job file needs about 8).
MAX_DEPTH = 64
#: Most values (scalars, lists and mappings, aliases counted as what they expand to) in one
#: document.
MAX_VALUES = 100_000

_BASE = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when installed
_MERGE = "tag:yaml.org,2002:merge"


class _Loader(_BASE):  # type: ignore[valid-type, misc]
    """PyYAML's safe loader; the limits are checked between composing and constructing."""


def read_text(path: str | Path, what: str = "") -> str:
    """The text of a file the user named; a one-line ConfigError naming the file when it cannot
    be read (``what`` says what it is: "PATH: cannot read the job file (reason)") or is not UTF-8."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{path}: cannot read{' ' + what if what else ''} ({err.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (it is not UTF-8)") from None


def load_yaml(text: str, where: str) -> Any:
    """The data of a YAML document; a ConfigError ``where: reason`` when it is malformed or
    passes a limit."""
    try:
        _check_nesting(text, where)
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_graph(node, where)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as err:
        reason = f"{err.problem}, line {err.problem_mark.line + 1}" if err.problem and err.problem_mark else None
        raise ConfigError(f"{where}: not valid YAML ({reason or _first_line(err)})") from None
    except yaml.reader.ReaderError as err:  # a character YAML does not allow (a NUL)
        code = err.character if isinstance(err.character, int) else ord(err.character)
        line = text.count("\n", 0, err.position) + 1
        raise ConfigError(f"{where}: not valid YAML (character U+{code:04X} is not allowed, line {line})") from None
    except ValueError as err:
        raise ConfigError(f"{where}: not valid YAML ({_too_long_int(err, text)})") from None
    except (yaml.YAMLError, RecursionError) as err:
        raise ConfigError(f"{where}: not valid YAML ({_first_line(err)})") from None


def _too_long_int(err: ValueError, text: str) -> str:
    """Python refuses to read an integer of more than 4,300 digits: say so, and where."""
    digits = re.search(r"\d{4301,}", text)
    if digits is None:
        return _first_line(err)
    return f"an integer of more than 4,300 digits, line {text.count(chr(10), 0, digits.start()) + 1}"


def load_json(text: str, where: str) -> Any:
    """The data of a JSON document, with the same limits as :func:`load_yaml`."""
    try:
        data = json.loads(text, object_pairs_hook=_unique_pairs)
    except _DuplicateKey as err:
        raise ConfigError(f"{where}: duplicate key {short_repr(err.args[0])} in one object") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested more than {MAX_DEPTH} levels deep") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"{where}: not valid JSON ({err.msg}, line {err.lineno})") from None
    except ValueError as err:
        raise ConfigError(f"{where}: not valid JSON ({_too_long_int(err, text)})") from None
    if json_depth(data) > MAX_DEPTH:
        raise ConfigError(f"{where}: nested more than {MAX_DEPTH} levels deep")
    return data


def load_data(text: str, where: str, *, is_json: bool) -> Any:
    """:func:`load_json` or :func:`load_yaml`."""
    return load_json(text, where) if is_json else load_yaml(text, where)


class _DuplicateKey(Exception):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


def json_depth(obj: Any) -> int:
    """Nesting depth of decoded JSON (containers only), computed without recursion."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, level)
        stack.extend((v, level + 1) for v in item if isinstance(v, (dict, list)))
    return deepest


def _check_nesting(text: str, where: str) -> None:
    """Nesting from the parser's events, before any node is composed (composing recurses)."""
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                line = event.start_mark.line + 1
                raise ConfigError(f"{where}: nested more than {MAX_DEPTH} levels deep (line {line})")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _check_graph(root: yaml.Node, where: str) -> None:
    """Expanded size and depth of the node graph (aliases are shared nodes: each is measured
    once), self-references, and repeated mapping keys. Iterative: no recursion."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            open_nodes.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            if size[key] > MAX_VALUES:
                raise ConfigError(
                    f"{where}: YAML aliases expand to more than {MAX_VALUES:,} values (the limit; "
                    f"line {node.start_mark.line + 1})"
                )
            if depth[key] > MAX_DEPTH:
                raise ConfigError(f"{where}: YAML aliases nest it more than {MAX_DEPTH} levels deep "
                                  f"(line {node.start_mark.line + 1})")
            continue
        if key in size:
            continue
        if key in open_nodes:
            raise ConfigError(f"{where}: a YAML alias refers to itself (line {node.start_mark.line + 1})")
        if isinstance(node, yaml.MappingNode):
            _check_keys(node, where)
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_keys(node: yaml.MappingNode, where: str) -> None:
    seen: dict[tuple[str, str], int] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE:
            continue
        line, ident = key_node.start_mark.line + 1, (key_node.tag, key_node.value)
        if ident in seen:
            at = f"lines {seen[ident]} and {line}" if seen[ident] != line else f"twice on line {line}"
            raise ConfigError(f"{where}: duplicate key {short_repr(key_node.value)} ({at})")
        seen[ident] = line


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return _short_text(lines[0] if lines else type(err).__name__)


def _short_text(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
