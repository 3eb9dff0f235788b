"""Read catalog entries (one YAML file per GPU, model or cluster) by name or alias.

Names match case-insensitively and ignoring spaces, dashes and underscores, so
"NVIDIA A100-SXM4-80GB", "a100_sxm4_80gb" and "A100-SXM4-80GB" are the same GPU.
"""

from __future__ import annotations

import difflib
import functools
import re
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from paraplan.specs import (
    ClusterSpec,
    ConfigError,
    GpuSpec,
    HeteroClusterSpec,
    HostLaunchSpec,
    LinkSpec,
    ModelSpec,
    RuntimeMemorySpec,
    UserbuffersSpec,
    format_validation_error,
    short_repr,
)

Kind = Literal["gpus", "models", "clusters"]
_SINGULAR = {"gpus": "GPU", "models": "model", "clusters": "cluster"}


def catalog_key(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", name.lower())


#: The package's own catalog files are trusted: libyaml's safe loader when installed, PyYAML's otherwise.
_CATALOG_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_catalog_yaml(text: str) -> Any:
    """The data of one of the package's catalog YAML files (GPUs, models, clusters, presets)."""
    return yaml.load(text, Loader=_CATALOG_LOADER)


def packaged_yaml(*path: str) -> Any:
    """The data of the catalog file at ``path`` inside the package (``"runtime", "memory.yaml"``;
    ``"intervals.yaml"``)."""
    file = resources.files("paraplan.catalog").joinpath(*path)
    return read_catalog_yaml(file.read_text(encoding="utf-8"))


@functools.cache
def _files(kind: Kind) -> tuple[str, ...]:
    """The file names of one kind's entries, in the order their names are claimed."""
    folder = resources.files("paraplan.catalog") / kind
    return tuple(sorted(e.name for e in folder.iterdir() if e.name.endswith((".yaml", ".yml"))))


def _text(kind: Kind, file: str) -> str:
    return (resources.files("paraplan.catalog") / kind / file).read_text(encoding="utf-8")


@functools.cache
def _entry(kind: Kind, file: str) -> dict[str, Any]:
    """One catalog file's raw mapping, parsed once."""
    return read_catalog_yaml(_text(kind, file))


@functools.cache
def _index(kind: Kind) -> dict[str, tuple[str, dict[str, Any]]]:
    """normalised name or alias -> (canonical name, raw mapping): every file of the kind parsed
    (the first file to claim a name keeps it)."""
    index: dict[str, tuple[str, dict[str, Any]]] = {}
    for file in _files(kind):
        raw = _entry(kind, file)
        name = raw["name"]
        for alias in [name, *raw.get("aliases", ())]:
            index.setdefault(catalog_key(str(alias)), (name, raw))
    return index


# A file's top-level name and one-line aliases list, read as text: looking a name up then parses
# only the file that holds it (parsing all ~90 files took ~17 ms of a 0.34 s `paraplan predict`).
_NAME_LINE = re.compile(r"^name:[ \t]*(.*?)[ \t]*(?:#.*)?$", re.MULTILINE)
_ALIASES_LINE = re.compile(r"^aliases:[ \t]*\[(.*)\][ \t]*(?:#.*)?$", re.MULTILINE)
# a plain YAML scalar that stays a string: no quoting, flow or comment characters, not a number,
# a boolean or null
_PLAIN = re.compile(r"[^\[\]{}'\"#,:&*!|>%@`\s](?:[^\[\]{}'\"#,:]*[^\[\]{}'\"#,:\s])?")
_TYPED = re.compile(r"(?i)y|yes|n|no|true|false|on|off|null|~|[-+]?(?:[\d._]+(?:e[-+]?\d+)?|\.inf|\.nan)|0x[\da-f_]+|0o[0-7_]+|0b[01_]+")


def plain_names(text: str) -> list[str] | None:
    """The name and aliases of a catalog file, from its ``name:`` line and its one-line
    ``aliases: [...]`` list, as its YAML reads them; None where the file writes them any other
    way (quoted, over several lines, typed values, ``aliases`` named elsewhere): that file's
    names are then known only by parsing it."""
    names, aliases = _NAME_LINE.findall(text), _ALIASES_LINE.findall(text)
    if len(names) != 1 or len(aliases) != text.count("aliases"):
        return None
    items = [names[0], *(a.strip() for a in aliases[0].split(","))] if aliases and aliases[0].strip() else names
    if any(not _PLAIN.fullmatch(item) or _TYPED.fullmatch(item) for item in items):
        return None
    return items


@functools.cache
def _key_files(kind: Kind) -> dict[str, str] | None:
    """normalised name or alias -> the file that claims it first, as ``_index`` orders them, from
    each file's text (``plain_names``); None when some file's names are not plain."""
    out: dict[str, str] = {}
    for file in _files(kind):
        names = plain_names(_text(kind, file))
        if names is None:
            return None
        for alias in names:
            out.setdefault(catalog_key(alias), file)
    return out


def _lookup(kind: Kind, key: str) -> tuple[str, dict[str, Any]] | None:
    """(canonical name, raw mapping) of the entry normalised ``key`` names, or None: the one file
    that claims it parsed, else (names not plain, or a file that does not say what its text did)
    every file."""
    files = _key_files(kind)
    file = files.get(key) if files is not None else None
    if file is not None:
        raw = _entry(kind, file)
        if isinstance(raw, dict) and key in {catalog_key(str(a)) for a in [raw.get("name"), *raw.get("aliases", ())]}:
            return raw["name"], raw
    return _index(kind).get(key)


def catalog_names(kind: Kind) -> list[str]:
    """Canonical names of every entry of one kind, sorted."""
    return sorted({name for name, _ in _index(kind).values()})


_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_MODEL_NUMBER = re.compile(r"[a-z]*\d+(?:\.\d+)?")  # the letters before it too: GB200 is not a B200

# How to describe an entry the catalog lacks, inline in a job file (one line each).
_INLINE = {
    "gpus": "describe it in the job file: cluster: {gpu: {name, peak_flops: {bf16: ...}, hbm_bytes, hbm_bandwidth, "
            "intra_node: {bandwidth}}, gpus_per_node}",
    "models": "describe it in the job file: model: {hf_config: config.json} or its num_layers, hidden_size, "
              "num_attention_heads, seq_length, vocab_size",
    "clusters": "describe it in the job file: cluster: {gpu, gpus_per_node, num_nodes, inter_node: "
                "{bandwidth, latency}}",
}


def suggest_catalog_name(kind: Kind, name: str) -> str | None:
    """The catalog name ``name`` is a near-typo of, or None.

    The numbers in a name are its model number and size (H100, A100, H800, A6000; llama-2-7b,
    llama-2-13b; 80GB): names whose numbers differ are different parts, however few characters
    apart (H800 is not a mistyped H200, nor A1000 a mistyped A100). So a suggestion must start
    with the same numbers in the same order (it may add more: "A100-SXM4" -> A100-SXM4-80GB),
    and be close in its letters and separators ("H100-SMX5" -> H100-SXM5-80GB, "perlmuter" ->
    perlmutter); names with exactly the typed numbers go first. A GPU's one letter right after
    its model number names a variant, another part (MI300A is not an MI300X, nor B200A a B200):
    a typed letter must be the catalog name's own (a missing one is a near-typo: MI300 -> MI300X).
    So is a form-factor word (H100 NVL is not an H100-SXM5-80GB): each typed word must be close to
    one of the catalog name's ("H100-SMX5" -> H100-SXM5-80GB); platform words (HGX) do not count."""
    key = catalog_key(name)
    if len(key) > 100:
        return None
    numbers = _numbers(name)
    named = _numbered_keys(kind)
    if kind == "gpus":
        if len(letter := _variant(name)) == 1:
            named = {k: n for k, n in named.items() if _variant_keys(kind)[k] == letter}
        typed = _form_words(name)  # "H100 NVL" is not a mistyped H100-SXM5-80GB ("H100-SMX5" is)
        written = _written_keys(kind)
        named = {k: n for k, n in named.items()
                 if all(difflib.get_close_matches(w, _form_words(written[k]), n=1, cutoff=0.6) for w in typed)}
    exact = [k for k, n in named.items() if n == numbers]
    longer = [k for k, n in named.items() if n[: len(numbers)] == numbers and k not in exact]
    for candidates in (exact, longer):
        close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
        if close:
            return _index(kind)[close[0]][0]
    return None


def _numbers(name: str) -> tuple[str, ...]:
    """The numbers in a name as written, the first with the letter it follows: the model
    number ("A100-SXM4-80GB" -> a100, 4, 80; "NVIDIA H100 80GB" -> h100, 80)."""
    numbers = _NUMBER.findall(name)
    first = _MODEL_NUMBER.search(name.lower())
    return (first.group(0), *numbers[1:]) if first else ()


#: Words a GPU's name may carry that name its platform, not another part (HGX B200 is a B200).
_PLATFORM_WORDS = frozenset({"hgx", "dgx", "gpu", "tensor", "core"})


def _form_words(name: str) -> list[str]:
    """The words of three or more letters after a GPU name's model number: its form factor
    ("H100-SXM5-80GB" -> sxm; "H100 NVL" -> nvl; "A100-PCIE-80GB" -> pcie)."""
    found = _VARIANT.search(name.lower())
    words = re.findall(r"[a-z]{3,}", name.lower()[found.end():]) if found else []
    return [w for w in words if w not in _PLATFORM_WORDS]


_VARIANT = re.compile(r"[a-z]*\d+(?:\.\d+)?([a-z]*)")


def _variant(name: str) -> str:
    """The letters right after the model number ("MI300X" -> x, "A10G" -> g, "H100-SXM5" -> none)."""
    found = _VARIANT.search(name.lower())
    return found.group(1) if found else ""


@functools.cache
def _variant_keys(kind: Kind) -> dict[str, str]:
    """normalised name or alias -> the letters right after its model number, as the catalog writes it."""
    return {key: _variant(alias) for key, alias in _written_keys(kind).items()}


@functools.cache
def _written_keys(kind: Kind) -> dict[str, str]:
    """normalised name or alias -> the name or alias as the catalog writes it (the first to claim it)."""
    out: dict[str, str] = {}
    for name, raw in _index(kind).values():
        for alias in [name, *raw.get("aliases", ())]:
            out.setdefault(catalog_key(str(alias)), str(alias))
    return out


@functools.cache
def _numbered_keys(kind: Kind) -> dict[str, tuple[str, ...]]:
    """normalised name or alias -> the numbers in it as the catalog writes it."""
    return {key: _numbers(alias) for key, alias in _written_keys(kind).items()}


def load_catalog_entry(kind: Kind, name: str) -> dict[str, Any]:
    """The raw mapping of one entry; a ConfigError with a suggestion for a near-typo, else how
    to describe the entry inline."""
    hit = _lookup(kind, catalog_key(name))
    if hit is None:
        close = suggest_catalog_name(kind, name)
        if close is not None:
            raise ConfigError(f"unknown {_SINGULAR[kind]} {short_repr(name)}; did you mean {close}?")
        raise ConfigError(
            f"unknown {_SINGULAR[kind]} {short_repr(name)}, not in the catalog (paraplan catalog {kind}); "
            f"{_INLINE[kind]}"
        )
    return dict(hit[1])


def _validated(cls, raw: dict[str, Any], where: str):
    try:
        return cls.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{where}.{format_validation_error(err)}") from None


@functools.cache
def load_gpu(name: str) -> GpuSpec:
    return _validated(GpuSpec, load_catalog_entry("gpus", name), f"catalog gpus/{name}")


@functools.cache
def load_runtime_memory() -> RuntimeMemorySpec:
    """What a training process holds on a GPU besides its tensors, with sources
    (``catalog/runtime/memory.yaml``)."""
    return _validated(RuntimeMemorySpec, packaged_yaml("runtime", "memory.yaml"), "catalog runtime/memory.yaml")


@functools.cache
def load_host_launch() -> HostLaunchSpec:
    """The host's CPU seconds per launched kernel, measured in a profiler trace, with its
    source (``catalog/runtime/host.yaml``; ``benchmarks/fit_host_launch.py``)."""
    return _validated(HostLaunchSpec, packaged_yaml("runtime", "host.yaml"), "catalog runtime/host.yaml")


def userbuffers_names() -> tuple[str, ...]:
    """The userbuffers configurations of the catalog (``catalog/userbuffers/*.yaml``), by name."""
    folder = resources.files("paraplan.catalog") / "userbuffers"
    return tuple(sorted(e.name.rsplit(".", 1)[0] for e in folder.iterdir() if e.name.endswith(".yaml")))


@functools.cache
def load_userbuffers(name: str) -> UserbuffersSpec:
    """The Transformer Engine userbuffers configuration ``name`` (``parallel.tp_comm_overlap_cfg``),
    with its source; a ConfigError naming the field and the configurations there are."""
    if name not in userbuffers_names():
        raise ConfigError(f"parallel.tp_comm_overlap_cfg: no userbuffers configuration {name!r} in the catalog "
                          f"(there are: {', '.join(userbuffers_names())})")
    return _validated(UserbuffersSpec, packaged_yaml("userbuffers", f"{name}.yaml"), f"catalog userbuffers/{name}")


@functools.cache
def load_model(name: str) -> ModelSpec:
    return _validated(ModelSpec, load_catalog_entry("models", name), f"catalog models/{name}")


def load_cluster(name: str, **overrides: Any) -> ClusterSpec:
    """A catalog cluster, with its GPU resolved and any field overridden (e.g. num_nodes)."""
    raw = load_catalog_entry("clusters", name)
    if "node_groups" in raw:
        raise ConfigError(
            f"cluster {raw['name']!r} has node groups of different GPUs; `paraplan search --cluster "
            f"{raw['name']}` plans for it, predict takes a cluster of one GPU type"
        )
    raw = dict(raw, sources=dict(raw.get("sources", {})))
    changed = [link for link in _LINKS if link in overrides and not _same_link(overrides[link], raw.get(link))]
    for link in changed:  # a link of the user's: the catalog's measurement no longer applies
        raw["sources"].pop(f"{link}_efficiency", None)
    own_gpu = raw.get("gpu")
    raw.update({k: v for k, v in overrides.items() if k != "sources"})
    if "sources" in overrides:
        raw["sources"].update(overrides["sources"])
    if isinstance(raw.get("gpu"), str):
        raw["gpu"] = load_gpu(raw["gpu"])
    other_gpu = "gpu" in overrides and not (isinstance(own_gpu, str) and raw["gpu"] == load_gpu(own_gpu))
    if other_gpu:  # the node's links with another GPU: no longer the catalog entry
        gpu = raw["gpu"]
        gpu_name = gpu.name if isinstance(gpu, GpuSpec) else dict(gpu).get("name", "custom GPU")
        _check_domain(raw, gpu, gpu_name, overrides)
        raw["name"] = f"{raw['name']} with {gpu_name}"
        if "intra_node" not in overrides and not _same_bandwidth(_gpu_link(gpu), raw.get("intra_node")):
            # another GPU's NVLink: its own link, never the node's GPU's (B200 on dgx-h100
            # gets 900 GB/s, not Hopper's 450); the node's measurements were of the other link
            raw.pop("intra_node", None)
            for key in ("intra_node", "intra_node_efficiency"):
                raw["sources"].pop(key, None)
            raw["name"] += f" ({gpu_name}'s own intra-node link)"
        raw.pop("aliases", None)
        if "price_per_gpu_hour" not in overrides:  # the catalog's price was for its own GPU
            raw.pop("price_per_gpu_hour", None)
    if changed:  # another network: no longer the catalog's cluster, and its name must say so
        joiner = " and" if other_gpu else " with"
        raw["name"] = f"{raw['name']}{joiner} a changed {' and '.join(changed)}"
        raw.pop("aliases", None)
    return _validated(ClusterSpec, raw, "cluster")


_LINKS = ("intra_node", "inter_node", "host_link")


def _check_domain(raw: dict[str, Any], gpu: Any, gpu_name: str, overrides: dict[str, Any]) -> None:
    """A node whose NVLink switch system joins several hosts (GB200 NVL72) takes another GPU
    only where that GPU's own reference node has the same scale-up domain (GB300 on a GB200
    rack); any other GPU is refused rather than given the rack's domain or silently one host's."""
    domain = raw.get("scale_up_domain")
    if domain is None or "scale_up_domain" in overrides:
        return
    reference = gpu.reference_node if isinstance(gpu, GpuSpec) else dict(gpu).get("reference_node")
    own = load_catalog_entry("clusters", reference).get("scale_up_domain") if isinstance(reference, str) else None
    if own != domain:
        where = f"; its own node is {reference}" if isinstance(reference, str) else ""
        raise ConfigError(
            f"gpu: {gpu_name} is not built into {raw['name']}'s {domain}-GPU NVLink domain{where} "
            "(name that node, or give scale_up_domain)"
        )


def _gpu_link(gpu: Any) -> Any:
    """A GPU's own intra-node link (a GpuSpec's or a mapping's), or None."""
    return gpu.intra_node if isinstance(gpu, GpuSpec) else dict(gpu).get("intra_node")


def _same_bandwidth(link: Any, other: Any) -> bool:
    """Whether two intra-node links run at the same bandwidth (the same NVLink generation and
    width: a node's measured efficiency then applies to the other GPU too). A GPU with no link
    of its own keeps the node's."""
    if link is None or other is None:
        return True
    try:
        return LinkSpec.model_validate(link).bandwidth_bytes_per_s == LinkSpec.model_validate(other).bandwidth_bytes_per_s
    except ValidationError:
        return False


def _same_link(given: Any, catalog: Any) -> bool:
    """Whether a link a job gives is the catalog's own (an unreadable one is not)."""
    if catalog is None or given is None:
        return given is catalog
    try:
        return LinkSpec.model_validate(given) == LinkSpec.model_validate(catalog)
    except ValidationError:
        return False


def load_any_cluster(name: str) -> ClusterSpec | HeteroClusterSpec:
    """A catalog cluster, homogeneous or with node groups of different GPUs."""
    raw = load_catalog_entry("clusters", name)
    return hetero_cluster(raw) if "node_groups" in raw else load_cluster(name)


def hetero_cluster(raw: dict[str, Any]) -> HeteroClusterSpec:
    """A heterogeneous cluster from a mapping whose ``node_groups`` are catalog cluster names,
    catalog names with fields changed (``{name: aws-g5.12xlarge, num_nodes: 7}``), or
    clusters described in full."""
    groups = raw.get("node_groups")
    if not isinstance(groups, list | tuple) or not groups:
        raise ConfigError("cluster.node_groups: expected a list of node groups (catalog cluster names or mappings)")
    resolved = []
    for i, group in enumerate(groups):
        where = f"cluster.node_groups.{i}"
        if isinstance(group, str):
            group = {"name": group}
        if not isinstance(group, dict):
            raise ConfigError(f"{where}: expected a catalog cluster name or a mapping (gpu, num_nodes, ...)")
        group = dict(group)
        if isinstance(group.get("gpu"), str):
            group["gpu"] = load_gpu(group["gpu"])
        name = group.get("name")
        try:
            if isinstance(name, str) and "gpu" not in group:
                resolved.append(load_cluster(group.pop("name"), **group))
            else:
                resolved.append(_validated(ClusterSpec, group, where))
        except ConfigError as err:
            message = str(err).removeprefix("cluster.").removeprefix("cluster: ")
            raise ConfigError(message if message.startswith(where) else f"{where}: {message}") from None
    return _validated(HeteroClusterSpec, {**raw, "node_groups": resolved}, "cluster")
