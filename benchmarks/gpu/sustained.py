"""GEMM throughput in bursts and held at the board's power limit, bf16 and FP8, on training shapes.

    python benchmarks/gpu/sustained.py --device cuda --out DIR/profile/sustained_gemm.json [--quick]

The step of `benchmarks/gpu/check.sh` that measures, on the GPU it runs on, what the catalog's
`efficiency.sustained.gemm_fraction` and `precisions.fp8` transfer from other boards today (issue 27,
item 4): for each GEMM of GPT-3 175B at TP 4 and of Llama-3-70B at TP 8 (forward, and the weight
gradient's shape), plus 8192^3,

- **burst**: after 2 s idle, the median of 20 kernels after 5 warm-up ones (CUDA events): the regime
  XLA's tables and most microbenchmarks record;
- **sustained**: the same kernel back to back for `--hold` seconds, then the median of the last 20:
  the board has reached its power limit and the clock it holds there;
- on `torch.randn` operands (what training data looks like to the multipliers) and, for two shapes,
  on zeros (H. He 2024: zeros draw less power, so they hold a higher clock);

and records `nvidia-smi`'s power draw, power limit, SM clock and temperature at the end of each
hold. FP8 is e4m3 with per-tensor scales and a bf16 output through `torch._scaled_mm` (the
tensor-wise recipe). Operator-level measurements: they may calibrate curves; no end-to-end run
is used. The CPU dry run (`--device cpu --quick`) runs the same code on tiny shapes with a short
hold and no nvidia-smi.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from gpucheck import fp8_gemm, fp8_unavailable, time_once  # beside this file: the check's other half

# (name, m tokens, n out, k in): one micro-batch of 2,048 tokens (GPT-3) / 8,192 (Llama-3-70B).
# Forward GEMM [m x k] @ [k x n]; "wgrad" is the weight gradient [n x m] @ [m x k] of the same layer.
GPT3_TP4 = [("gpt3-tp4 qkv", 2048, 3 * 12288 // 4, 12288), ("gpt3-tp4 proj", 2048, 12288, 12288 // 4),
            ("gpt3-tp4 fc1", 2048, 4 * 12288 // 4, 12288), ("gpt3-tp4 fc2", 2048, 12288, 4 * 12288 // 4),
            ("gpt3-tp4 fc1 wgrad", 4 * 12288 // 4, 12288, 2048)]
LLAMA70_TP8 = [("llama70-tp8 qkv", 8192, (8192 + 2 * 1024) // 8, 8192),
               ("llama70-tp8 gate_up", 8192, 2 * 28672 // 8, 8192),
               ("llama70-tp8 down", 8192, 8192, 28672 // 8)]
SQUARE = [("8192^3", 8192, 8192, 8192)]
ZEROS_TOO = {"8192^3", "gpt3-tp4 fc1"}
SMI_FIELDS = ("power.draw", "power.limit", "clocks.sm", "clocks.max.sm", "temperature.gpu")


def smi(device: str) -> dict | None:
    """nvidia-smi's readings of the GPU now (None on the CPU or where nvidia-smi is missing)."""
    if device == "cpu":
        return None
    index = device.split(":")[1] if ":" in device else "0"
    try:
        out = subprocess.run(["nvidia-smi", f"--id={index}", f"--query-gpu={','.join(SMI_FIELDS)}",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    values = [v.strip() for v in out.stdout.strip().split(",")]
    if out.returncode != 0 or len(values) != len(SMI_FIELDS):
        return None

    def number(v: str) -> float | None:
        try:
            return float(v)
        except ValueError:
            return None
    return {f: number(v) for f, v in zip(SMI_FIELDS, values, strict=True)}


def burst_and_sustained(fn, device: str, *, idle_s: float, hold_s: float) -> dict:
    """Median seconds of ``fn`` in a burst after ``idle_s`` idle, and after holding it ``hold_s``."""
    import torch

    if device != "cpu":
        torch.cuda.synchronize()
    time.sleep(idle_s)
    for _ in range(5):
        fn()
    burst = statistics.median(time_once(fn, device) for _ in range(20))
    t_end = time.perf_counter() + hold_s
    while time.perf_counter() < t_end:  # enqueue in batches so the GPU never waits on Python
        for _ in range(10):
            fn()
        if device != "cpu":
            torch.cuda.synchronize()
    held = statistics.median(time_once(fn, device) for _ in range(20))
    return {"burst_s": burst, "sustained_s": held, "smi_after_hold": smi(device)}


# (name, batch, query heads, key/value heads, sequence, head dim): causal self-attention of one
# micro-batch on one TP rank, timed forward + backward through F.scaled_dot_product_attention.
ATTENTION = [("gpt3-tp4 attn", 1, 96 // 4, 96 // 4, 2048, 128), ("llama70-tp8 attn", 1, 64 // 8, 8 // 8, 8192, 128),
             ("llama8 attn", 1, 32, 8, 8192, 128)]


def attention_probe(device: str, quick: bool, hold_s: float) -> list[dict]:
    """Causal attention forward + backward (torch's SDPA: FlashAttention-2 on an H100), burst and
    held; FLOPs as FlashAttention counts them (forward 4 b h s^2 d, halved when causal; backward
    2.5x the forward)."""
    import torch
    import torch.nn.functional as F

    scale = 16 if quick or device == "cpu" else 1
    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    rows = []
    for name, b, hq, hkv, s, d in ATTENTION:
        s = s // scale
        q = torch.randn(b, hq, s, d, device=device, dtype=dtype, requires_grad=True)
        k = torch.randn(b, hkv, s, d, device=device, dtype=dtype, requires_grad=True)
        v = torch.randn(b, hkv, s, d, device=device, dtype=dtype, requires_grad=True)
        g = torch.randn(b, hq, s, d, device=device, dtype=dtype)

        def step(q=q, k=k, v=v, g=g, gqa=hq != hkv):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            out.backward(g)
        forward = 4 * b * hq * s * s * d / 2
        row = {"gemm": name, "b": b, "heads": hq, "kv_heads": hkv, "seq": s, "head_dim": d, "flops": 3.5 * forward,
               "data": "randn", "precision": "bf16" if device != "cpu" else "fp32", "kind": "attention fwd+bwd"}
        row.update(burst_and_sustained(step, device, idle_s=0.2 if quick else 2.0, hold_s=hold_s))
        row["burst_tflops"] = round(row["flops"] / row["burst_s"] / 1e12, 2)
        row["sustained_tflops"] = round(row["flops"] / row["sustained_s"] / 1e12, 2)
        row["sustained_over_burst"] = round(row["burst_s"] / row["sustained_s"], 4)
        yield_row(row)
        rows.append(row)
    return rows


def probe(device: str, quick: bool, hold_s: float, shapes: str | None = None) -> dict:
    import torch

    scale = 16 if quick or device == "cpu" else 1
    fp8_reason = fp8_unavailable(device)
    record: dict = {
        "what": "GEMM seconds (median of 20, CUDA events) in a burst after 2 s idle and after holding the "
                "kernel back to back; bf16 torch.matmul and fp8 e4m3 torch._scaled_mm (per-tensor scales, "
                "bf16 out); operands torch.randn unless data is zeros",
        "device": device, "torch": torch.__version__, "hold_s": hold_s, "fp8": fp8_reason or "runs",
        "smi_at_start": smi(device), "gemms": []}
    if device != "cpu":
        record["device_name"] = torch.cuda.get_device_name(torch.device(device))
    idle_s = 0.2 if quick else 2.0
    for name, m, n, k in GPT3_TP4 + LLAMA70_TP8 + SQUARE:
        if shapes is not None and not any(part in name for part in shapes.split(",")):
            continue
        m, n, k = m // scale, n // scale, k // scale
        for data in ("randn", "zeros") if name in ZEROS_TOO else ("randn",):
            make = torch.randn if data == "randn" else torch.zeros
            x = make(m, k, device=device, dtype=torch.bfloat16)
            w = make(n, k, device=device, dtype=torch.bfloat16)
            flops = 2 * m * n * k
            for precision in ("bf16", "fp8"):
                row = {"gemm": name, "m": m, "n": n, "k": k, "flops": flops, "data": data, "precision": precision}
                if precision == "bf16":
                    row.update(burst_and_sustained(lambda x=x, w=w: x @ w.t(), device, idle_s=idle_s, hold_s=hold_s))
                elif fp8_reason is None:
                    row.update(burst_and_sustained(fp8_gemm(x, w), device, idle_s=idle_s, hold_s=hold_s))
                else:
                    continue
                row["burst_tflops"] = round(flops / row["burst_s"] / 1e12, 2)
                row["sustained_tflops"] = round(flops / row["sustained_s"] / 1e12, 2)
                row["sustained_over_burst"] = round(row["burst_s"] / row["sustained_s"], 4)
                record["gemms"].append(row)
                yield_row(row)
    record["smi_at_end"] = smi(device)
    return record


def yield_row(row: dict) -> None:
    smi_now = row.get("smi_after_hold") or {}
    print(f"{row['gemm']:>20} {row['precision']:>4} {row['data']:>5}: burst {row['burst_tflops']:8.1f} "
          f"sustained {row['sustained_tflops']:8.1f} TFLOP/s ({row['sustained_over_burst']:.3f}); "
          f"{smi_now.get('power.draw')} W of {smi_now.get('power.limit')}, {smi_now.get('clocks.sm')} MHz",
          flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="sustained.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--hold", type=float, default=None, help="seconds each kernel is held (default 5; quick 0.2)")
    parser.add_argument("--shapes", help="only the GEMMs whose names hold one of these comma-separated parts")
    parser.add_argument("--attention", action="store_true", help="also time causal attention forward + backward")
    parser.add_argument("--quick", action="store_true", help="the dry run's tiny shapes and a short hold")
    args = parser.parse_args(argv)
    hold = args.hold if args.hold is not None else (0.2 if args.quick else 5.0)
    record = probe(args.device, args.quick, hold, args.shapes)
    if args.attention:
        record["attention"] = attention_probe(args.device, args.quick, hold)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
