"""The Python half of `benchmarks/gpu/check.sh` (see its --help): the steps bash cannot say simply.

    python benchmarks/gpu/gpucheck.py env    --device cuda --out DIR/env.json
    python benchmarks/gpu/gpucheck.py jobs   --device cuda --out DIR [--quick]
    python benchmarks/gpu/gpucheck.py fp8    --device cuda --out DIR/profile/fp8_gemm.json [--quick]
    python benchmarks/gpu/gpucheck.py train  --device cuda --job DIR/small-llama.yaml --out DIR/trace [--quick]
    python benchmarks/gpu/gpucheck.py manifest --out DIR
    python benchmarks/gpu/gpucheck.py verify --out DIR

`train` trains a small Llama (RMSNorm, rotary embeddings, grouped-query attention through
F.scaled_dot_product_attention, SwiGLU; untied embeddings) with AdamW on one device and records
it with torch.profiler (CPU and CUDA activities, record_shapes=True) as `rank0.json.gz`, and
`timers.json` in `paraplan trace record`'s layout. The model is written here rather than taken
from transformers so that the CPU dry run CI executes (no transformers there) runs the very
code the GPU run does. Every step reads and writes plain files; nothing here is imported by
paraplan.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# The model the trace trains: small enough for seconds per run, Llama-shaped (GQA 4:1, SwiGLU).
GPU_LLAMA = {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "num_query_groups": 4,
             "ffn_hidden_size": 2816, "vocab_size": 32000, "seq_length": 1024, "micro_batch_size": 8}
CPU_LLAMA = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 2,
             "ffn_hidden_size": 176, "vocab_size": 512, "seq_length": 64, "micro_batch_size": 4}
# The GEMMs of one Llama-3-8B layer (catalog llama-3-8b: hidden 4096, 32 heads, 8 KV groups,
# ffn 14336) at one micro-batch of its 8192-token sequence: (name, n out, k in).
LLAMA3_8B_GEMMS = [("qkv", 4096 + 2 * 1024, 4096), ("attn_out", 4096, 4096),
                   ("gate_up", 2 * 14336, 4096), ("down", 4096, 14336)]
LLAMA3_8B_TOKENS = 8192


def fail(message: str) -> None:
    print(f"gpucheck: {message}", file=sys.stderr)
    raise SystemExit(2)


def write_json(path: Path, record: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)


# -- env ------------------------------------------------------------------------------------------

def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def device_name(device: str) -> str:
    """torch's name of the device (what `paraplan profile` files rows under); cpu-core on the CPU."""
    if device == "cpu":
        return "cpu-core"
    import torch

    if not torch.cuda.is_available():
        fail(f"--device {device}: torch {torch.__version__} sees no CUDA device (use --device cpu for a dry run)")
    return torch.cuda.get_device_name(torch.device(device))


def catalog_gpu(name: str) -> str | None:
    """The catalog's name for a device name (its aliases hold torch's names), or None."""
    from paraplan.catalog import load_gpu

    try:
        return load_gpu(name).name
    except Exception:  # any refusal means "not in the catalog"
        return None


def env_record(device: str) -> dict:
    import torch

    record: dict = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(), "python": platform.python_version(), "platform": platform.platform(),
        "paraplan": _version("paraplan"), "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "packages": {n: _version(n) for n in ("torch", "numpy", "pandas", "pyarrow", "scipy", "scikit-learn",
                                              "pydantic", "typer", "rich", "PyYAML", "ijson", "transformers",
                                              "pytest", "hypothesis")},
        "torch": torch.__version__, "cuda": torch.version.cuda, "device": device,
        "device_name": device_name(device),
    }
    record["catalog_gpu"] = catalog_gpu(record["device_name"]) if device != "cpu" else "cpu-core"
    if device != "cpu":
        props = torch.cuda.get_device_properties(torch.device(device))
        record.update(gpu_memory_bytes=props.total_memory, multiprocessors=props.multi_processor_count,
                      capability=f"{props.major}.{props.minor}", cudnn=torch.backends.cudnn.version())
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,power.limit",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            record["nvidia_smi"] = smi.stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            record["nvidia_smi"] = f"not run: {exc}"
    return record


# -- jobs -----------------------------------------------------------------------------------------

def llama_config(quick: bool, device: str) -> dict:
    return dict(CPU_LLAMA if device == "cpu" or quick else GPU_LLAMA)


def _cluster(device: str) -> dict | str:
    if device == "cpu":  # one process on one core: the tiny-cpu cluster (two cores) cut to one
        import yaml

        cluster = yaml.safe_load((REPO / "examples/tiny-cpu/cluster.yaml").read_text())
        return {**cluster, "name": "one-cpu-core", "gpus_per_node": 1}
    name = device_name(device)
    gpu = catalog_gpu(name)
    if gpu is None:
        fail(f"{name!r} is not in paraplan's GPU catalog (src/paraplan/catalog/gpus): add it, or run with "
             "--device cpu")
    return {"gpu": gpu, "gpus_per_node": 1, "num_nodes": 1}


def small_llama_job(cfg: dict, device: str) -> dict:
    precision = "fp32" if device == "cpu" else "bf16"
    model = {"name": "small-llama", "num_layers": cfg["num_layers"], "hidden_size": cfg["hidden_size"],
             "num_attention_heads": cfg["num_attention_heads"], "num_query_groups": cfg["num_query_groups"],
             "ffn_hidden_size": cfg["ffn_hidden_size"], "seq_length": cfg["seq_length"],
             "vocab_size": cfg["vocab_size"], "padded_vocab_size": cfg["vocab_size"], "activation": "swiglu",
             "normalization": "rmsnorm", "position_embedding": "rotary", "rotary_percent": 1.0,
             "attention": "flash", "untie_embeddings_and_output_weights": True, "add_bias_linear": False}
    mb = cfg["micro_batch_size"]
    return {"name": f"small-llama-1x{device}", "model": model, "cluster": _cluster(device),
            "parallel": {"tp": 1, "pp": 1, "dp": 1, "micro_batch_size": mb, "global_batch_size": mb,
                         "framework": "megatron"},
            "precision": precision}


def layer_job(device: str, small: dict) -> dict:
    """What `paraplan profile adaptive --for` samples: a Llama-3-8B layer's operators on one GPU
    (and its neighbour plans' shapes); on the CPU dry run, the small Llama's."""
    if device == "cpu":
        return {**small, "name": "small-llama-operators"}
    return {"name": "llama-3-8b-one-gpu-layer", "model": "llama-3-8b", "cluster": _cluster(device),
            "parallel": {"tp": 1, "pp": 1, "dp": 1, "micro_batch_size": 1, "global_batch_size": 1,
                         "framework": "megatron"},
            "precision": "bf16"}


def write_jobs(out: Path, device: str, quick: bool) -> None:
    import yaml

    from paraplan.catalog.jobs import load_job
    from paraplan.specs import ConfigError

    small = small_llama_job(llama_config(quick, device), device)
    for name, job in (("small-llama.yaml", small), ("profile-job.yaml", layer_job(device, small))):
        path = out / name
        path.write_text("# written by benchmarks/gpu/gpucheck.py jobs\n" + yaml.safe_dump(job, sort_keys=False))
        try:
            load_job(path)  # refuses a job paraplan cannot read, here rather than three steps later
        except ConfigError as exc:
            fail(f"{path}: {exc}")
        print(f"wrote {path}")


# -- fp8 ------------------------------------------------------------------------------------------

def time_once(fn, device: str) -> float:
    """Seconds of one call of ``fn``: CUDA events on a GPU, the wall clock on the CPU."""
    import torch

    if device == "cpu":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _median_seconds(fn, device: str, repeats: int) -> float:
    for _ in range(3):
        fn()
    return statistics.median(time_once(fn, device) for _ in range(repeats))


def fp8_unavailable(device: str) -> str | None:
    """Why FP8 GEMMs (float8_e4m3fn through torch._scaled_mm) do not run on ``device``, or None
    when they do: the smallest call, tried."""
    import torch

    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is None or not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no float8_e4m3fn or _scaled_mm"
    try:
        a = torch.ones(16, 16, device=device).to(fp8)
        one = torch.ones((), device=device)
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except Exception as exc:  # any failure: FP8 does not run here
        return f"torch._scaled_mm does not run on {device}: {(str(exc).splitlines() or [type(exc).__name__])[0][:200]}"
    return None


def fp8_gemm(x, w):
    """A call of x @ w.t() in FP8: e4m3 with per-tensor scales (the tensor-wise recipe) and a
    bf16 output, through torch._scaled_mm."""
    import torch

    fp8 = torch.float8_e4m3fn
    sx = (x.abs().max().float() / 448.0).clamp(min=1e-12)
    sw = (w.abs().max().float() / 448.0).clamp(min=1e-12)
    x8, w8 = (x.float() / sx).to(fp8), (w.float() / sw).to(fp8)
    return lambda: torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)


def fp8_probe(device: str, quick: bool) -> dict:
    """bf16 against FP8 (e4m3, per-tensor scales, torch._scaled_mm) on the GEMMs of a Llama-3-8B
    layer: the operator sampler has no FP8 kernels, so this is where FP8 is timed."""
    import torch

    record: dict = {"what": "median seconds of one GEMM [tokens x k] @ [k x n], bf16 (torch.matmul) and fp8 "
                            "e4m3 with per-tensor scales and bf16 output (torch._scaled_mm); CUDA events",
                    "device": device, "device_name": device_name(device), "torch": torch.__version__, "gemms": []}
    scale = 16 if quick or device == "cpu" else 1  # the dry run's shapes: 1/16 of each side
    tokens = LLAMA3_8B_TOKENS // scale // (4 if device == "cpu" else 1)
    record["tokens"] = tokens
    reason = fp8_unavailable(device)
    record["fp8"] = reason or "runs"
    repeats = 5 if quick else 20
    for name, n, k in LLAMA3_8B_GEMMS:
        n, k = n // scale, k // scale
        x = torch.randn(tokens, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
        row = {"gemm": name, "m": tokens, "n": n, "k": k, "flops": 2 * tokens * n * k}
        row["bf16_s"] = _median_seconds(lambda x=x, w=w: x @ w.t(), device, repeats)
        if reason is None:
            row["fp8_s"] = _median_seconds(fp8_gemm(x, w), device, repeats)
            row["fp8_speedup"] = round(row["bf16_s"] / row["fp8_s"], 3)
        row.update({f"{p}_tflops": float(f"{row['flops'] / row[f'{p}_s'] / 1e12:.3g}") for p in ("bf16", "fp8")
                    if f"{p}_s" in row})
        record["gemms"].append(row)
    return record


# -- train ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LlamaConfig:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    vocab_size: int
    seq_length: int
    micro_batch_size: int
    rope_theta: float = 500000.0
    eps: float = 1e-5


def build_llama(cfg: LlamaConfig):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return F.rms_norm(x, (x.shape[-1],), self.weight, cfg.eps)

    def rotate(x, cos, sin):  # in x's dtype: under autocast, bf16 (fp32 tables would promote q and k)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            h, heads, groups = cfg.hidden_size, cfg.num_attention_heads, cfg.num_query_groups
            self.heads, self.groups, self.dim = heads, groups, h // heads
            self.attn_norm = RMSNorm(h)
            self.qkv = nn.Linear(h, (heads + 2 * groups) * self.dim, bias=False)
            self.o = nn.Linear(h, h, bias=False)
            self.mlp_norm = RMSNorm(h)
            self.gate_up = nn.Linear(h, 2 * cfg.ffn_hidden_size, bias=False)
            self.down = nn.Linear(cfg.ffn_hidden_size, h, bias=False)

        def forward(self, x, cos, sin):
            b, s, h = x.shape
            q, k, v = self.qkv(self.attn_norm(x)).split(
                [self.heads * self.dim, self.groups * self.dim, self.groups * self.dim], dim=-1)
            q = rotate(q.view(b, s, self.heads, self.dim).transpose(1, 2), cos, sin)
            k = rotate(k.view(b, s, self.groups, self.dim).transpose(1, 2), cos, sin)
            v = v.view(b, s, self.groups, self.dim).transpose(1, 2)
            repeat = self.heads // self.groups  # as transformers' repeat_kv: the flash kernel then runs
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, s, h))
            gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
            return x + self.down(F.silu(gate) * up)

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.num_layers))
            self.norm = RMSNorm(cfg.hidden_size)
            self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            dim = cfg.hidden_size // cfg.num_attention_heads
            inv = 1.0 / cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
            angles = torch.outer(torch.arange(cfg.seq_length, dtype=torch.float32), inv)
            angles = torch.cat((angles, angles), dim=-1)
            self.register_buffer("cos", angles.cos(), persistent=False)
            self.register_buffer("sin", angles.sin(), persistent=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x, self.cos, self.sin)
            return self.head(self.norm(x))

    return Llama()


def train(device: str, cfg: LlamaConfig, out: Path, *, warmup: int, active: int) -> dict:
    """Train on random tokens; profile ``active`` iterations after a wait and ``warmup`` (the
    profiler's schedule), after as many unprofiled ones (cuBLAS and allocator warm-up)."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    dev = torch.device(device)
    model = build_llama(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device != "cpu", foreach=None if device != "cpu" else True)
    gen = torch.Generator(device=dev).manual_seed(1234)
    autocast = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=device != "cpu")
    if device == "cpu":
        torch.set_num_threads(1)  # the cpu-core "GPU" of examples/tiny-cpu/cluster.yaml

    def step() -> float:
        tokens = torch.randint(0, cfg.vocab_size, (cfg.micro_batch_size, cfg.seq_length + 1), device=dev,
                               generator=gen)
        with autocast:
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()  # waits for the GPU: the step's wall clock is its GPU time

    for _ in range(warmup):
        step()
    trace = out / "rank0.json.gz"
    timers: list[dict] = []
    wait, warm = 1, 2
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device != "cpu" else [])
    with profile(activities=activities, record_shapes=True,
                 schedule=schedule(wait=wait, warmup=warm, active=active, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(trace))) as prof:
        for n in range(wait + warm + active):
            t0 = time.perf_counter()
            loss = step()
            seconds = time.perf_counter() - t0
            if n >= wait + warm:
                timers.append({"step": n, "seconds": seconds, "loss": loss})
            prof.step()
    record = {"mode": "single", "nproc": 1, "wait": wait, "warmup": warm, "active": active, "shapes": True,
              "profile": True, "model": asdict(cfg), "torch": torch.__version__, "device": device,
              "precision": "fp32" if device == "cpu" else "bf16 autocast, fp32 weights and AdamW (fused)",
              "what": "wall-clock seconds of each profiled iteration (time.perf_counter around the step, "
                      "which ends with loss.item())",
              "ranks": {"0": timers}}
    write_json(out / "timers.json", record)
    if not all(math.isfinite(t["loss"]) for t in timers):
        fail(f"the loss is not finite: {[t['loss'] for t in timers]}")
    return record


# -- manifest and verify --------------------------------------------------------------------------

def manifest(out: Path) -> dict:
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines() if line.strip()]
    env = json.loads((out / "env.json").read_text()) if (out / "env.json").exists() else {}
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "manifest.json")
    return {
        "what": "benchmarks/gpu/check.sh: GPU-marked tests, operator profile, a one-GPU training trace, "
                "its summary, calibration and validation",
        "env": env, "results": results(out), "steps": steps,
        "total_s": round(sum(s["seconds"] for s in steps), 1),
        "failed": [s["step"] for s in steps if s["rc"] != 0],
        "files": {str(p.relative_to(out)): p.stat().st_size for p in files},
    }


def results(out: Path) -> dict:
    """The headline numbers of each output that exists (for the README and a quick look)."""
    def read(name: str) -> dict | None:
        try:
            return json.loads((out / name).read_text())
        except (OSError, ValueError):
            return None

    found: dict = {}
    if (a := read("profile/adaptive.json")) is not None:
        found["profile"] = {**a["summary"], "regressors_reached": sum(r["reached"] for r in a["regressors"]),
                            "regressors": len(a["regressors"])}
    if (f := read("profile/fp8_gemm.json")) is not None:
        found["fp8"] = {"fp8": f["fp8"], "tokens": f["tokens"],
                        "gemms": {g["gemm"]: {k: g.get(k) for k in ("bf16_tflops", "fp8_tflops", "fp8_speedup")}
                                  for g in f["gemms"]}}
    if (g := read("profile/sustained_gemm.json")) is not None:
        found["sustained"] = {"fp8": g["fp8"], "hold_s": g["hold_s"],
                              "gemms": [{k: r.get(k) for k in ("gemm", "precision", "data", "burst_tflops",
                                                                "sustained_tflops", "sustained_over_burst")}
                                        for r in g["gemms"]]}
    if (t := read("trace/timers.json")) is not None:
        seconds = [r["seconds"] for r in t["ranks"]["0"]]
        found["timers_median_s"] = statistics.median(seconds) if seconds else None
    if (m := read("trace-summary.json")) is not None:
        found["trace"] = {"iterations": m["iterations"], "noise_pct": m.get("noise_pct"),
                          "device": m.get("device")}
    for name in ("validate", "validate-calibrated"):
        if (v := read(f"{name}.json")) is not None:
            found[name] = {k: v.get(k) for k in ("gpu", "measured_iteration_s", "predicted_iteration_s", "error")}
    return found


def verify(out: Path) -> list[str]:
    """What a finished check must hold; the problems found (none: it is sane)."""
    problems = []
    need = ["manifest.json", "env.json", "check.log", "small-llama.yaml", "profile-job.yaml", "tests.log",
            "profile/adaptive.json", "profile/fp8_gemm.json", "profile/sustained_gemm.json", "trace/rank0.json.gz", "trace/timers.json",
            "trace-summary.json", "calibrated-cluster.yaml", "validate.json", "validate-calibrated.json"]
    problems += [f"missing {n}" for n in need if not (out / n).is_file()]
    if problems:
        return problems
    record = json.loads((out / "manifest.json").read_text())
    if record["failed"]:
        problems.append(f"steps failed: {', '.join(record['failed'])}")
    summary = json.loads((out / "trace-summary.json").read_text())
    if not summary.get("iterations"):
        problems.append("trace-summary.json: no iterations")
    for name in ("validate.json", "validate-calibrated.json"):
        v = json.loads((out / name).read_text())
        if not v:
            problems.append(f"{name}: empty")
    adaptive = json.loads((out / "profile/adaptive.json").read_text())
    if adaptive["summary"]["rows"] <= 0:
        problems.append("profile/adaptive.json: no samples written")
    return problems


# -- main -----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpucheck.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("env", "jobs", "fp8", "train", "manifest", "verify"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--job", type=Path, help="train: the job file `jobs` wrote (its model is trained)")
    parser.add_argument("--quick", action="store_true", help="the dry run's tiny shapes and few iterations")
    args = parser.parse_args(argv)
    if args.what == "env":
        write_json(args.out, env_record(args.device))
    elif args.what == "jobs":
        write_jobs(args.out, args.device, args.quick)
    elif args.what == "fp8":
        record = fp8_probe(args.device, args.quick)
        write_json(args.out, record)
        for row in record["gemms"]:
            print(f"{row['gemm']:>9} {row['m']}x{row['n']}x{row['k']}: bf16 {row['bf16_tflops']} TFLOP/s"
                  + (f", fp8 {row['fp8_tflops']} TFLOP/s ({row['fp8_speedup']}x)" if "fp8_s" in row else ""))
        print(f"fp8: {record['fp8']}")
    elif args.what == "train":
        if args.job is None:
            fail("train needs --job (the job file `jobs` wrote)")
        import yaml

        model = yaml.safe_load(args.job.read_text())["model"]
        fields = {k: model[k] for k in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
                                        "ffn_hidden_size", "vocab_size", "seq_length")}
        mb = yaml.safe_load(args.job.read_text())["parallel"]["micro_batch_size"]
        args.out.mkdir(parents=True, exist_ok=True)
        record = train(args.device, LlamaConfig(**fields, micro_batch_size=mb), args.out,
                       warmup=2 if args.quick else 5, active=3 if args.quick else 8)
        seconds = [t["seconds"] for t in record["ranks"]["0"]]
        print(f"trained {len(seconds)} profiled iterations: median {1e3 * statistics.median(seconds):.2f} ms "
              f"(timers.json); trace {args.out / 'rank0.json.gz'}")
    elif args.what == "manifest":
        write_json(args.out / "manifest.json", manifest(args.out))
    else:
        problems = verify(args.out)
        for p in problems:
            print(f"gpucheck verify: {p}", file=sys.stderr)
        raise SystemExit(1 if problems else 0)


if __name__ == "__main__":
    main()
