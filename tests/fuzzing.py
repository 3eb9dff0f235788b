"""Hostile job files and flag sets, and the judge of what paraplan does with them (issue 15).

A case is a job file's bytes (YAML or JSON) or a command line. Cases start from valid jobs
(catalog names, inline models and GPUs) and break one thing: a field set to a value at or past
its bound (zero, negative, huge, infinite, not-a-number, denormal, a bool, a numeric string, a
unit string with a wrong unit, a long or odd string, a list or mapping where a number goes), a
field removed or misspelt, or a syntax hazard (duplicate keys, an alias bomb, deep nesting,
tabs, a byte-order mark, a NUL, bytes that are not UTF-8, a file cut short, JSON's NaN).

``judge`` runs ``paraplan predict CASE --format json`` in this process and sorts the outcome:
``answer`` (exit 0 with valid JSON whose figures are finite and possible), ``rejected`` (exit 2
with one line on stderr), ``no answer`` (exit 1), or a defect: ``traceback`` (any other
exception, or an error of more than one line), ``internal`` (exit 3), ``impossible`` (exit 0
with a non-finite or impossible figure, or output that is not JSON), ``coerced`` (an answer to
a job with a value of the wrong type: ``true`` or ``"2"`` or ``2.0`` for an integer), ``hang``
(over the time limit), ``memory`` (MemoryError).
A rejection ``names_field`` when its message names the field the case broke (or, for a syntax
hazard, the line or the construct).

Used by tests/unit/test_fuzz.py (a few hundred cases in CI) and benchmarks/fuzz.py (10,000 and
more, each under a memory cap).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

# -- valid starting points ----------------------------------------------------------------------

_INLINE_GPU = {
    "name": "fuzz-gpu",
    "peak_flops": {"bf16": "989 TFLOPS", "fp16": "989 TFLOPS"},
    "hbm_bytes": "80 GB",
    "hbm_bandwidth": "3.35 TB/s",
    "efficiency": {"gemm": {"max_fraction": 0.8, "half_work": 4.0e9}},
}
_INLINE_MODEL = {
    "name": "tiny",
    "num_layers": 4,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "seq_length": 1024,
    "vocab_size": 32000,
    "activation": "swiglu",
    "normalization": "rmsnorm",
    "position_embedding": "rotary",
}

BASES: tuple[dict[str, Any], ...] = (
    {  # the README's demo job
        "name": "demo",
        "model": "llama-3-8b",
        "cluster": {"name": "aws-p5.48xlarge", "num_nodes": 4},
        "parallel": {"tp": 2, "pp": 1, "micro_batch_size": 2, "global_batch_size": 512, "zero_stage": 1,
                     "recompute": "selective", "sequence_parallel": True},
        "precision": "bf16",
        "train_tokens": "1T",
    },
    {  # a pipeline with interleaving and an explicit layer split
        "name": "pipe",
        "model": {"name": "llama-3-8b", "seq_length": 4096},
        "cluster": {"name": "dgx-a100", "num_nodes": 2},
        "parallel": {"tp": 2, "pp": 4, "vpp": 2, "micro_batch_size": 1, "global_batch_size": 64,
                     "recompute": "full"},
    },
    {  # an inline model on an inline GPU with its own links and price
        "name": "inline",
        "model": _INLINE_MODEL,
        "cluster": {"gpu": _INLINE_GPU, "gpus_per_node": 8, "num_nodes": 2,
                    "intra_node": {"bandwidth": "450 GB/s", "latency": "5 us"},
                    "inter_node": {"bandwidth": "50 GB/s", "latency": "10 us"},
                    "price_per_gpu_hour": "2.5 USD"},
        "parallel": {"tp": 4, "pp": 2, "layers_per_stage": [2, 2], "micro_batch_size": 2,
                     "global_batch_size": 16, "zero_stage": 2},
        "train_tokens": 1.0e9,
    },
    {  # a mixture of experts with MLA, shared experts and a layer pattern, expert parallelism
        "name": "moe",
        "model": {**_INLINE_MODEL, "name": "tiny-moe", "num_moe_experts": 8, "moe_router_topk": 2,
                  "moe_ffn_hidden_size": 256, "moe_shared_expert_intermediate_size": 256,
                  "moe_layer_freq": [0, 1, 1, 1], "moe_expert_capacity_factor": 1.5,
                  "multi_latent_attention": True, "q_lora_rank": 128, "kv_lora_rank": 64,
                  "qk_head_dim": 32, "qk_pos_emb_head_dim": 16, "v_head_dim": 32},
        "cluster": {"name": "dgx-h100", "num_nodes": 2},
        "parallel": {"tp": 2, "pp": 2, "ep": 4, "etp": 1, "sequence_parallel": True, "micro_batch_size": 1,
                     "global_batch_size": 32, "zero_stage": 1, "expert_load_imbalance": 1.3,
                     "moe_shared_expert_overlap": True},
    },
    {  # DeepSpeed ZeRO-3
        "name": "zero3",
        "model": "mistral-7b",
        "cluster": "dgx-a100",
        "parallel": {"dp": 8, "zero_stage": 3, "framework": "deepspeed", "micro_batch_size": 2,
                     "global_batch_size": 64, "recompute": "full"},
        "precision": "bf16",
    },
)

# Megatron-LM's long names and paraplan's short ones say the same field.
_ALIASES = {
    "tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size", "dp": "data_parallel_size",
    "cp": "context_parallel_size", "vpp": "virtual_pipeline_model_parallel_size",
    "ep": "expert_model_parallel_size", "etp": "expert_tensor_parallel_size", "num_moe_experts": "num_experts",
    "hbm_bandwidth": "hbm_bandwidth_bytes_per_s", "bandwidth": "bandwidth_bytes_per_s", "latency": "latency_s",
}
_ALIASES.update({v: k for k, v in list(_ALIASES.items())})

# Values at and past the bounds of numbers, units and types.
HAZARDS: tuple[Any, ...] = (
    -1, 0, 1, 3, 7, 2**31, 2**63, 10**30, -(2**63),
    0.0, -0.0, 0.5, 2.0, 1e-310, 1e308, -1e308, math.inf, -math.inf, math.nan,
    True, False, None,
    "", " ", "2", "2.0", "abc", "80 GB", "-5 GB", "0 GB", "1e400 GB", "inf TFLOPS", "nan GB",
    "5 USD", "-5 USD", "1e308 USD", "3 parsecs", "1T", "x" * 5000, "ü∞\u202e", "${HOME}",
    [], {}, [1, 2], [32, 0], {"a": 1}, [[[]]],
)


@dataclass
class Case:
    """A job file's bytes (``suffix`` .yaml or .json) or extra command-line ``args``; ``field``
    is what the case broke (a dotted path, or a syntax hazard's name)."""

    data: bytes = b""
    suffix: str = ".yaml"
    args: tuple[str, ...] = ()
    field: str = ""
    what: str = ""
    coerces: bool = False  # a value of the wrong type, which an answer would have coerced silently

    def __repr__(self) -> str:
        shown = self.data[:300] + (b"..." if len(self.data) > 300 else b"")
        return f"Case({self.what}, field={self.field!r}, args={self.args!r}, {self.suffix}: {shown!r})"


def _paths(value: Any, prefix: str = "") -> list[str]:
    """Every key path of a mapping (list items by index), leaves and inner nodes."""
    out = []
    if isinstance(value, dict):
        for k, v in value.items():
            p = f"{prefix}.{k}" if prefix else str(k)
            out.append(p)
            out.extend(_paths(v, p))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            p = f"{prefix}.{i}"
            out.append(p)
            out.extend(_paths(v, p))
    return out


def _parent(job: dict[str, Any], path: str) -> tuple[Any, str | int]:
    parts = path.split(".")
    node: Any = job
    for p in parts[:-1]:
        node = node[int(p)] if isinstance(node, list) else node[p]
    last = parts[-1]
    return node, (int(last) if isinstance(node, list) else last)


def _dump(job: dict[str, Any], suffix: str) -> bytes:
    if suffix == ".json":
        return json.dumps(job).encode()  # NaN and Infinity as JSON's non-standard literals
    return yaml.safe_dump(job, sort_keys=False, allow_unicode=True).encode()


@st.composite
def field_cases(draw: st.DrawFn) -> Case:
    """One field of a valid job set to a hazard, removed, or joined by a misspelt key."""
    job = copy.deepcopy(draw(st.sampled_from(BASES)))
    path = draw(st.sampled_from(_paths(job)))
    parent, key = _parent(job, path)
    action = draw(st.sampled_from(("set", "set", "set", "drop", "misspell")))
    coerces = False
    if action == "set":
        value = draw(st.one_of(st.sampled_from(HAZARDS), st.integers(-(2**70), 2**70),
                               st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40)))
        coerces = _wrong_type(parent[key], value)
        parent[key] = value
        what = f"set to {value!r}"[:80]
    elif action == "drop":
        del parent[key]
        what = "removed"
    else:
        if isinstance(parent, list):
            parent.append(draw(st.sampled_from(HAZARDS)))
            what = "one item more"
        else:
            parent[f"{key}_"] = parent[key]
            what = f"misspelt as {key}_"
    suffix = draw(st.sampled_from((".yaml", ".yaml", ".json")))
    return Case(_dump(job, suffix), suffix, field=path, what=what, coerces=coerces)


def _wrong_type(was: Any, value: Any) -> bool:
    """``value`` in place of ``was`` is of a type paraplan must refuse rather than convert:
    a bool for a number, a number for a bool, a string or a float (even 2.0) for an integer."""
    if isinstance(was, bool) or isinstance(value, bool):
        return type(was) is not type(value)
    return isinstance(was, int) and isinstance(value, str | float)


def _alias_bomb(levels: int, width: int) -> str:
    """A list of ``levels`` lists, each of ``width`` references to the one before: a few
    hundred bytes that expand to ``width ** levels`` items."""
    lines = [f"  - &a0 [{', '.join(['x'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"  - &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


@st.composite
def syntax_cases(draw: st.DrawFn) -> Case:
    """A valid job's text with a syntax hazard: the field is the hazard's name."""
    job = draw(st.sampled_from(BASES))
    text = yaml.safe_dump(job, sort_keys=False)
    kind = draw(st.sampled_from(("duplicate", "json-duplicate", "alias-bomb", "deep", "tab", "bom", "nul",
                                 "not-utf8", "cut", "json-nan", "empty", "scalar", "huge-int")))
    if kind == "duplicate":
        keyed = [i for i, line in enumerate(text.splitlines()) if ":" in line and not line.lstrip().startswith("-")]
        i = draw(st.sampled_from(keyed))
        lines = text.splitlines()
        key = lines[i].split(":")[0].strip()
        return Case(("\n".join([*lines[: i + 1], lines[i], *lines[i + 1:]]) + "\n").encode(), field=key,
                    what="a key given twice")
    if kind == "json-duplicate":
        body = json.dumps(job)
        return Case((body[:-1] + ', "name": "again"}').encode(), ".json", field="name", what="a key given twice")
    if kind == "alias-bomb":
        where = draw(st.sampled_from(("name", "model", "train_tokens", "precision", "cluster")))
        body = {k: v for k, v in job.items() if k != where}
        return Case((yaml.safe_dump(body, sort_keys=False) + f"{where}:\n" + _alias_bomb(draw(st.integers(6, 9)), 9))
                    .encode(), field=f"{where}.alias", what=f"an alias bomb in {where}")
    if kind == "deep":
        depth = draw(st.sampled_from((100, 2000, 20000)))
        where = draw(st.sampled_from(("parallel", "model", "cluster")))
        body = {k: v for k, v in job.items() if k != where}
        return Case((yaml.safe_dump(body, sort_keys=False) + f"{where}: " + "[" * depth + "]" * depth + "\n").encode(),
                    field=where, what=f"{depth}-deep nesting")
    if kind == "tab":
        return Case(text.replace("  ", "\t", 1).encode(), field="line", what="a tab for indentation")
    if kind == "bom":
        return Case(b"\xef\xbb\xbf" + text.encode(), field="", what="a byte-order mark (valid)")
    if kind == "nul":
        i = draw(st.integers(0, len(text)))
        return Case((text[:i] + "\x00" + text[i:]).encode(), field="line", what="a NUL byte")
    if kind == "not-utf8":
        i = draw(st.integers(0, len(text)))
        return Case(text[:i].encode() + b"\xff\xfe" + text[i:].encode(), field="UTF-8", what="bytes that are not UTF-8")
    if kind == "cut":
        i = draw(st.integers(0, len(text) - 1))
        return Case(text[:i].encode(), field="*", what=f"cut after {i} characters")
    if kind == "json-nan":
        body = json.dumps({**job, "train_tokens": "__NAN__"}).replace('"__NAN__"', "NaN")
        return Case(body.encode(), ".json", field="train_tokens", what="JSON NaN literal")
    if kind == "empty":
        return Case(b"", field="mapping", what="an empty file")
    if kind == "scalar":
        return Case(draw(st.sampled_from((b"42\n", b"- a\n- b\n", b"null\n", b"'text'\n"))), field="mapping",
                    what="not a mapping")
    return Case((text + "seq: " + "9" * 5000 + "\n").encode(), field="seq", what="a 5000-digit integer")


# The flags `paraplan predict` takes, each with values at and past its bounds.
_FLAGS = ("--tp", "--pp", "--dp", "--cp", "--vpp", "--zero-stage", "--micro-batch-size", "--global-batch-size",
          "--num-nodes", "--gpus-per-node", "--price-per-gpu-hour", "--train-tokens", "--recompute", "--schedule",
          "--framework", "--precision", "--model", "--gpu", "--cluster")
_FLAG_VALUES = ("-8", "-1", "0", "1", "3", "7", "1000000", "9223372036854775808", "1e400", "nan", "inf", "true",
                "2.0", "", "abc", "-5 USD", "1e308 USD", "80 GB", "llama-3-8b", "A100", "dgx-h100", "x" * 500)


@st.composite
def flag_cases(draw: st.DrawFn) -> Case:
    """`paraplan predict` on the demo job with one to three flags at hostile values."""
    n = draw(st.integers(1, 3))
    args: list[str] = []
    names = draw(st.lists(st.sampled_from(_FLAGS), min_size=n, max_size=n, unique=True))
    for name in names:
        args += [name, draw(st.one_of(st.sampled_from(_FLAG_VALUES), st.integers(-(2**65), 2**65).map(str)))]
    return Case(args=tuple(args), field=".".join(n.lstrip("-") for n in names), what="flags")


def cases() -> st.SearchStrategy[Case]:
    return st.one_of(field_cases(), field_cases(), syntax_cases(), flag_cases())


# -- the judge ------------------------------------------------------------------------------------

DEFECTS = ("traceback", "internal", "impossible", "coerced", "hang", "memory")


@dataclass
class Outcome:
    kind: str  # answer, rejected, no answer, or one of DEFECTS
    message: str = ""
    seconds: float = 0.0
    names_field: bool = True
    detail: dict[str, Any] = field(default_factory=dict)


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout


def _names(message: str, case: Case) -> bool:
    """Does a one-line rejection name what the case broke?"""
    text = message.lower().replace("-", "_")
    if case.field in ("*", ""):
        return True  # a cut file can break any field; a BOM is no hazard at all
    words = [w for w in case.field.lower().replace("-", "_").split(".") if not w.isdigit()]
    words += [_ALIASES[w] for w in words if w in _ALIASES]
    return any(w in text for w in words) or "line " in text


def _check_answer(out: str) -> tuple[str, dict[str, Any]]:
    """``answer`` when stdout is strict JSON whose figures are finite and possible."""

    def refuse(const: str) -> float:
        raise ValueError(f"non-standard JSON constant {const}")

    try:
        data = json.loads(out, parse_constant=refuse)
    except ValueError as err:
        return "impossible", {"why": f"not JSON: {err}"[:200]}
    numbers = [v for v in _leaves(data) if isinstance(v, float | int) and not isinstance(v, bool)]
    if any(not math.isfinite(v) for v in numbers):
        return "impossible", {"why": "a non-finite number"}
    if not data["iteration_s"] > 0 or not 0 <= data["mfu"] <= data["hfu"] <= 1 + 1e-9:
        return "impossible", {"why": f"iteration {data['iteration_s']}, MFU {data['mfu']}, HFU {data['hfu']}"}
    if any(v < 0 for v in numbers if v is not None):
        negative = [v for v in numbers if v < 0]
        return "impossible", {"why": f"negative figures {negative[:3]}"}
    return "answer", {}


# figures that are signed by meaning: the memory a plan has to spare is negative when it does not fit
# keys whose figures are signed by definition: the memory margin (negative: does not fit), an
# interval's and a widening's log(measured / predicted) bounds
SIGNED = ("margin_bytes", "log_ratio")


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for k, v in value.items() if not str(k).endswith(SIGNED) for x in _leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [value]


def judge(case: Case, timeout_s: int = 20) -> Outcome:
    """Run ``paraplan predict CASE --format json`` as the ``paraplan`` script does, in this
    process (main thread: the time limit is an alarm signal), and sort what happened."""
    from paraplan.cli.app import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with tempfile.TemporaryDirectory() as tmp:
        args = ["predict", *case.args, "--format", "json"]
        if not case.args:
            path = Path(tmp) / f"job{case.suffix}"
            path.write_bytes(case.data)
            args.insert(1, str(path))
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(timeout_s)
        start = time.perf_counter()
        code: Any = 0
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                main(args)
        except SystemExit as exit_:
            code = exit_.code
        except _Timeout:
            return Outcome("hang", seconds=time.perf_counter() - start)
        except MemoryError:
            return Outcome("memory", seconds=time.perf_counter() - start)
        except Exception as exc:
            return Outcome("traceback", f"{type(exc).__name__}: {exc}"[:300], time.perf_counter() - start)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        seconds = time.perf_counter() - start
    err = stderr.getvalue().strip()
    if code == 0:
        kind, detail = _check_answer(stdout.getvalue())
        if kind == "answer" and case.coerces:
            return Outcome("coerced", seconds=seconds, detail={"why": f"{case.field} {case.what} was accepted"})
        return Outcome(kind, seconds=seconds, detail=detail)
    if code == 3:
        return Outcome("internal", err[:300], seconds)
    if code in (1, 2):
        if "Traceback" in err or len(err.splitlines()) != 1:
            return Outcome("traceback", f"exit {code}, not one line: {err[:300]}", seconds)
        kind = "rejected" if code == 2 else "no answer"
        return Outcome(kind, err[:300], seconds, names_field=_names(err, case))
    return Outcome("traceback", f"exit {code!r}: {err[:300]}", seconds)
