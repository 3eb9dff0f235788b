"""Speed of the sharding planner (issue 5, part 7): trace, block, cost and search a 32-layer
model's training step, and, reported separately, compile the chosen plan.

Run: python benchmarks/bench_sharding.py   (needs the `sharding` extra)
Target: a 32-layer GPT analysed and searched in under 5 s on this 2-core machine, excluding
the compile. Shapes only (``jax.eval_shape``): nothing is allocated, so realistic sizes fit.
Times are the best of two runs after a warm-up (JAX's own tracing caches).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp

from paraplan.sharding import search

EXAMPLES = Path(__file__).parents[1] / "examples" / "sharding"
CASES = [  # example, layers, hidden, batch, seq
    ("gpt_block", 32, 1024, 8, 512),
    ("gpt_block", 32, 4096, 8, 2048),
    ("llama_block", 32, 4096, 8, 2048),
    ("moe_layer", 32, 1024, 8, 1024),
]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    print(f"{'example':12s} {'layers':>6s} {'hidden':>6s} {'blocks':>6s} {'search s':>9s} {'compile s':>9s}  plan")
    for name, layers, hidden, batch, seq in CASES:
        m = load(name)
        args = (jax.eval_shape(lambda m=m, layers=layers, hidden=hidden: m.init_params(layers, hidden)),
                jax.ShapeDtypeStruct((batch, seq, hidden), jnp.float32))
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            plan = search(m.train_step, args, {"data": 2, "model": 4}, memory_budget=80e9)
            best = min(best, time.perf_counter() - start)
        check = plan.verify(m.train_step, args)
        roles = sorted({r.strategy for r in plan.reports})
        print(f"{name:12s} {layers:6d} {hidden:6d} {len(plan.reports):6d} {best:9.2f} {check.compile_s:9.2f}  "
              f"{'; '.join(roles)} (diff {check.bytes_difference:+.1%})")


if __name__ == "__main__":
    main()
