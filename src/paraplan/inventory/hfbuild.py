"""Building a Hugging Face model from its config on the meta device (``inventory.hftrace``):
the config object, the causal LM, its decoder layers grouped into kinds, and its parameters
counted exactly from the module tree (tied weights once; routed experts' active share).

``torch`` and ``transformers`` are the ``hf`` extra, imported only when a function runs.
Remote code runs only with ``trust_remote_code=True``."""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paraplan.specs import ConfigError

_WHERE = "model.hf_config"


def _need(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"{_WHERE}: {module} is not installed: tracing a model's code needs the 'hf' extra "
            "(pip install 'paraplan[hf]')"
        ) from None


@contextmanager
def quiet_transformers():
    """transformers' own warnings (a kernel "falling back to its reference PyTorch
    implementation", which is what a meta-device trace wants) silenced while paraplan builds and
    traces; the caller's verbosity is restored after. Library code never prints."""
    logging = _need("transformers").utils.logging
    before = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(before)


def read_config(path: Path) -> dict[str, Any]:
    """A config.json (or a model directory holding one) as a mapping."""
    from paraplan.catalog.hf import _read

    return _read(Path(path))


def build_config(config: dict[str, Any], *, trust_remote_code: bool = False) -> Any:
    """The ``transformers`` config object of ``config`` (a config.json's mapping)."""
    transformers = _need("transformers")
    model_type = config.get("model_type")
    if config.get("auto_map") and not trust_remote_code:
        raise ConfigError(
            f"{_WHERE}: auto_map: this config needs the model's own remote code; paraplan runs it only "
            "when told to (--trust-remote-code)"
        )
    if not model_type:
        raise ConfigError(f"{_WHERE}: model_type: missing; a config.json names its model_type")
    fields = {k: v for k, v in config.items() if k != "model_type"}
    try:
        cls = transformers.AutoConfig.for_model
        return cls(str(model_type), **fields)
    except (ValueError, KeyError, ZeroDivisionError, TypeError, OverflowError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        bad = _bad_size(config)
        if bad is not None and not isinstance(err, KeyError):
            raise ConfigError(f"{_WHERE}: {bad[0]} = {bad[1]}: transformers refuses the config ({first[:120]}); "
                              "give a positive size") from None
        raise ConfigError(
            f"{_WHERE}: model_type {model_type!r}: transformers {transformers.__version__} cannot build it "
            f"({first[:120]}); upgrade transformers or describe the model by its fields"
        ) from None



def _decoder_layers(model, num_layers: int):
    """(dotted name, ModuleList) of the decoder layers: the longest ModuleList of the model."""
    import torch

    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    exact = [(n, m) for n, m in lists if len(m) == num_layers]
    pool = exact or lists
    if not pool:
        raise ConfigError(f"{_WHERE}: the model built from the config has no list of layers to trace")
    return max(pool, key=lambda nm: len(nm[1]))


def _signature(layer, layer_type: str | None) -> str:
    parts = [type(layer).__name__, str(layer_type or "")]
    for name, module in layer.named_modules():
        own = [(n, tuple(p.shape)) for n, p in module.named_parameters(recurse=False)]
        parts.append(f"{name}:{type(module).__name__}:{own}")
        for attr in ("sliding_window", "attention_type", "layer_type", "is_sliding", "use_sliding_window"):
            if hasattr(module, attr) and isinstance(getattr(module, attr), (int, str, bool, type(None))):
                parts.append(f"{attr}={getattr(module, attr)}")
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:12]


def _kind_label(layer, layer_type: str | None, index: int) -> str:
    names = {type(m).__name__.lower() for m in layer.modules()}
    moe = any("moe" in n or "experts" in n or "sparse" in n for n in names)
    parts = [str(layer_type)] if layer_type else []
    parts.append("moe" if moe else "dense")
    return "-".join(parts) + f"@{index}"


def _embedding_and_head(model) -> tuple[int, int]:
    """The input embedding's parameters, and the output head's when it is not tied to it."""
    embeddings = model.get_input_embeddings()
    embedding = sum(p.numel() for p in embeddings.parameters()) if embeddings is not None else 0
    head = model.get_output_embeddings()
    tied = head is not None and embeddings is not None and head.weight is embeddings.weight
    return int(embedding), 0 if head is None or tied else int(sum(p.numel() for p in head.parameters()))



@dataclass(frozen=True, slots=True)
class ParameterCount:
    """A config's parameters from its module tree (tied weights once)."""

    total: int
    embedding: int  # the input embedding(s)
    head: int  # the output projection when it is not tied to the embedding (0 when tied)
    routed: int  # the routed experts' weights (0 for a dense model)
    routed_active: int  # the part of ``routed`` one token runs through (top-k of each block)

    @property
    def active(self) -> int:
        """Parameters one token uses: everything but the routed experts it is not sent to."""
        return self.total - self.routed + self.routed_active


def _build(config: dict[str, Any], trust_remote_code: bool = False, hf_config=None, **kwargs):
    """(config object, the causal LM built from it on the meta device); one line when it cannot be."""
    torch = _need("torch")
    transformers = _need("transformers")
    if hf_config is None:
        hf_config = build_config(config, trust_remote_code=trust_remote_code)
    kwargs.setdefault("dtype", torch.bfloat16)
    try:
        with torch.device("meta"):
            return hf_config, transformers.AutoModelForCausalLM.from_config(
                hf_config, trust_remote_code=trust_remote_code, **kwargs)
    except (ValueError, AssertionError, AttributeError, TypeError, KeyError, RuntimeError, ZeroDivisionError,
            OverflowError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
        bad = _bad_size(config)
        if bad is not None:
            raise ConfigError(f"{_WHERE}: {bad[0]} = {bad[1]}: torch refuses to build the model with it ({first}); "
                              "give a positive size") from None
        raise ConfigError(
            f"{_WHERE}: model_type {config.get('model_type')!r}: transformers cannot build a causal LM of it "
            f"({first}); describe the model by its fields instead"
        ) from None


def _bad_size(config: dict[str, Any]) -> tuple[str, Any] | None:
    """The first size of ``config`` torch cannot build with: a negative integer, or a zero
    width or count (``*_size``, ``*_dim``, ``num_*``, ``n_*``)."""
    for key, value in config.items():
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        sized = key.endswith(("_size", "_dim", "_heads", "_layers")) or key.startswith(("num_", "n_"))
        if value < 0 or (value == 0 and sized):
            return key, value
    return None


def count_parameters(config: dict[str, Any], *, trust_remote_code: bool = False) -> ParameterCount:
    """Every parameter of ``config``'s model built on the meta device, and the active share.

    Routed experts are the modules ``transformers`` stores as one tensor per projection with
    the experts first (``gate_up_proj``/``up_proj``/``down_proj``, 3-D), or a ``ModuleList``
    named ``experts``; a token runs ``num_experts_per_tok`` of them. Shared experts, routers,
    attention, norms, embeddings and the head are always active."""
    hf_config, model = _build(config, trust_remote_code)
    text = getattr(hf_config, "get_text_config", lambda: hf_config)()
    top_k = int(getattr(text, "num_experts_per_tok", 0) or getattr(text, "experts_per_token", 0) or 0)
    total = sum(p.numel() for p in model.parameters())
    embedding, head_params = _embedding_and_head(model)
    routed = active = 0
    seen: set[int] = set()
    for name, module in model.named_modules():
        if id(module) in seen:
            continue
        stacked = [p for n, p in module.named_parameters(recurse=False)
                   if p.dim() == 3 and n.split("_")[0] in ("gate", "up", "down", "w1", "w2", "w3")]
        listed = name.rsplit(".", 1)[-1] == "experts" and len(module) > 1 if hasattr(module, "__len__") else False
        if stacked or listed:
            own = list(module.parameters())
            experts = int(getattr(module, "num_experts", 0) or (len(module) if listed else stacked[0].shape[0]))
            n = sum(p.numel() for p in own)
            routed += n
            active += n * min(top_k, experts) // experts if experts else n
            seen.update(id(m) for m in module.modules())
    return ParameterCount(total=int(total), embedding=int(embedding), head=int(head_params),
                          routed=int(routed), routed_active=int(active))
