"""The page's fields as the CLI's flags: a form's text values typed as the flags of
``paraplan predict`` and ``paraplan search`` take them, the job they describe, and the field an
error message names (so the page shows the message beside that field)."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any

from paraplan.cli.common import JOB_FLAGS
from paraplan.specs import PLAN_ALIASES, ConfigError

#: Longest text a form field may hold (a model mapping is the longest: a few hundred bytes).
MAX_FIELD_CHARS = 64 * 1024

_JOB_TYPES = {f.name: f.type for f in JOB_FLAGS}
_JOB_KEYS = {f.name: f.key for f in JOB_FLAGS}
_FLAG_OF = {f.name: f.flag.partition("/")[0] for f in JOB_FLAGS}
# an error's field, as the package names it, to the form's field: the plan's long names
# (tensor_model_parallel_size) to their short ones (tp)
_LONG_TO_FIELD = {long: short for short, long in PLAN_ALIASES.items()}


def _base_type(annotation: Any) -> type:
    """``int`` of ``int | None`` (and of the text "int | None" a dataclass keeps)."""
    if isinstance(annotation, str):
        for name, kind in (("bool", bool), ("int", int), ("float", float)):
            if re.match(rf"{name}\b", annotation):
                return kind
        return str
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        kinds = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _base_type(kinds[0]) if kinds else str
    return annotation if annotation in (bool, int, float) else str


def typed(name: str, text: Any, kind: type, flag: str) -> Any:
    """A form value as a flag of type ``kind`` takes it; "" (an empty field) is None: not given."""
    if text is None or (isinstance(text, bool) and kind is bool):
        return text
    if isinstance(text, int | float) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str):
        raise ConfigError(f"{name}: expected text, got {type(text).__name__}")
    if len(text) > MAX_FIELD_CHARS:
        raise ConfigError(f"{name}: longer than {MAX_FIELD_CHARS:,} characters")
    text = text.strip()
    if text == "":
        return None
    if kind is bool:
        if text.lower() in ("on", "true", "yes", "1"):
            return True
        if text.lower() in ("off", "false", "no", "0"):
            return False
        raise ConfigError(f"{name}: {flag} is on or off, got {text!r}")
    if kind is int:
        try:
            return int(text.replace("_", "").replace(",", ""))
        except ValueError:
            raise ConfigError(f"{name}: {flag} takes a whole number, got {text!r}") from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{name}: {flag} takes a number, got {text!r}") from None
    return text


def job_flags(form: dict[str, Any], hf_config: Path | None = None) -> dict[str, Any]:
    """The job flags (``catalog.jobs.apply_overrides``' keys) of a predict form: each field
    named as the flag's parameter (tp, micro_batch_size, ...), typed as the flag is."""
    flags: dict[str, Any] = {}
    for name, kind in _JOB_TYPES.items():
        if name == "hf_config":
            continue
        flags[_JOB_KEYS[name]] = typed(name, form.get(name), _base_type(kind), _FLAG_OF[name])
    flags["hf_config"] = None if hf_config is None else str(hf_config)
    return flags


def search_flags(form: dict[str, Any], hf_config: Path | None = None):
    """The ``SearchFlags`` of a search form, fields named and typed as its dataclass fields."""
    from paraplan.search.request import SearchFlags

    given: dict[str, Any] = {}
    for f in dataclasses.fields(SearchFlags):
        if f.name in ("hf_config", "pareto", "executor"):
            continue
        value = typed(f.name, form.get(f.name), _base_type(f.type), "--" + f.name.replace("_", "-"))
        if value is not None:
            given[f.name] = value
    if hf_config is not None:
        given["hf_config"] = str(hf_config)
    given["pareto"] = "page"  # only whether a front is asked for matters: the page always shows it
    return SearchFlags(**given)


_PREFIX = re.compile(r"^\s*(?:error:\s*)?(--)?([A-Za-z_][\w.\-]*)\s*:")


def field_of(message: str, fields: typing.Iterable[str]) -> str | None:
    """The form field a one-line error names: the field before its first colon
    (``parallel.recompute: ...`` -> recompute, ``cluster.num_nodes`` -> num_nodes,
    ``tensor_model_parallel_size`` -> tp); for a message about a whole part (``parallel: tp*pp
    ...``, ``model: unknown model``), the part's field, else the first field it names. None:
    the message names no field of the form (the page shows it above the form)."""
    known = set(fields)
    match = _PREFIX.match(message)
    if match:
        path = match.group(2).replace("-", "_").split(".")
        for part in reversed(path):
            name = _LONG_TO_FIELD.get(part, part)
            if name in known:
                return name
    for word in re.findall(r"[A-Za-z_]+", message):  # the first field the message names
        name = _LONG_TO_FIELD.get(word, word)
        if name in known and len(name) > 1:
            return name
        if word in ("GPU", "gpu") and "gpu" in known:
            return "gpu"
    return None


_NODE_FIELDS = {"name", "num_nodes", "gpus_per_node", "price_per_gpu_hour"}


def fields_of(job: Any) -> dict[str, str]:
    """The predict form's fields that describe ``job`` (a search's plan opened on the predict
    page): catalog names where the job's model and cluster are catalog entries, else their
    fields as YAML; the plan by the form's field names."""
    import yaml

    from paraplan.catalog.jobfile import job_mapping
    from paraplan.catalog.loader import catalog_names

    mapping = job_mapping(job)
    fields: dict[str, str] = {}
    model = mapping.get("model")
    if isinstance(model, dict) and set(model) <= {"name", "seq_length"} and model.get("name") in catalog_names("models"):
        model, fields["seq_length"] = model["name"], str(model.get("seq_length", ""))
    if isinstance(model, str):
        fields.update(model_source="catalog", model=model)
    else:
        fields.update(model_source="mapping", model_yaml=yaml.safe_dump(model, sort_keys=False))
    cluster = mapping.get("cluster")
    cluster = {"name": cluster} if isinstance(cluster, str) else cluster
    if isinstance(cluster, dict) and set(cluster) <= _NODE_FIELDS and cluster.get("name") in catalog_names("clusters"):
        fields.update(cluster_source="catalog", cluster=cluster["name"],
                      **{k: _text(v) for k, v in cluster.items() if k != "name"})
    else:
        fields.update(cluster_source="mapping", cluster_yaml=yaml.safe_dump(cluster, sort_keys=False))
    for key, value in (mapping.get("parallel") or {}).items():
        name = _LONG_TO_FIELD.get(key, key)
        if name == "sequence_parallel":
            fields[name] = "on" if value else "off"
        elif name in _JOB_TYPES and not isinstance(value, dict | list):
            fields[name] = _text(value)
    for key in ("precision", "train_tokens", "memory_headroom"):
        if mapping.get(key) is not None:
            fields[key] = _text(mapping[key])
    return fields


def _text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
