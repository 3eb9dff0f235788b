"""A Llama model of pre-norm blocks in plain JAX, for `paraplan.sharding`: RMSNorm, rotary
position embeddings, grouped-query attention (GQA) and a SwiGLU MLP.
``train_step(params, x)`` returns the loss and gradients; ``example_args()`` gives the
arguments ``paraplan sharding`` traces it with.

Head layouts are Megatron-LM's: the fused K/V projection's output features are ordered
key-value head by key-value head (``[kv_heads, 2, head_dim]``), and the query heads of one group
are adjacent, so a column split over whole key-value heads needs no communication -- and a
split that does not divide the key-value heads is not offered.

    paraplan sharding examples/sharding/llama_block.py:train_step --mesh data=2,model=4
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def heads_for(hidden: int) -> tuple[int, int]:
    """(query heads, key-value heads): head_dim 128 and groups of 4 as in Llama 3, at least 8 and 4."""
    heads = max(8, hidden // 128)
    return heads, max(4, heads // 4)


def init_params(num_layers: int = 4, hidden: int = 256, ffn: int | None = None, seed: int = 0) -> dict:
    ffn = ffn or 4 * hidden
    heads, kv_heads = heads_for(hidden)
    head_dim = hidden // heads
    keys = jax.random.split(jax.random.PRNGKey(seed), num_layers * 6)

    def w(key, shape):
        return jax.random.normal(key, shape, jnp.float32) * shape[0] ** -0.5

    layers = []
    for i in range(num_layers):
        k = keys[6 * i:6 * i + 6]
        layers.append({
            "attn_norm": jnp.ones((hidden,)), "mlp_norm": jnp.ones((hidden,)),
            "wq": w(k[0], (hidden, heads * head_dim)), "wkv": w(k[1], (hidden, 2 * kv_heads * head_dim)),
            "wo": w(k[2], (heads * head_dim, hidden)),
            "w_gate": w(k[3], (hidden, ffn)), "w_up": w(k[4], (hidden, ffn)), "w_down": w(k[5], (ffn, hidden)),
        })
    return {"layers": layers}


def _rms_norm(x, g):
    return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g


def _rope(x):
    """Rotary embeddings on [batch, seq, ..., head_dim] (half-split convention)."""
    s, d = x.shape[1], x.shape[-1]
    freq = 1.0 / (10000.0 ** (jnp.arange(0, d // 2, dtype=jnp.float32) / (d // 2)))
    angle = jnp.arange(s, dtype=jnp.float32)[:, None] * freq[None, :]
    shape = (1, s) + (1,) * (x.ndim - 3) + (d // 2,)
    cos, sin = jnp.cos(angle).reshape(shape), jnp.sin(angle).reshape(shape)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def block(p: dict, x: jax.Array) -> jax.Array:
    b, s, h = x.shape
    heads, kv_heads = heads_for(h)
    d, group = h // heads, heads // kv_heads
    y = _rms_norm(x, p["attn_norm"])
    q = _rope((y @ p["wq"]).reshape(b, s, kv_heads, group, d))
    kv = (y @ p["wkv"]).reshape(b, s, kv_heads, 2 * d)
    k, v = _rope(kv[..., :d]), kv[..., d:]
    scores = jnp.einsum("bqngd,bknd->bngqk", q, k) / d**0.5
    mask = jnp.tril(jnp.ones((s, s), bool))
    att = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    out = jnp.einsum("bngqk,bknd->bqngd", att, v).reshape(b, s, h)
    x = x + out @ p["wo"]
    y = _rms_norm(x, p["mlp_norm"])
    return x + (jax.nn.silu(y @ p["w_gate"]) * (y @ p["w_up"])) @ p["w_down"]


def loss(params: dict, x: jax.Array) -> jax.Array:
    for p in params["layers"]:
        x = block(p, x)
    return (x**2).mean()


def train_step(params: dict, x: jax.Array):
    return jax.value_and_grad(loss)(params, x)


def example_args(num_layers: int = 4, hidden: int = 256, batch: int = 8, seq: int = 128):
    """(params, x) for ``train_step``, concrete, so that the plan can be compiled and checked."""
    x = jax.random.normal(jax.random.PRNGKey(1), (batch, seq, hidden), jnp.float32)
    return init_params(num_layers, hidden), x
