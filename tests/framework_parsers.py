"""Megatron-LM's argument parser, rebuilt from tests/fixtures/megatron_flags.json (what
scripts/extract_megatron_flags.py read from the pinned Megatron-LM source), and the helpers that
feed it a recipe's bash arrays."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

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
