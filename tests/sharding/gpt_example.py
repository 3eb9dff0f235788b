"""The shipped sharding examples (examples/sharding/*.py), loaded as modules for the tests."""

import importlib.util
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parents[2] / "examples" / "sharding"


def example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def gpt():
    return example("gpt_block")
