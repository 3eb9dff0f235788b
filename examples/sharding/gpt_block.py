"""A GPT model of pre-norm blocks (multi-head attention + GELU MLP) in plain JAX, for
`paraplan.sharding`: ``train_step(params, tokens_embedded)`` returns the loss and gradients.

The fused QKV projection keeps Megatron-LM's layout: its output features are ordered head by
head (``[heads, 3, head_dim]``), so a column split over whole heads needs no communication.
``example_args()`` gives the arguments ``paraplan sharding`` traces the step with.

    paraplan sharding examples/sharding/gpt_block.py:train_step --mesh data=2,model=4
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def heads_for(hidden: int) -> int:
    """Attention heads: head_dim 128 as in GPT-3 and Llama, and at least 4."""
    return max(4, hidden // 128)


def init_params(num_layers: int = 4, hidden: int = 64, seed: int = 0) -> dict:
    keys = jax.random.split(jax.random.PRNGKey(seed), num_layers * 4)
    scale = hidden**-0.5

    def w(key, shape):
        return jax.random.normal(key, shape, jnp.float32) * scale

    layers = []
    for i in range(num_layers):
        k = keys[4 * i:4 * i + 4]
        layers.append({
            "ln1": jnp.ones((hidden,)), "ln2": jnp.ones((hidden,)),
            "qkv": w(k[0], (hidden, 3 * hidden)), "proj": w(k[1], (hidden, hidden)),
            "fc1": w(k[2], (hidden, 4 * hidden)), "fc2": w(k[3], (4 * hidden, hidden)),
        })
    return {"layers": layers}


def _norm(x, g):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g


def block(p: dict, x: jax.Array) -> jax.Array:
    b, s, h = x.shape
    heads = heads_for(h)
    qkv = (_norm(x, p["ln1"]) @ p["qkv"]).reshape(b, s, heads, 3 * (h // heads))
    q, k, v = jnp.split(qkv, 3, axis=-1)
    att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / (h // heads) ** 0.5, axis=-1)
    x = x + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, s, h) @ p["proj"]
    return x + jax.nn.gelu(_norm(x, p["ln2"]) @ p["fc1"]) @ p["fc2"]


def loss(params: dict, x: jax.Array) -> jax.Array:
    for p in params["layers"]:
        x = block(p, x)
    return (x**2).mean()


def train_step(params: dict, x: jax.Array):
    return jax.value_and_grad(loss)(params, x)


def example_args(num_layers: int = 4, hidden: int = 256, batch: int = 8, seq: int = 128):
    """(params, x) for ``train_step``: concrete arrays, so that the plan can be compiled and
    checked against the unsharded step."""
    x = jax.random.normal(jax.random.PRNGKey(1), (batch, seq, hidden), jnp.float32)
    return init_params(num_layers, hidden), x
