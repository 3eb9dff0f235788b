"""What a Hugging Face Llama decoder layer holds in its backward pass beyond its saved tensors
(the ATorch DS-3D runs of tests/golden/data/published_memory.json), measured on this CPU.

Run: python benchmarks/hf_layer_backward_memory.py   (torch only; about 10 s)

The layer is transformers 4.35's eager ``LlamaDecoderLayer`` as ATorch runs it: LlamaRMSNorm
in float32, q/k/v/o and gate/up/down as separate bias-free linears, the rotary embedding's
``q * cos + rotate_half(q) * sin``, flash attention (here a stand-in that saves what
flash-attn saves: q, k, v, the output and the log-sum-exp, and returns gradients of their
sizes), ``down(silu(gate(x)) * up(x))``, the residual adds. Its tensors are the ATorch run's
scaled down 8 times in tokens and in hidden size (micro-batch 8 x 512 tokens, hidden 512, ffn
1376; 128-wide heads), so tokens/hidden and ffn/hidden are the run's and every activation is
1/64 of it; the rotary tables, 128 wide at any hidden size, are not scaled (they are left
out below). The weights' gradients exist before (DeepSpeed's fp16 ``.grad``).

Live bytes are counted per storage by a dispatch mode (every tensor an operator returns, until
its storage is freed). Printed, in units of the activation ``a`` = [b, s, h] in 16 bits, and
in GiB at the run's size (a = 256 MiB): what the forward pass leaves (saved tensors and the
output) next to paraplan's saved bytes for the layer (``rmsnorm_fusion: false``,
``swiglu_fusion: false``), and the backward pass's peak above what it started from (the
incoming gradient excluded).

Measured 2026-11-27 (torch 2.x CPU): the forward pass leaves what paraplan counts to 0.01 a
(16.39 a at tp 2, 23.77 a at tp 1, the output included); the backward pass peaks 2.69 a (tp 2)
and 5.38 a (tp 1) above it: two ffn-wide gradients of ``silu(gate) * up``'s backward, 0.67
and 1.34 GiB at the run's size. With the incoming gradient and, under full recompute, the
recomputed output (a each), a recomputed layer's backward holds 4.69 a (1.17 GiB) at tp 2 and
7.38 a (1.84 GiB) at tp 1 beyond its saved tensors, which paraplan counts for no framework:
the ATorch runs' prediction is 1.06 GiB (tp 2) and 1.73 GiB (rank 0, tp 1) below their
measurement.
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

DT = torch.bfloat16  # 2 bytes as the run's fp16 (CPU kernels run bf16)
B, S, H, D, HEADS, FFN = 8, 512, 512, 128, 4, 1376
RUN_A_GIB = 8 * 4096 * 4096 * 2 / 2**30


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages that operators returned and that are still alive, and their peak."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._seen: dict[int, int] = {}

    def ignore(self, tensors) -> None:
        """Storages allocated before (weights, their gradients): their views are not new bytes."""
        for t in tensors:
            self._seen[t.untyped_storage().data_ptr()] = 0

    def _track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key, n = st.data_ptr(), st.nbytes()
        if n == 0 or key in self._seen:
            return
        self._seen[key] = n
        self.live += n
        self.peak = max(self.peak, self.live)

        def freed(k=key, n=n):
            if self._seen.pop(k, None) is not None:
                self.live -= n

        weakref.finalize(st, freed)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out


class Linear(torch.autograd.Function):
    """``x @ w.T`` saving x and w, as cuBLAS-backed F.linear does (CPU's bf16 linear keeps a
    transposed copy of the weight, which a GPU does not)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.t()

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        return dy @ w, (dy.reshape(-1, dy.shape[-1]).t() @ x.reshape(-1, x.shape[-1]))


class Flash(torch.autograd.Function):
    """Saves what flash-attn saves (q, k, v, out, the float32 log-sum-exp); its own backward
    works in tiles (no [s, s] tensor), so this one returns gradients of the inputs' sizes."""

    @staticmethod
    def forward(ctx, q, k, v):  # [b, s, heads, d]
        with torch.no_grad():
            lse = torch.zeros(q.shape[0], q.shape[2], q.shape[1])
            # flash-attn writes its output contiguous in [b, s, heads, d]
            out = ((q.float() * (1 / math.sqrt(q.shape[-1]))).to(q.dtype) + v).contiguous()
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)


class RMSNorm(nn.Module):  # transformers 4.35 LlamaRMSNorm
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(H, dtype=DT))

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + 1e-5)
        return self.weight * x.to(dtype)


class Layer(nn.Module):
    def __init__(self, tp: int):
        super().__init__()
        self.heads, ffn = HEADS // tp, FFN // tp
        w = lambda o, i: nn.Parameter(torch.randn(o, i, dtype=DT) * 0.02)  # noqa: E731
        self.n1, self.n2 = RMSNorm(), RMSNorm()
        self.q, self.k, self.v, self.o = (w(self.heads * D, H), w(self.heads * D, H), w(self.heads * D, H),
                                          w(H, self.heads * D))
        self.g, self.u, self.dn = w(ffn, H), w(ffn, H), w(H, ffn)

    def forward(self, x, cos, sin):
        def rot(t):
            return torch.cat((-t[..., D // 2:], t[..., : D // 2]), dim=-1)

        r, x = x, self.n1(x)
        q, k, v = (Linear.apply(x, w).view(B, S, self.heads, D).transpose(1, 2) for w in (self.q, self.k, self.v))
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        a = Flash.apply(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).reshape(B, S, self.heads * D)
        x = r + Linear.apply(a, self.o)
        r, x = x, self.n2(x)
        return r + Linear.apply(F.silu(Linear.apply(x, self.g)) * Linear.apply(x, self.u), self.dn)


def measure(tp: int) -> tuple[float, float]:
    """(what the forward pass leaves: saved tensors and the output; the backward pass's peak
    above what it started from), in bytes."""
    layer = Layer(tp)
    for p in layer.parameters():
        p.grad = torch.zeros_like(p)
    x = torch.randn(B, S, H, dtype=DT, requires_grad=True)
    dy = torch.randn(B, S, H, dtype=DT)
    cos = torch.randn(S, D, dtype=DT)[torch.arange(S).expand(B, S)].unsqueeze(1)
    sin = torch.randn(S, D, dtype=DT)[torch.arange(S).expand(B, S)].unsqueeze(1)
    mode = LiveBytes()
    mode.ignore([*layer.parameters(), *(p.grad for p in layer.parameters()), x, dy, cos, sin])
    with mode:
        before = mode.live
        y = layer(x, cos, sin)
        after = mode.live
        mode.peak = after
        y.backward(dy)
    return after - before, mode.peak - after


def paraplan_saved(tp: int) -> float:
    from paraplan.catalog import resolve_job
    from paraplan.inventory import count_job

    model = {"name": "llama-2-7b", "seq_length": S, "hidden_size": H, "ffn_hidden_size": FFN,
             "num_attention_heads": HEADS, "rmsnorm_fusion": False, "swiglu_fusion": False}
    job = resolve_job({"model": model, "cluster": {"name": "dgx-a100"}, "precision": "fp16",
                       "parallel": {"tp": tp, "sequence_parallel": False, "micro_batch_size": B,
                                    "global_batch_size": 8 * B}})
    return sum(op.saved_bytes for op in count_job(job).stages[0].layer_ops)


def main() -> None:
    a = B * S * H * 2
    print("| tp | forward leaves (a) | paraplan saved + output (a) | backward peak above its start (a) | "
          "at the run's size (GiB) |")
    print("|---:|---:|---:|---:|---:|")
    for tp in (2, 1):
        left, peak = measure(tp)
        try:
            hand = paraplan_saved(tp) / a + 1.0
        except Exception as err:  # paraplan not importable: the measurement alone
            hand = float("nan")
            print(f"(paraplan: {err})")
        print(f"| {tp} | {left / a:.3f} | {hand:.3f} | {peak / a:.3f} | {peak / a * RUN_A_GIB:.2f} |")


if __name__ == "__main__":
    main()
