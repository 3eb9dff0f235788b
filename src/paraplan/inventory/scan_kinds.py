"""Operator kinds of state-space and linear-attention layers, recognised in a traced layer by the
module that issues them, their work counted by the formulas of the kernels training runs.

Hugging Face runs these layers on its torch-native fallback when the CUDA packages
(``mamba_ssm``, ``causal_conv1d``, ``flash-linear-attention``) are missing, as on the meta
device: hundreds of aten operators whose bytes are an eager reference implementation's. A
training run uses the fused kernels; so the module's operators are replaced by the kernels'
own work, from their shapes (read off the traced operators):

- causal conv1d (``causal_conv1d_fn``, the depthwise convolution of width K over C channels):
  forward 2 b s C K FLOPs, reading the input and writing the output (2 b s C e bytes plus the
  weights); backward the input and weight gradients, 2x the forward FLOPs, reading the input
  and the output gradient and writing the input gradient (3 b s C e bytes).
- Mamba-2's SSD chunked scan (Dao & Gu 2024, "Transformers are SSMs", arXiv:2405.21060,
  section 6, the four steps of the SSD algorithm; ``mamba_chunk_scan_combined``), for H heads
  of dimension P, state N, G groups, chunk Q: the intra-chunk products C B^T (2 s Q N per
  group) and (L o C B^T) X (2 s Q P per head), the chunk states B^T X (2 s N P per head) and the
  output from the states C h (2 s N P per head): 2 b s (Q N G + Q P H + 2 N P H) forward FLOPs on
  the tensor cores; backward 2x (each product's two gradients). Bytes: x, B, C, dt read and y
  written (b s (2 H P + 2 G N + H) e) and the float32 chunk states written by the state kernel,
  read and written by the state passing and read by the output kernel (4 x 4 b (s/Q) H N P).
- Mamba-1's selective scan (Gu & Dao 2023, arXiv:2312.00752, section 3.3; the CUDA kernel
  ``selective_scan_fn``) over D channels of state N: 9 b s D N forward FLOPs (the count
  ``flops_selective_scan_ref`` of the mamba_ssm / VMamba repositories uses: discretise,
  update the state, read it out), a recurrence on the CUDA cores; backward 2x. Bytes: u, delta
  and z read and y written (4 b s D e), B and C read (2 b s N e).
- Gated DeltaNet's chunked kernel (Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks",
  arXiv:2412.06464, section 3.3; ``chunk_gated_delta_rule`` of flash-linear-attention), per value
  head of key dim dk and value dim dv, chunk Q: K K^T within a chunk (2 s Q dk), the WY
  representation W = A (beta K) and U = A (beta V) (2 s Q dk + 2 s Q dv), the triangular solve
  (s Q^2 / 3 multiply-adds: 2 s Q^2 / 3), the intra-chunk Q K^T (2 s Q dk) and its product with
  the values (2 s Q dv), and the state work W S, Q S and S += K^T U (3 x 2 s dk dv):
  2 b s H (3 Q dk + 2 Q dv + Q^2/3 + 3 dk dv) forward FLOPs, backward 2x. Bytes: q and k read once
  per key head, v, beta, g read and o written, the WY terms w and u written and read back, the
  float32 chunk states written and read (2 x 4 b (s/Q) H dk dv).

Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from paraplan.inventory.ops import Op, OpKind

SSD = "Dao & Gu 2024 (arXiv:2405.21060) section 6, SSD chunked scan"
SELECTIVE = "Gu & Dao 2023 (arXiv:2312.00752) section 3.3, selective scan: 9 b s D N (mamba_ssm's count)"
CONV = "causal_conv1d_fn: 2 b s C K FLOPs, input read and output written once"
DELTANET = "Yang et al. 2025 (arXiv:2412.06464) section 3.3, chunked gated delta rule (flash-linear-attention)"


@dataclass(frozen=True, slots=True)
class Work:
    """One kernel's forward and backward FLOPs and bytes, and what it keeps for backward."""

    flops: float
    bytes: float
    bwd_flops: float
    bwd_bytes: float
    saved: float


def causal_conv1d_work(b: int, s: int, channels: int, width: int, e: int) -> Work:
    """The depthwise causal convolution of ``width`` over ``channels``: see the module's note."""
    act = float(b * s * channels * e)
    weights = float(channels * width * e)
    flops = 2.0 * b * s * channels * width
    return Work(flops, 2.0 * act + weights, 2.0 * flops, 3.0 * act + 2.0 * weights, act)


def ssd_scan_work(b: int, s: int, heads: int, head_dim: int, state: int, groups: int, chunk: int, e: int) -> Work:
    """Mamba-2's SSD chunked scan (Dao & Gu 2024, section 6): see the module's note."""
    q, n, p, h, g = chunk, state, head_dim, heads, groups
    flops = 2.0 * b * s * (q * n * g + q * p * h + 2 * n * p * h)
    io = float(b * s * (2 * h * p + 2 * g * n + h) * e)
    states = 4.0 * 4.0 * b * (-(-s // q)) * h * n * p
    # backward: the inputs, the output and its gradient read, the input gradients written
    bwd_io = float(b * s * (3 * h * p + 4 * g * n + 2 * h) * e)
    return Work(flops, io + states, 2.0 * flops, bwd_io + states, io)


def selective_scan_work(b: int, s: int, channels: int, state: int, e: int) -> Work:
    """Mamba-1's selective scan (Gu & Dao 2023, section 3.3): see the module's note."""
    flops = 9.0 * b * s * channels * state
    io = float(b * s * (4 * channels + 2 * state) * e)
    return Work(flops, io, 2.0 * flops, 2.0 * io, io)


def gated_delta_work(b: int, s: int, heads: int, key_heads: int, dk: int, dv: int, chunk: int, e: int) -> Work:
    """Gated DeltaNet's chunked kernel (Yang et al. 2025, section 3.3): see the module's note."""
    q, h = chunk, heads
    flops = 2.0 * b * s * h * (3 * q * dk + 2 * q * dv + q * q / 3.0 + 3 * dk * dv)
    qkv = b * s * (2 * key_heads * dk + h * dv + 2 * h) * e  # q, k (per key head), v, beta, g
    out = b * s * h * dv * e
    wy = 2.0 * b * s * h * (dk + dv) * e  # w and u written, then read back
    states = 2.0 * 4.0 * b * (-(-s // q)) * h * dk * dv
    fwd = float(qkv + out) + wy + states
    return Work(flops, fwd, 2.0 * flops, 2.0 * fwd, float(qkv + out))


# ---------------------------------------------------------------- recognising them in a trace


def _fwd(ops: Sequence, aten: str) -> list:
    return [o for o in ops if o.phase == "fwd" and o.aten == aten]


def _conv(ops: Sequence) -> tuple[int, int, int, int] | None:
    """(b, s, channels, width) of the module's depthwise convolution: input (b, C, s), weight
    (C, 1, K)."""
    for o in _fwd(ops, "convolution"):
        if len(o.shapes) >= 2 and len(o.shapes[0]) == 3 and len(o.shapes[1]) == 3 and o.shapes[1][1] == 1:
            b, c, s = o.shapes[0]
            return int(b), int(s), int(c), int(o.shapes[1][2])
    return None


def _decay_shape(ops: Sequence) -> tuple[int, ...] | None:
    """The shape of the log-decay parameter ``A_log``, the first ``exp`` of the module: (H,) for
    Mamba-2 and gated DeltaNet, (D, N) for Mamba-1."""
    for o in _fwd(ops, "exp"):
        if o.shapes and 1 <= len(o.shapes[0]) <= 2:
            return tuple(int(d) for d in o.shapes[0])
    return None


def _first_square(ops: Sequence) -> int | None:
    """The chunk size: the side of the first square 2-D mask the module builds (``ones(Q, Q)``)."""
    for o in ops:
        if o.phase == "fwd" and o.out_shapes and len(o.out_shapes[0]) == 2 and o.out_shapes[0][0] == o.out_shapes[0][1]:
            if o.aten in ("ones", "tril", "triu", "full"):
                return int(o.out_shapes[0][0])
    return None


def _head_dims(ops: Sequence, b: int, s: int, heads: int) -> list[int]:
    """The last dims of the module's (b, s, H, d) tensors as they are laid out per head."""
    out = []
    for o in ops:
        if o.phase != "fwd" or o.aten not in ("view", "transpose.int", "_unsafe_view") or not o.out_shapes:
            continue
        src, dst = (o.shapes[0] if o.shapes else ()), o.out_shapes[0]
        if o.aten == "transpose.int" and len(src) == 4 and src[:3] == (b, s, heads):
            out.append(int(src[3]))
        elif o.aten != "transpose.int" and len(dst) == 4 and tuple(dst[:3]) == (b, s, heads) and len(src) == 3:
            out.append(int(dst[3]))
    return out


def _ssd_dims(ops: Sequence, conv: tuple[int, int, int, int]) -> dict[str, int] | None:
    b, s, channels, _ = conv
    decay = _decay_shape(ops)
    mm = _fwd(ops, "bmm")
    if decay is None or len(decay) != 1 or not mm or len(mm[0].shapes[0]) != 3:
        return None
    heads = decay[0]
    chunk, state = int(mm[0].shapes[0][1]), int(mm[0].shapes[0][2])  # C B^T: (.., Q, N) x (.., N, Q)
    dims = _head_dims(ops, b, s, heads)
    if not dims:
        return None
    head_dim = dims[0]
    groups = max(1, (channels - heads * head_dim) // (2 * state))
    return {"b": b, "s": s, "heads": heads, "head_dim": head_dim, "state": state, "groups": groups, "chunk": chunk}


def _delta_dims(ops: Sequence, conv: tuple[int, int, int, int]) -> dict[str, int] | None:
    b, s, channels, _ = conv
    decay = _decay_shape(ops)
    chunk = _first_square(ops)
    if decay is None or len(decay) != 1 or chunk is None:
        return None
    heads = decay[0]
    dims = [o.shapes[0][3] for o in _fwd(ops, "transpose.int")
            if o.shapes and len(o.shapes[0]) == 4 and tuple(o.shapes[0][:3]) == (b, s, heads)]
    if len(dims) < 3:
        return None
    dk, dv = int(dims[0]), int(dims[2])  # query, key, value laid out per head in that order
    key_heads = max(1, (channels - heads * dv) // (2 * dk))
    return {"b": b, "s": s, "heads": heads, "key_heads": key_heads, "dk": dk, "dv": dv, "chunk": chunk}


def scan_ops(module: str, module_type: str, ops: Sequence, params: float, e: int) -> tuple[Op, ...] | None:
    """The kernels a state-space or linear-attention module runs in training (its causal
    convolution, then its scan), recognised by the module that issued the traced operators, with
    their work from the cited formulas; None for any other module. The module's other eager
    operators (gates, softplus, the D skip) are fused into these kernels. Each role is marked
    ``uncalibrated:``: no operator of these kinds has been measured."""
    words = module_type.lower()
    mamba = "mamba" in words
    delta = "deltanet" in words or "linearattention" in words
    if not (mamba or delta):
        return None
    conv = _conv(ops)
    if conv is None:
        return None
    b, s, channels, width = conv
    out: list[Op] = []
    c = causal_conv1d_work(b, s, channels, width, e)
    out.append(_op(f"{module}.conv1d", OpKind.CAUSAL_CONV1D, f"causal conv1d ({CONV})", c,
                   (("b", b), ("s", s), ("channels", channels), ("width", width))))
    decay = _decay_shape(ops)
    if mamba and decay is not None and len(decay) == 2:
        d, n = decay
        w = selective_scan_work(b, s, d, n, e)
        out.append(_op(f"{module}.scan", OpKind.SELECTIVE_SCAN, f"selective scan ({SELECTIVE})", w,
                       (("b", b), ("s", s), ("channels", d), ("state", n))))
    elif mamba:
        dims = _ssd_dims(ops, conv)
        if dims is None:
            return None
        w = ssd_scan_work(**dims, e=e)
        out.append(_op(f"{module}.scan", OpKind.SSM_SCAN, f"SSD chunked scan ({SSD})", w, tuple(dims.items())))
    else:
        dims = _delta_dims(ops, conv)
        if dims is None:
            return None
        w = gated_delta_work(**dims, e=e)
        out.append(_op(f"{module}.scan", OpKind.LINEAR_ATTENTION, f"gated delta rule chunks ({DELTANET})", w,
                       tuple(dims.items())))
    # the module's parameters (A_log, D, dt_bias and the convolution's weights) are the scan's
    out[1] = replace(out[1], params=float(params))
    return tuple(out)


def _op(name: str, kind: OpKind, role: str, w: Work, dims) -> Op:
    return Op(name=name, kind=kind, role=f"uncalibrated: {role}", flops=w.flops, bytes=w.bytes,
              bwd_flops=w.bwd_flops, bwd_bytes=w.bwd_bytes, saved_bytes=w.saved,
              dims=tuple((k, int(v)) for k, v in dims))
