"""Regenerate tests/fixtures/megatron_flags.json: every flag Megatron-LM's ``pretrain_gpt.py`` parser
accepts, read from a Megatron-LM checkout without importing it (importing needs torch, Transformer
Engine and a GPU stack).

    python scripts/extract_megatron_flags.py /path/to/Megatron-LM [--commit HASH] [-o FILE]

What it reads, as Megatron-LM builds its parser (``megatron/training/arguments.py``,
``add_megatron_arguments``):

- every ``*.add_argument(...)`` call in the ``_add_*_args`` functions that ``add_megatron_arguments``
  calls, with its option strings, ``action``, ``type``, ``choices``, ``nargs``, ``dest`` and ``default``;
- every ``ArgumentGroupFactory(ConfigClass, exclude=[...]).build_group(...)`` call: since January 2026
  most model, parallelism and training flags are generated from the fields of config dataclasses
  (``TransformerConfig`` and its base ``ModelParallelConfig``, ``TrainingConfig``, ``CheckpointConfig``,
  ...). The dataclass is found through the imports, its fields (base classes first, as
  ``dataclasses.fields`` orders them) are read with ``ast``, and Megatron's own rule
  (``megatron/training/argument_utils.py``, ``ArgumentGroupFactory._build_argparse_kwargs_from_field``)
  turns each field into a flag:

  * the flag is ``--`` + the field name with ``_`` -> ``-``; ``dest`` is the field name;
  * ``Optional[X]`` / ``X | None`` is X; ``list[X]`` is X with ``nargs='+'``; ``Literal[...]`` gives
    ``choices`` (type of the first choice); an ``Enum`` gives its member names as choices;
  * a ``bool`` field is ``store_true`` when its default ``== False``, else ``store_false`` named
    ``--no-<name>`` and ``--disable-<name>`` (so ``Optional[bool] = None`` is a store_false flag);
  * ``field(metadata={"argparse_meta": {...}})`` overrides any of these (``arg_names``, ``default``...);
  * fields named in ``exclude`` and fields with ``init=False`` get no flag.

Every file is read from one Megatron-LM commit (``--commit``, required): the output names that commit
once and, for each file read, the SHA-256 of the text read, so that a regeneration can show it ran on the
same files (tests/unit/test_extract_megatron_flags.py reruns it where the sources are at hand).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
from pathlib import Path

ARGUMENTS = "megatron/training/arguments.py"
BUILTIN_TYPES = {"int", "float", "str", "bool"}
_MISSING = object()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("checkout", type=Path, help="a Megatron-LM checkout (its root folder), all at one commit")
    parser.add_argument("--commit", required=True, help="the checkout's commit, recorded in the output")
    parser.add_argument("--note", default=None, help="a sentence on where the sources came from")
    parser.add_argument("-o", "--out", type=Path, default=None, help="write here (default: stdout)")
    args = parser.parse_args(argv)
    if not (args.checkout / ARGUMENTS).is_file():
        print(f"checkout: {args.checkout} has no {ARGUMENTS} (not a Megatron-LM checkout)", file=sys.stderr)
        return 2
    text = _dumps(table_at(args.checkout, args.commit, args.note))
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    return 0


def table_at(root: Path, commit: str, note: str | None = None) -> dict:
    """The flag table of the checkout at ``root``, naming ``commit`` and the SHA-256 of every file read."""
    table = extract(root)
    table["source"] = {
        "repository": "NVIDIA/Megatron-LM",
        "commit": commit,
        "files": {path: file_sha256(root / path) for path in table.pop("files_read")},
        **({"note": note} if note else {}),
    }
    return table


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _dumps(table: dict) -> str:
    """JSON with one argument per line, so that a regenerated table diffs line by line."""
    head = {k: v for k, v in table.items() if k != "arguments"}
    lines = ",\n".join("  " + json.dumps(entry) for entry in table["arguments"])
    body = json.dumps(head, indent=1)[:-2]
    return f'{body},\n "arguments": [\n{lines}\n ]\n}}\n'


def extract(root: Path) -> dict:
    """The flag table of the checkout at ``root``."""
    reader = _Reader(root)
    module = reader.module(ARGUMENTS)
    functions = {node.name: node for node in module.body if isinstance(node, ast.FunctionDef)}
    entries: list[dict] = []
    unresolved: list[str] = []
    for name in _group_functions(functions):
        if name not in functions:
            unresolved.append(f"{ARGUMENTS}:{name} (not defined)")
            continue
        entries += _literal_and_factory_flags(reader, ARGUMENTS, module, functions[name], unresolved)
    flags: dict[str, dict] = {}
    conflicts: list[str] = []
    for entry in entries:
        taken = [o for o in entry["options"] if o in flags]
        if taken:  # argparse would refuse the second definition; the first one stays
            conflicts.append(f"{', '.join(taken)} defined again by {entry['group']}")
            entry["options"] = [o for o in entry["options"] if o not in flags]
            if not entry["options"]:
                continue
        for option in entry["options"]:
            flags[option] = entry
    unique = []
    for entry in flags.values():
        if entry not in unique:
            unique.append(entry)
    return {
        "generated_by": "scripts/extract_megatron_flags.py",
        "parser": "argparse.ArgumentParser(allow_abbrev=False) of megatron/training/arguments.py",
        "arguments": unique,
        "unresolved": unresolved,
        "conflicts": conflicts,
        "files_read": sorted(reader.read),
    }


def _group_functions(functions: dict[str, ast.FunctionDef]) -> list[str]:
    """The ``_add_*`` functions in the order ``add_megatron_arguments`` (older: ``parse_args``) calls them."""
    for entry in ("add_megatron_arguments", "parse_args"):
        node = functions.get(entry)
        if node is None:
            continue
        names = [call.func.id for call in ast.walk(node)
                 if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                 and call.func.id.startswith("_add_")]
        if names:
            return sorted(set(names), key=names.index)
    raise SystemExit(f"{ARGUMENTS}: no add_megatron_arguments / parse_args calling _add_* functions")


def _literal_and_factory_flags(reader, path, module, function, unresolved) -> list[dict]:
    out: list[dict] = []
    lists = {}  # local names bound to list literals (the exclude lists)
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                lists[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    calls = sorted((n for n in ast.walk(function) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    for call in calls:
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "add_argument":
            out.append(_literal_flag(call, function.name))
        elif isinstance(func, ast.Name) and func.id == "ArgumentGroupFactory" and call.args:
            exclude: list[str] = []
            for kw in call.keywords:
                if kw.arg == "exclude":
                    exclude = lists[kw.value.id] if isinstance(kw.value, ast.Name) else ast.literal_eval(kw.value)
            cls_name = call.args[0].id
            found = reader.find_class(path, module, cls_name, function)
            if found is None:
                unresolved.append(f"{function.name}: ArgumentGroupFactory({cls_name}) (class not found)")
                continue
            out += _dataclass_flags(reader, found, set(exclude), f"{function.name}:{cls_name}", unresolved)
    return out


def _literal_flag(call: ast.Call, group: str) -> dict:
    entry: dict = {"options": [a.value for a in call.args if isinstance(a, ast.Constant)], "group": group}
    for kw in call.keywords:
        if kw.arg in ("help", "metavar"):
            continue
        entry[kw.arg] = _value(kw.value)
    return _normalise(entry)


def _value(node: ast.AST):
    """A keyword's value: a literal, a builtin type's name, or ``{"expr": source}`` for anything computed
    when Megatron-LM runs (``int(os.getenv(...))``, a lambda)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):  # argparse.BooleanOptionalAction
        return node.attr
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError):
        pass
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "range":  # choices=range(0, 3)
        bounds = [_fold(a) for a in node.args]
        if bounds and all(isinstance(b, int) for b in bounds):
            return list(range(*bounds))
    folded = _fold(node)
    return folded if folded is not None else {"expr": ast.unparse(node)}


def _fold(node: ast.AST) -> int | float | None:
    """The value of constant arithmetic such as ``2**32`` or ``1024 * 1024`` (None for anything else)."""
    import operator

    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Pow: operator.pow,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv}
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in ops:
        left, right = _fold(node.left), _fold(node.right)
        if left is not None and right is not None:
            return ops[type(node.op)](left, right)
    return None


def _normalise(entry: dict) -> dict:
    """argparse's implied defaults: a store action's dest from its first long option; store_true
    defaults to False, store_false to True."""
    action = entry.setdefault("action", "store")
    if "dest" not in entry:
        long = next((o for o in entry["options"] if o.startswith("--")), entry["options"][0])
        entry["dest"] = long.lstrip("-").replace("-", "_")
    if "default" not in entry:
        entry["default"] = {"store_true": False, "store_false": True}.get(action)
    if isinstance(entry.get("choices"), tuple):
        entry["choices"] = list(entry["choices"])
    return entry


def _dataclass_flags(reader, found, exclude: set[str], group: str, unresolved: list[str]) -> list[dict]:
    out = []
    for field in reader.fields(found):
        if field["name"] in exclude or field["init"] is False:
            continue
        entry = _field_flag(reader, found[0], field, group)
        if entry is None:
            unresolved.append(f"{group}.{field['name']}: {field['annotation']} (no argparse type, no argparse_meta)")
            continue
        out.append(entry)
    return out


def _field_flag(reader, path: str, field: dict, group: str) -> dict | None:
    """Megatron-LM's ArgumentGroupFactory._build_argparse_kwargs_from_field, on source text."""
    name = field["name"]
    entry: dict = {"options": ["--" + name.replace("_", "-")], "dest": name, "default": field["default"], "group": group}
    meta = field["argparse_meta"]
    kwargs = _annotation_kwargs(reader, path, field["annotation_node"])
    if kwargs is None and meta is None:
        return None
    if kwargs is not None:
        entry.update(kwargs)
        if entry.get("type") == "bool":
            entry.pop("type")
            entry["action"] = "store_true" if field["default"] == False else "store_false"  # noqa: E712 (Megatron's test)
            if entry["action"] == "store_false":
                entry["options"] = ["--no-" + name.replace("_", "-"), "--disable-" + name.replace("_", "-")]
    if meta:
        if "arg_names" in meta:
            entry["options"] = list(meta.pop("arg_names"))
        entry.update(meta)
    return _normalise(entry)


def _annotation_kwargs(reader, path, node: ast.AST) -> dict | None:
    """``type``/``nargs``/``choices`` for an annotation (``_extract_type``); None where Megatron raises."""
    if isinstance(node, ast.Constant) and node.value is None:
        return None
    if isinstance(node, ast.Name):
        if node.id in BUILTIN_TYPES:
            return {"type": node.id}
        members = reader.enum_members(path, node.id)
        if members is not None:
            return {"type": f"enum:{node.id}", "choices": members}
        return {"type": node.id}  # a class argparse calls on the string (Megatron's rule: any primitive)
    if isinstance(node, ast.Attribute):  # torch.dtype, signal.Signals
        if ast.unparse(node) == "signal.Signals":
            import signal

            return {"type": "enum:signal.Signals", "choices": [s.name for s in signal.Signals]}
        return {"type": ast.unparse(node)}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # X | None
        if isinstance(node.right, ast.Constant) and node.right.value is None:
            return _annotation_kwargs(reader, path, node.left)
        return None
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value).split(".")[-1]
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Optional":
            return _annotation_kwargs(reader, path, args[0])
        if head == "Union":
            if len(args) == 2 and isinstance(args[1], ast.Constant) and args[1].value is None:
                return _annotation_kwargs(reader, path, args[0])
            return None
        if head in ("list", "List") and len(args) == 1:
            inner = _annotation_kwargs(reader, path, args[0])
            return None if inner is None else {**inner, "nargs": "+"}
        if head == "Literal":
            choices = [ast.literal_eval(a) for a in args]
            return {"type": type(choices[0]).__name__, "choices": choices}
    return None


class _Reader:
    """Parses the checkout's modules on demand and resolves imported names to class definitions."""

    def __init__(self, root: Path):
        self.root = root
        self.read: set[str] = set()
        self._modules: dict[str, ast.Module] = {}

    def module(self, path: str) -> ast.Module:
        if path not in self._modules:
            self._modules[path] = ast.parse((self.root / path).read_text(encoding="utf-8"), filename=path)
            self.read.add(path)
        return self._modules[path]

    def _module_paths(self, dotted: str) -> list[str]:
        base = dotted.replace(".", "/")
        if (self.root / f"{base}.py").is_file():
            return [f"{base}.py"]
        folder = self.root / base
        if folder.is_dir():
            files = sorted(p.relative_to(self.root).as_posix() for p in folder.glob("*.py"))
            init = f"{base}/__init__.py"
            return ([init] if init in files else []) + [f for f in files if f != init]
        return []

    def _resolve_relative(self, path: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = path[:-3].split("/")[: -node.level]
        return ".".join(parts + ([node.module] if node.module else []))

    def find_class(self, path: str, module: ast.Module, name: str, scope: ast.AST | None = None, depth: int = 0):
        """(path, ClassDef) for ``name`` as seen from ``path`` (its imports, local or module level)."""
        if depth > 6:
            return None
        for node in module.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return path, node
        imports = [n for n in ast.walk(scope)] if scope is not None else []
        imports += list(module.body)
        for node in imports:
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
                original = next(a.name for a in node.names if (a.asname or a.name) == name)
                for candidate in self._module_paths(self._resolve_relative(path, node)):
                    if not (self.root / candidate).is_file():
                        continue
                    found = self.find_class(candidate, self.module(candidate), original, None, depth + 1)
                    if found is not None:
                        return found
        return None

    def enum_members(self, path: str, name: str) -> list[str] | None:
        found = self.find_class(path, self.module(path), name)
        if found is None:
            return None
        cls = found[1]
        if not any(ast.unparse(b).split(".")[-1] in ("Enum", "IntEnum", "StrEnum") for b in cls.bases):
            return None
        return [t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]

    def fields(self, found) -> list[dict]:
        """The dataclass's fields, base classes first (a redefinition keeps the base's place)."""
        path, cls = found
        fields: dict[str, dict] = {}
        if cls.bases:
            base = self.find_class(path, self.module(path), ast.unparse(cls.bases[0]).split(".")[-1])
            if base is not None:
                for field in self.fields(base):
                    fields[field["name"]] = field
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            if "ClassVar" in ast.unparse(node.annotation):
                continue
            fields[node.target.id] = self._field(node)
        return list(fields.values())

    @staticmethod
    def _field(node: ast.AnnAssign) -> dict:
        default, init, meta = _MISSING, True, None
        value = node.value
        if isinstance(value, ast.Call) and ast.unparse(value.func) in ("field", "dataclasses.field"):
            for kw in value.keywords:
                if kw.arg == "default":
                    default = _value(kw.value)
                elif kw.arg == "default_factory":
                    default = _factory_default(kw.value)
                elif kw.arg == "init":
                    init = ast.literal_eval(kw.value)
                elif kw.arg == "metadata" and isinstance(kw.value, ast.Dict):
                    for key, item in zip(kw.value.keys, kw.value.values, strict=True):
                        if isinstance(key, ast.Constant) and key.value == "argparse_meta":
                            meta = {ast.literal_eval(k): _value(v) for k, v in zip(item.keys, item.values, strict=True)}
        elif value is not None:
            default = _value(value)
        if default is _MISSING:
            default = None
        return {"name": node.target.id, "annotation": ast.unparse(node.annotation),
                "annotation_node": node.annotation, "default": default, "init": init, "argparse_meta": meta}


def _factory_default(node: ast.AST):
    """A ``default_factory``'s value where it is plain: list/dict/tuple, or a lambda returning a literal."""
    if isinstance(node, ast.Name) and node.id in ("list", "dict", "tuple"):
        return {"list": [], "dict": {}, "tuple": []}[node.id]
    if isinstance(node, ast.Lambda):
        return _value(node.body)
    return {"expr": f"{ast.unparse(node)}()"}


if __name__ == "__main__":
    sys.exit(main())
