"""Framework presets (``catalog/frameworks/*.yaml``): what a framework at a named version does
by default for the plan fields a user does not state, each default with its source.

A preset is named ``name-version`` (``nemo-24.07``); its name alone (``nemo``) is its newest
version in the catalog. It runs on one of paraplan's engines (megatron, deepspeed, fsdp) and
sets only fields the user left out: a stated field always wins, and where it differs from the
preset's default the prediction says the user's value was used. What a preset records that the
plan has no field for yet (an attention kernel the plan has no choice for, such as Megatron-LM
2022's unfused softmax, which the model's ``attention`` carries) is listed as recorded, not
modelled.
What a framework launches at all (``runs``: fms-fsdp only data parallelism, tp = pp = cp = ep = 1,
and activation checkpointing of whole blocks only, recompute none | full | layer) is one rule,
``runs_problem``: a job naming the preset is refused outside it, and the search's axes for the
preset keep only the values it allows.
The published-runs reader finds a record's preset by the ``keywords`` of these files (a newer
version's file names its version, ``torchtitan 0.3``, so that a record naming the framework alone
stays with the version its date ran). Besides the plan fields of the engines, a preset may set the
loss as the framework's recipes run it (``compile_loss``, ``loss_chunks``) and whether torch's
pipelining keeps every micro-batch's output (``pipeline_keeps_outputs``, with pp > 1), and whether the
trainer frees the gradients between steps (``grads_set_to_none``: the memory timeline's).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal, get_args, get_origin

from paraplan.catalog.loader import read_catalog_yaml
from paraplan.specs import PLAN_ALIASES, ConfigError, Framework, ModelSpec, ParallelPlan, Recompute
from paraplan.specs.plan import RECOMPUTE_CHOICES
from paraplan.specs.preset import PresetUse

# When a default applies, read from the plan as the user left it (after the defaults before it):
# in words (``default_rule``) and shortly (``paraplan catalog frameworks``' "sets" column)
_WHEN = {
    "always": ("", ""),
    "tensor_parallel": ("with tp > 1", "tp>1"),
    "sequence_parallel": ("with sequence parallelism and tp > 1", "sp"),
    "interleaved": ("with the interleaved schedule (vpp > 1)", "vpp>1"),
    "sharded_over_nodes": ("when ZeRO shards over whole nodes", "ZeRO over nodes"),
    "layer_recompute": ("with recompute 'layer'", "recompute layer"),
    "fp8": ("with precision fp8", "fp8"),
    "fp8_delayed": ("with precision fp8 and the delayed recipe", "fp8 delayed"),
    "context_parallel": ("with context parallelism (cp > 1)", "cp>1"),
    "pipeline_parallel": ("with pipeline parallelism (pp > 1)", "pp>1"),
}
# the order defaults are applied in (a later one may depend on an earlier one)
_ORDER = ("zero_stage", "sequence_parallel", "tp_comm_overlap", "tp_comm_overlap_cfg", "async_tp", "overlap_p2p_comm",
          "scatter_gather_p2p", "overlap_grad_reduce", "grad_reduce_in_fp32", "cross_entropy_loss_fusion", "compile_loss", "fsdp_version",
          "optimizer_impl", "grad_clip_scale", "recompute",
          "recompute_every", "loss_chunks", "pipeline_keeps_outputs", "grads_set_to_none", "data_parallel_shard_degree", "cp_comm_type",
          "attention_kernel", "fp8_recipe", "fp8_amax_reduce", "te_fp8_bookkeeping")
_RECORDED = ("attention_kernel", "fp8_recipe", "tp_comm_overlap_cfg")
# Model fields a preset may set (``model_defaults``): how the framework's own model code runs a
# kernel the model's architecture has, each applying only where the model has it
# (field -> (the architecture field, its value)).
MODEL_DEFAULTS = {"rmsnorm_fusion": ("normalization", "rmsnorm"), "swiglu_fusion": ("activation", "swiglu"),
                  "qkv_fusion": ("multi_latent_attention", False), "gate_up_fusion": ("activation", "swiglu"),
                  "rope_impl": ("position_embedding", "rotary"), "gqa_expand": ("multi_latent_attention", False),
                  # the dropout probabilities the framework's own model configuration runs (every
                  # model has the sites: no architecture field)
                  "attention_dropout": (None, None), "hidden_dropout": (None, None)}
# The parallel degrees a preset may limit (``runs``), by their short plan names (``ParallelPlan``'s
# properties and the search's axes).
RUNS_AXES = ("tp", "pp", "cp", "ep")
# The plan choices a preset may limit (``runs``): the recompute policies the framework offers (a
# subset of its engine's ``RECOMPUTE_CHOICES``: fms-fsdp checkpoints whole blocks, no per-op policy).
RUNS_CHOICES = ("recompute",)


@dataclass(frozen=True, slots=True)
class Default:
    field: str
    value: Any  # "node" for data_parallel_shard_degree: the node's GPUs
    when: str
    source: str
    max_params_billion: float | None = None  # the hybrid-shard rule's model size bound


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    version: str
    engine: Framework
    label: str
    keywords: tuple[str, ...]
    priority: int  # the reader tries presets' keywords in this order (specific names first)
    defaults: tuple[Default, ...]
    recorded: dict[str, tuple[str, str]]  # field -> (value, source)
    # the model fields of ``MODEL_DEFAULTS`` the framework's model code sets (eager kernels)
    model_defaults: tuple[Default, ...] = ()
    # axis of ``RUNS_AXES`` or ``RUNS_CHOICES`` -> (the values the framework launches, source); an
    # axis absent: any
    runs: dict[str, tuple[tuple[Any, ...], str]] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.name}-{self.version}"


@functools.cache
def presets() -> dict[str, Preset]:
    """Every preset in the catalog by its id (name-version), sorted."""
    out: dict[str, Preset] = {}
    folder = resources.files("paraplan.catalog") / "frameworks"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith((".yaml", ".yml")):
            preset = _preset(read_catalog_yaml(entry.read_text(encoding="utf-8")), entry.name)
            out[preset.id] = preset
    return out


def _model_value(field_name: str, value: Any) -> bool:
    """Whether ``value`` is one ModelSpec's ``field_name`` takes: one of its choices (a Literal
    field: ``rope_impl``, ``gqa_expand``), else true or false."""
    annotation = ModelSpec.model_fields[field_name].annotation
    if get_origin(annotation) is Literal:
        return value in get_args(annotation)
    if MODEL_DEFAULTS[field_name][0] is None:  # a probability (dropout)
        return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1
    return isinstance(value, bool)


def model_default_applies(model: ModelSpec | dict[str, Any], field_name: str) -> bool:
    """Whether ``model`` has what the preset's model default ``field_name`` describes (an
    RMSNorm for ``rmsnorm_fusion``; always for a field with no architecture field: dropout)."""
    arch, value = MODEL_DEFAULTS[field_name]
    if arch is None:
        return True
    has = getattr(model, arch) if isinstance(model, ModelSpec) else model.get(arch, ModelSpec.model_fields[arch].default)
    return bool(has == value)


def _preset(raw: dict[str, Any], where: str) -> Preset:
    defaults = []
    for key, spec in (raw.get("defaults") or {}).items():
        if key not in _ORDER or not spec.get("source") or spec.get("when", "always") not in _WHEN:
            raise ConfigError(f"{where}: defaults.{key}: not a plan field a preset sets, or no source / bad when")
        defaults.append(Default(key, spec["value"], spec.get("when", "always"), spec["source"],
                                spec.get("max_params_billion")))
    defaults.sort(key=lambda d: _ORDER.index(d.field))
    recorded = {}
    for key, spec in (raw.get("recorded") or {}).items():
        if key not in _RECORDED or not spec.get("source"):
            raise ConfigError(f"{where}: recorded.{key}: unknown, or no source")
        recorded[key] = (str(spec["value"]), spec["source"])
    model_defaults = []
    for key, spec in (raw.get("model_defaults") or {}).items():
        if key not in MODEL_DEFAULTS or not _model_value(key, spec.get("value")) or not spec.get("source"):
            raise ConfigError(f"{where}: model_defaults.{key}: not a model field a preset sets "
                              f"({', '.join(MODEL_DEFAULTS)}), not one of its values, or no source")
        model_defaults.append(Default(key, spec["value"], "always", spec["source"]))
    runs = {}
    engine = Framework(raw["engine"])
    for key, spec in (raw.get("runs") or {}).items():
        spec = spec if isinstance(spec, dict) else {}
        values = spec.get("values")
        if key in RUNS_CHOICES:
            offered = [r.value for r in RECOMPUTE_CHOICES[engine]]
            if not spec.get("source") or not isinstance(values, list) or not values or any(
                    v not in offered for v in values):
                raise ConfigError(f"{where}: runs.{key}: no source, or values not a list of {engine.value}'s "
                                  f"recompute policies ({', '.join(offered)})")
            runs[key] = (tuple(values), spec["source"])
            continue
        if key not in RUNS_AXES or not spec.get("source") or not isinstance(values, list) or not values or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            raise ConfigError(f"{where}: runs.{key}: not a parallel degree or choice a preset limits "
                              f"({', '.join(RUNS_AXES + RUNS_CHOICES)}), "
                              "no source, or values not a list of positive whole numbers")
        runs[key] = (tuple(values), spec["source"])
    return Preset(str(raw["name"]), str(raw["version"]), engine, raw["label"],
                  tuple(raw.get("keywords") or ()), int(raw.get("priority", 100)), tuple(defaults), recorded,
                  tuple(model_defaults), runs)


def preset_names() -> list[str]:
    return list(presets())


def _version_key(preset: Preset) -> tuple[Any, ...]:
    """Newer sorts later; a year-first version (``2024.08``, a dated snapshot of a framework's main
    branch before its numbered releases in the catalog: torchtitan's) before any numbered one."""
    parts = tuple(int(p) if p.isdigit() else p for p in re.split(r"[.\-]", preset.version))
    dated = isinstance(parts[0], int) and parts[0] >= 1900
    return (0 if dated else 1, *parts)


def find_preset(value: Any) -> Preset | None:
    """The preset ``value`` names (``nemo-24.07``, or ``nemo``: its newest version); None for one
    of the engines themselves (megatron, deepspeed, fsdp) or a non-string; a ConfigError listing
    the presets for any other name."""
    if not isinstance(value, str) or value in {f.value for f in Framework}:
        return None
    table = presets()
    key = value.strip().lower()
    if key in table:
        return table[key]
    versions = [p for p in table.values() if p.name == key]
    if versions:
        return max(versions, key=_version_key)
    engines = " | ".join(f.value for f in Framework)
    raise ConfigError(f"parallel.framework: {value!r} is not an engine ({engines}) nor a preset the catalog has: "
                      f"{', '.join(table)}")


def preset_for_words(text: str) -> Preset | None:
    """The preset whose keywords a published record's framework words name (the first in
    the files' ``priority`` order, then by id), or None."""
    low = text.lower()
    for preset in sorted(presets().values(), key=lambda p: (p.priority, p.id)):
        if any(word in low for word in preset.keywords):
            return preset
    return None


def apply_preset(parallel: dict[str, Any], preset: Preset, *, num_gpus: int, gpus_per_node: int,
                 model: ModelSpec | dict[str, Any] | None = None,
                 params_billion: float | None = None, precision: Any = None) -> tuple[dict[str, Any], PresetUse]:
    """``parallel`` (a job's plan mapping) with the preset's defaults laid under it, its
    framework the preset's engine, and what was taken, kept and recorded. ``precision`` (the
    job's) decides the defaults that apply only to FP8 training (``fp8_recipe``)."""
    plan = {PLAN_ALIASES.get(k, k): v for k, v in parallel.items()}
    stated = set(plan) - {"framework"}
    plan["framework"] = preset.engine.value
    taken: dict[str, Any] = {}
    overridden: dict[str, tuple[Any, Any]] = {}
    for default in preset.defaults:
        if default.when in ("fp8", "fp8_delayed") and str(getattr(precision, "value", precision)).lower() != "fp8":
            continue
        if default.when == "fp8_delayed" and str(getattr(plan.get("fp8_recipe"), "value",
                                                         plan.get("fp8_recipe")) or "delayed") != "delayed":
            continue
        if not _applies(default, plan, num_gpus, gpus_per_node, model, params_billion):
            continue
        value = gpus_per_node if default.value == "node" else default.value
        if default.field in stated:
            if plan[default.field] != value:
                overridden[default.field] = (plan[default.field], value)
        else:
            plan[default.field] = value
            taken[default.field] = value
    recorded = {k: v for k, (v, _) in preset.recorded.items()}
    return plan, PresetUse(preset=preset.id, label=preset.label, engine=preset.engine, taken=taken,
                           overridden=overridden, recorded=recorded)


def apply_model_defaults(model: ModelSpec | dict[str, Any], preset: Preset
                         ) -> tuple[ModelSpec | dict[str, Any], dict[str, Any], dict[str, tuple[Any, Any]]]:
    """``model`` (a ModelSpec, or a job's model mapping) with the preset's ``model_defaults``
    laid under the fields it states, each only where the model has the kernel it describes (an
    RMSNorm, a SwiGLU); and what was taken and what the model stated differently (kept)."""
    spec = isinstance(model, ModelSpec)
    stated = model.model_fields_set if spec else set(model)
    taken: dict[str, Any] = {}
    overridden: dict[str, tuple[Any, Any]] = {}
    for default in preset.model_defaults:
        if not model_default_applies(model, default.field):
            continue
        if default.field in stated:
            mine = getattr(model, default.field) if spec else model[default.field]
            if mine != default.value:
                overridden[default.field] = (mine, default.value)
        else:
            taken[default.field] = default.value
    if not taken:
        return model, taken, overridden
    return (model.model_copy(update=taken) if spec else {**model, **taken}), taken, overridden


def _applies(default: Default, plan: dict[str, Any], num_gpus: int, node: int,
             model: ModelSpec | dict[str, Any] | None, params_billion: float | None) -> bool:
    tp = int(plan.get("tensor_model_parallel_size") or 1)
    if default.when == "tensor_parallel":
        return tp > 1
    if default.when == "sequence_parallel":
        return tp > 1 and bool(plan.get("sequence_parallel"))
    if default.when == "context_parallel":
        return int(plan.get("context_parallel_size") or 1) > 1
    if default.when == "pipeline_parallel":
        return int(plan.get("pipeline_model_parallel_size") or 1) > 1
    if default.when == "layer_recompute":
        return plan.get("recompute") == "layer"
    if default.when == "interleaved":
        vpp = plan.get("virtual_pipeline_model_parallel_size") or 1
        return vpp > 1 or plan.get("schedule") == "interleaved"
    if default.when == "sharded_over_nodes":
        model_parallel = tp * int(plan.get("pipeline_model_parallel_size") or 1) * int(plan.get("context_parallel_size") or 1)
        dp = plan.get("data_parallel_size") or num_gpus // max(model_parallel, 1)
        if int(plan.get("zero_stage") or 0) < 1 or dp <= node or dp % node:
            return False
        if default.max_params_billion is not None:
            billions = params_billion if params_billion is not None else model_billions(model)
            return billions is not None and billions <= default.max_params_billion
    return True


def model_billions(model: ModelSpec | dict[str, Any] | None) -> float | None:
    """A dense model's parameters in billions, near enough for a preset's size rule (the
    weights of attention, MLP and embeddings; None when the model cannot be read)."""
    try:
        m = model if isinstance(model, ModelSpec) else ModelSpec.model_validate(model)
    except (ValueError, TypeError):
        return None
    h, layers = m.hidden_size, m.num_layers
    kv = (m.kv_channels or h // m.num_attention_heads) * (m.num_query_groups or m.num_attention_heads)
    ffn = m.ffn_hidden_size or 4 * h
    mlp = (3 if m.activation == "swiglu" else 2) * h * ffn
    vocab = m.padded_vocab_size or m.vocab_size or 0
    embed = vocab * h * (2 if m.untie_embeddings_and_output_weights else 1)
    return (layers * (2 * h * h + 2 * h * kv + mlp) + embed) / 1e9


def runs_problem(preset: Preset, axis: str, value: Any) -> str | None:
    """Why ``preset`` cannot launch ``axis`` (tp, pp, cp, ep; recompute) at ``value`` (None: it
    can): the one rule the job validator and the search share."""
    value = getattr(value, "value", value)
    if axis not in preset.runs or value in preset.runs[axis][0]:
        return None
    runs = " or ".join(map(str, preset.runs[axis][0]))
    shown = repr(value) if isinstance(value, str) else value
    return f"parallel.{axis}: {preset.id} ({preset.label}) runs {axis} {runs} only, not {shown}"


def plan_runs_problem(preset: Preset, plan: dict[str, Any]) -> str | None:
    """``runs_problem`` of a job's plan mapping (``apply_preset``'s, long field names; an unstated
    degree is 1, a value that is not a whole number left to the plan validator), checked before
    the plan's other rules: a framework that never runs tp is no reason to ask for more of it."""
    for axis in RUNS_AXES:
        value = plan.get(PLAN_ALIASES[axis], ParallelPlan.model_fields[PLAN_ALIASES[axis]].default)
        if isinstance(value, int) and not isinstance(value, bool) and (problem := runs_problem(preset, axis, value)):
            return problem
    for choice in RUNS_CHOICES:  # a value that is no policy at all is left to the plan validator
        value = plan.get(choice, ParallelPlan.model_fields[choice].default)
        value = getattr(value, "value", value)
        if isinstance(value, str) and value in {r.value for r in Recompute} and (
                problem := runs_problem(preset, choice, value)):
            return problem
    return None


def default_rule(preset: Preset, field: str) -> str:
    """When ``preset``'s default for ``field`` applies, in words ("with tp > 1"; "" always)."""
    return next((_WHEN[d.when][0] for d in preset.defaults if d.field == field), "")


def when_short(default: Default) -> str:
    """When ``default`` applies, shortly ("tp>1", "sp"; "" always)."""
    return _WHEN[default.when][1]


def preset_sources(preset: Preset) -> dict[str, str]:
    """Every default's and recorded field's source (``paraplan catalog`` and tests)."""
    return {**{d.field: d.source for d in (*preset.defaults, *preset.model_defaults)},
            **{k: s for k, (_, s) in preset.recorded.items()},
            **{f"runs.{k}": s for k, (_, s) in preset.runs.items()}}


__all__ = ["MODEL_DEFAULTS", "RUNS_AXES", "RUNS_CHOICES", "Default", "Preset", "apply_model_defaults", "apply_preset", "default_rule",
           "find_preset", "model_billions", "plan_runs_problem", "preset_for_words", "preset_names", "preset_sources",
           "presets", "runs_problem", "when_short"]
