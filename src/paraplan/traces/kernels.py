"""A GPU kernel's own name, and its compute class from a table of rules on that name.

A profiler shows a kernel by its demangled signature: return type, namespaces (some with
template arguments), the function's template arguments and its parameter list. Only the
function's own name (and the namespaces around it) says what the kernel does; its template
arguments name the functors, types and libraries it was instantiated with
(``at::native::vectorized_elementwise_kernel<4, fbgemm_gpu::...>``), so a rule that searched the
whole signature would match them. :func:`kernel_name` cuts the name out::

    void at::native::(anonymous namespace)::foo<float, 4>(float*, int)  ->  at::native::foo

A few kernels are generic launchers whose first template argument is the real kernel
(``cutlass::Kernel<cutlass_80_tensorop_s1688gemm_...>``): the table's ``wrappers`` list them,
and the name is taken from that argument. Itanium-mangled names (``_ZN...``, which some traces
keep) are read for their nested name the same way.

The rules are data (``kernel_classes.yaml``, next to this module): the first rule whose ``name``
pattern is found in the kernel's own name (and whose ``namespace`` pattern, if any, is found in
its namespace path) gives the class. A user's own table (same layout), named by the environment
variable ``PARAPLAN_KERNEL_CLASSES``, is tried before the built-in one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

from paraplan.specs import ConfigError, Precision

#: Environment variable naming a user's table of kernel rules, tried before the built-in one.
USER_TABLE_ENV = "PARAPLAN_KERNEL_CLASSES"
_ANON = "(anonymous namespace)"
_CLONE_SUFFIX = re.compile(r"\s*\[clone [^\]]*\]$")  # a compiler's clone note ("[clone .kd]")
_OPEN = {"<": ">", "(": ")", "[": "]", "{": "}"}


@dataclass(frozen=True)
class KernelName:
    """A kernel's own name and the namespaces around it ("" when none), anonymous ones dropped."""

    namespace: str
    name: str

    @property
    def qualified(self) -> str:
        return f"{self.namespace}::{self.name}" if self.namespace else self.name


@dataclass(frozen=True)
class KernelRule:
    klass: str
    name: re.Pattern
    namespace: re.Pattern | None = None
    source: str = ""  # the table (file) the rule comes from

    def matches(self, kernel: KernelName) -> bool:
        if self.namespace is not None and not self.namespace.search(kernel.namespace):
            return False
        return bool(self.name.search(kernel.name))


@dataclass(frozen=True)
class KernelTable:
    wrappers: frozenset[str]
    rules: tuple[KernelRule, ...]
    precisions: tuple[KernelRule, ...] = ()  # ``klass`` holds the precision ("tf32")


def kernel_name(signature: str, wrappers: frozenset[str] | None = None) -> KernelName:
    """The kernel's own name in a demangled (or Itanium-mangled) CUDA/HIP signature."""
    wrappers = kernel_table().wrappers if wrappers is None else wrappers
    sig = _CLONE_SUFFIX.sub("", signature.strip())
    if sig.startswith("_Z"):
        return _mangled_name(sig, wrappers)
    head, first_template = _declarator(sig.replace(_ANON, "\0"))
    parts = [p for p in head.split("::") if p and p != "\0"]
    if not parts:
        return KernelName("", sig)
    found = KernelName("::".join(parts[:-1]), parts[-1])
    if found.qualified in wrappers and first_template:
        inner = kernel_name(first_template, frozenset())
        return KernelName(inner.namespace or found.namespace, inner.name)
    return found


def _declarator(sig: str) -> tuple[str, str]:
    """(the qualified name with every template argument list removed, the first argument of
    the name's own template list); the parameter list and the return type are dropped."""
    depth, out, word_start = 0, [], 0
    template: list[str] = []
    in_first, closing = False, []
    for ch in sig:
        if ch in _OPEN:
            if depth == 0 and ch == "(":
                break  # the parameter list
            if depth == 0 and ch == "<":
                template, in_first = [], True  # the last list at depth 0 is the name's own
            elif in_first:
                template.append(ch)
            depth += 1
            closing.append(_OPEN[ch])
        elif closing and ch == closing[-1]:
            closing.pop()
            depth -= 1
            if depth == 0:
                in_first = False
            elif in_first:
                template.append(ch)
        elif depth == 0:
            if ch == " ":
                word_start = len(out) + 1  # a return type or qualifier ends here
            out.append(ch)
        elif in_first:
            if ch == "," and depth == 1:
                in_first = False
            else:
                template.append(ch)
    return "".join(out)[word_start:].strip(), "".join(template).strip()


_SOURCE_NAME = re.compile(r"(\d+)")


def _mangled_name(sig: str, wrappers: frozenset[str]) -> KernelName:
    """The nested name of an Itanium-mangled symbol (``_ZN19cutlass_cudnn_train6KernelI...``);
    for a wrapper, the nested name of its first template argument."""
    parts, pos = _source_names(sig, 2)
    if not parts:
        return KernelName("", sig)
    found = KernelName("::".join(parts[:-1]), parts[-1])
    if found.qualified in wrappers and sig[pos:pos + 1] == "I":
        inner, _ = _source_names(sig, pos + 1)
        if inner:
            return KernelName("::".join([found.namespace, *inner[:-1]]).strip(":"), inner[-1])
    return found


def _source_names(sig: str, pos: int) -> tuple[list[str], int]:
    """The <length><identifier> names from ``pos`` until a template list or the end of the
    nested name; substitutions (``S_``, ``St``) and qualifiers are skipped."""
    names: list[str] = []
    while pos < len(sig):
        ch = sig[pos]
        if ch in "NKVrL":
            pos += 1
        elif ch == "S":
            end = sig.find("_", pos)
            if sig[pos + 1:pos + 2] == "t":
                pos += 2
            elif end < 0:
                break
            else:
                pos = end + 1
        elif ch.isdigit():
            m = _SOURCE_NAME.match(sig, pos)
            length = int(m.group(1))
            start = m.end()
            names.append(sig[start:start + length])
            pos = start + length
        else:
            break
    return names, pos


def classify_kernel(signature: str, table: KernelTable | None = None) -> str | None:
    """The compute class of a kernel (None when no rule names it)."""
    table = kernel_table() if table is None else table
    kernel = kernel_name(signature, table.wrappers)
    for rule in table.rules:
        if rule.matches(kernel):
            return rule.klass
    return None


def kernel_precision(signature: str, table: KernelTable | None = None) -> str | None:
    """The precision a kernel's math runs in when its own name says so ("tf32" for fp32
    operands on TF32 tensor cores), else None."""
    if table is None:
        return _precision_in_table(signature)
    if not table.precisions:
        return None
    kernel = kernel_name(signature, table.wrappers)
    for rule in table.precisions:
        if rule.matches(kernel):
            return rule.klass
    return None


@lru_cache(maxsize=65536)
def _precision_in_table(signature: str) -> str | None:
    """``kernel_precision`` with the user's and the built-in table; cached, since a trace
    repeats a few thousand kernel names."""
    return kernel_precision(signature, kernel_table())


def top_unclassified(seconds: Mapping[str, float], limit: int = 10,
                     table: KernelTable | None = None) -> list[tuple[str, float]]:
    """The kernels no rule names, by their own (qualified) name, with their summed time, most
    time first: ``seconds`` maps a kernel's signature to its time."""
    table = kernel_table() if table is None else table
    left: dict[str, float] = {}
    for signature, s in seconds.items():
        if classify_kernel(signature, table) is None:
            name = kernel_name(signature, table.wrappers).qualified
            left[name] = left.get(name, 0.0) + s
    return sorted(left.items(), key=lambda item: (-item[1], item[0]))[:limit]


@lru_cache(maxsize=1)
def kernel_table() -> KernelTable:
    """The user's table (``$PARAPLAN_KERNEL_CLASSES``) followed by the built-in one."""
    text = (resources.files("paraplan.traces") / "kernel_classes.yaml").read_text(encoding="utf-8")
    built_in = load_kernel_table(text, "kernel_classes.yaml")
    user = os.environ.get(USER_TABLE_ENV)
    if not user:
        return built_in
    try:
        user_text = Path(user).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{USER_TABLE_ENV}={user}: cannot read the kernel table ({err})") from None
    mine = load_kernel_table(user_text, user)
    return KernelTable(mine.wrappers | built_in.wrappers, mine.rules + built_in.rules,
                       mine.precisions + built_in.precisions)


def load_kernel_table(text: str, where: str) -> KernelTable:
    """A table of kernel rules from YAML text; one-line ConfigError naming the entry when wrong.

    Layout: ``wrappers: [qualified names]`` and ``rules: [{class, name, namespace}]`` where
    ``name`` (a regular expression searched in the kernel's own name) is required and
    ``namespace`` (searched in its namespace path) optional; ``precisions: [{precision, name,
    namespace}]`` the same for the precision a kernel's math runs in."""
    from paraplan.traces.rules import COMPUTE_CLASSES

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rules", []), list):
        raise ConfigError(f"{where}: expected a mapping with a list of rules under 'rules'")
    rules = _rules(data, "rules", "class", COMPUTE_CLASSES, where)
    if not isinstance(data.get("precisions", []), list):
        raise ConfigError(f"{where}: precisions: expected a list of rules")
    precisions = _rules(data, "precisions", "precision", tuple(p.value for p in Precision), where)
    wrappers = data.get("wrappers", [])
    if not isinstance(wrappers, list) or not all(isinstance(w, str) for w in wrappers):
        raise ConfigError(f"{where}: wrappers: expected a list of qualified names")
    return KernelTable(frozenset(wrappers), rules, precisions)


def _rules(data: dict, section: str, key: str, allowed: tuple[str, ...], where: str) -> tuple[KernelRule, ...]:
    """The rules of one section (``rules``: ``class``; ``precisions``: ``precision``)."""
    rules = []
    for i, entry in enumerate(data.get(section, [])):
        at = f"{where}: {section}[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ConfigError(f"{at}: needs 'name' (a regular expression) and '{key}'")
        value = entry.get(key)
        if value not in allowed:
            raise ConfigError(f"{at}.{key}: {value!r} is not one of {', '.join(allowed)}")
        try:
            name = re.compile(entry["name"])
            ns = re.compile(entry["namespace"]) if entry.get("namespace") else None
        except (re.error, TypeError) as err:
            raise ConfigError(f"{at}: not a regular expression ({err})") from None
        rules.append(KernelRule(value, name, ns, where))
    return tuple(rules)
