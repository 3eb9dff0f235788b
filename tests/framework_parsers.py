"""Megatron-LM's argument parser, rebuilt from tests/fixtures/megatron_flags.json (what
scripts/extract_megatron_flags.py read from the pinned Megatron-LM source), and the helpers that
feed it a recipe's bash arrays; DeepSpeed's and torchtitan's own config readers."""

from __future__ import annotations

import argparse
import importlib
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

MEGATRON_FLAGS = json.loads((Path(__file__).resolve().parent / "fixtures" / "megatron_flags.json").read_text())


def megatron_parser():
    """Megatron-LM's own parser (``megatron/training/arguments.py``, ``allow_abbrev=False``), rebuilt
    from tests/fixtures/megatron_flags.json: every flag it accepts, literal ones and those
    ArgumentGroupFactory generates from the config dataclasses, extracted from the pinned source by
    scripts/extract_megatron_flags.py (Megatron-LM itself needs a GPU stack to import).

    An unknown flag, a wrong choice or a value of the wrong type fails here as it would there.
    """
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for entry in MEGATRON_FLAGS["arguments"]:
        default = entry["default"]
        if isinstance(default, dict):  # {"expr": ...}: computed when Megatron-LM starts
            default = None
        kwargs = {"dest": entry["dest"], "default": default}
        action = entry["action"]
        if action in ("store_true", "store_false"):
            kwargs["action"] = action
        elif action == "BooleanOptionalAction":
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kind = entry.get("type")
            kwargs["type"] = MEGATRON_TYPES.get(kind, str) if isinstance(kind, str) else str
            if isinstance(entry.get("choices"), list):
                kwargs["choices"] = entry["choices"]
            if "nargs" in entry:
                kwargs["nargs"] = entry["nargs"]
        p.add_argument(*entry["options"], **kwargs)
    return p


def moe_freq_type(x):
    """Megatron-LM's --moe-layer-freq type (megatron/training/arguments.py ``moe_freq_type``): an int,
    or a Python list expression of 0/1 per layer, which it evaluates."""
    if "[" in x:
        return eval(x, {"__builtins__": {}})  # what Megatron-LM's _eval_pattern does
    return int(x)


# the extract's type names -> what argparse calls on the string (enums: their member names, as choices)
MEGATRON_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "moe_freq_type": moe_freq_type,
                  "no_rope_freq_type": moe_freq_type, "la_freq_type": moe_freq_type}


def megatron_defaults():
    """dest -> Megatron-LM's default, as its parser holds it."""
    return vars(megatron_parser().parse_args([]))


def bash_array(text, name):
    """The argv tokens of ``NAME=( ... )`` in a bash script (comments dropped, as bash does)."""
    match = re.search(rf"^{name}=\((.*?)^\)", text, re.M | re.S)
    assert match, f"no {name} array"
    return shlex.split(match.group(1), comments=True)


def parse_megatron(text, *extra_arrays):
    tokens = bash_array(text, "MEGATRON_ARGS")
    for name in extra_arrays:
        tokens += bash_array(text, name)
    return megatron_parser().parse_args(tokens)


def deepspeed_parse(config, dp):
    """The config read by DeepSpeed's own ``DeepSpeedConfig`` (its pydantic models and batch
    checks), with the data-parallel size from the launching framework's mpu, as the engine does;
    skipped where DeepSpeed is not installed."""
    ds_config = pytest.importorskip("deepspeed.runtime.config", reason="DeepSpeed is installed with "
                                    "paraplan[frameworks]")

    class Mpu:  # Megatron-DeepSpeed / GPT-NeoX pass their model-parallel unit
        @staticmethod
        def get_data_parallel_world_size():
            return dp

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ds_config.dist, "get_rank", lambda: 0)  # no process group here
        return ds_config.DeepSpeedConfig(config, mpu=Mpu())


def titan_parse(text, tmp_path, monkeypatch, name="paraplan_recipe", model_spec=None):
    """The recipe parsed by torchtitan's own ConfigManager (``--module``/``--config``), as
    ``torchrun -m torchtitan.train`` does; skipped where torchtitan is not installed."""
    pytest.importorskip("torchtitan", reason="torchtitan is installed with paraplan[frameworks]")
    from torchtitan.config import ConfigManager

    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    if model_spec is not None:  # a model the recipe leaves to the user, or FP8 (needs a GPU to build)
        monkeypatch.setattr(module, "model_spec", model_spec)
    config = ConfigManager().parse_args(["--module", name, "--config", "paraplan_config"])
    monkeypatch.delitem(sys.modules, name)
    return config


class _ReadDict(dict):
    """A config block that records which of its keys DeepSpeed looks up."""

    def __init__(self, data, path, seen):
        super().__init__({k: _ReadDict(v, (*path, k), seen) if isinstance(v, dict) else v for k, v in data.items()})
        self._path, self._seen = path, seen

    def get(self, key, *default):
        self._seen.add((*self._path, key))
        return super().get(key, *default)

    def __getitem__(self, key):
        self._seen.add((*self._path, key))
        return super().__getitem__(key)

    def __contains__(self, key):
        self._seen.add((*self._path, key))
        return super().__contains__(key)


def _key_paths(config, path=()):
    for key, value in config.items():
        yield (*path, key)
        if isinstance(value, dict):
            yield from _key_paths(value, (*path, key))


def deepspeed_unread_keys(config, dp, ignored=("_paraplan",)):
    """The keys of a DeepSpeed config that DeepSpeed neither reads nor validates. DeepSpeedConfig looks
    most keys up in the dict (recorded here) and hands some blocks (zero_optimization, bf16, ...) to
    pydantic models that forbid unknown keys; any other key it ignores without a word, as it would a
    misspelt one (``zero_optimisation``). A block counts as validated when a probe key put into it
    makes DeepSpeedConfig fail."""
    seen: set = set()
    deepspeed_parse(_ReadDict(config, (), seen), dp)
    # the pipeline block is copied whole over its defaults (``get_pipeline_config``) for the pipeline
    # engine to read: its keys are the defaults' keys
    from deepspeed.runtime.config import get_pipeline_config

    seen |= {("pipeline", key) for key in get_pipeline_config({})}
    unread = [p for p in _key_paths(config) if p not in seen and p[0] not in ignored]
    strict: dict = {}
    out = []
    for path in unread:
        parent = path[:-1]
        if parent and parent not in strict:
            probe = json.loads(json.dumps(config))
            block = probe
            for key in parent:
                block = block[key]
            block["paraplan_probe_key"] = 1
            try:
                deepspeed_parse(probe, dp)
                strict[parent] = False
            except ValidationError:  # the block's pydantic model forbids unknown keys
                strict[parent] = True
        if not (parent and strict[parent]):
            out.append(".".join(path))
    return out


def deepspeed_restated_defaults(config):
    """The keys of a DeepSpeed config whose value is DeepSpeed's own default (its pydantic models'
    defaults, ACT_CHKPT_DEFAULT and the *_DEFAULT constants of deepspeed/runtime/constants.py)."""
    from deepspeed.runtime import constants
    from deepspeed.runtime.activation_checkpointing.config import ACT_CHKPT_DEFAULT
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    stage = config.get("zero_optimization", {}).get("stage", 0)
    blocks = {"fp16": DeepSpeedFP16Config().model_dump(), "bf16": DeepSpeedBF16Config().model_dump(),
              "zero_optimization": DeepSpeedZeroConfig(stage=stage).model_dump(),
              "activation_checkpointing": ACT_CHKPT_DEFAULT}
    top = {"gradient_clipping": constants.GRADIENT_CLIPPING_DEFAULT,
           "steps_per_print": constants.STEPS_PER_PRINT_DEFAULT,
           "wall_clock_breakdown": constants.WALL_CLOCK_BREAKDOWN_DEFAULT}
    out = [key for key, value in config.items() if key in top and value == top[key]]
    for block, defaults in blocks.items():
        out += [f"{block}.{key}" for key, value in config.get(block, {}).items()
                if key != "stage" and key in defaults and value == defaults[key]]
    return out


def titan_restated_defaults(text):
    """The literal keyword arguments of a torchtitan recipe's config calls (``TrainingConfig``,
    ``ParallelismConfig``, ``CheckpointManager.Config``, ``Trainer.Config``) whose value is the
    installed torchtitan's own default for that field; skipped where torchtitan is not installed."""
    pytest.importorskip("torchtitan", reason="torchtitan is installed with paraplan[frameworks]")
    import ast
    import dataclasses

    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.trainer import Trainer

    classes = {"TrainingConfig": TrainingConfig, "ParallelismConfig": ParallelismConfig,
               "CheckpointManager.Config": CheckpointManager.Config, "Trainer.Config": Trainer.Config}
    out = []
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func) in classes):
            continue
        name = ast.unparse(node.func)
        fields = {f.name: f for f in dataclasses.fields(classes[name])}
        for keyword in node.keywords:
            field = fields.get(keyword.arg)
            if field is None or field.default is dataclasses.MISSING:
                continue
            try:
                value = ast.literal_eval(keyword.value)
            except ValueError:  # a call or a name: not a literal that could restate a default
                continue
            if value == field.default:
                out.append(f"{name}.{keyword.arg}={value!r}")
    return out
