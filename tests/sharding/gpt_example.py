"""The shipped GPT example (examples/sharding/gpt_block.py), loaded as a module for the tests."""

import importlib.util
import sys
from pathlib import Path

EXAMPLE = Path(__file__).parents[2] / "examples" / "sharding" / "gpt_block.py"


def gpt():
    spec = importlib.util.spec_from_file_location("gpt_block", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpt_block"] = module
    spec.loader.exec_module(module)
    return module
