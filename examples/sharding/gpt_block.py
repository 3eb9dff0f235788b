"""A GPT model of pre-norm blocks (multi-head attention + GELU MLP) in plain JAX, for
`paraplan.sharding`: ``train_step(params, tokens_embedded)`` returns the loss and gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp

HEADS = 4


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


def block(p: dict, x: jax.Array, heads: int = HEADS) -> jax.Array:
    b, s, h = x.shape
    q, k, v = jnp.split(_norm(x, p["ln1"]) @ p["qkv"], 3, axis=-1)
    q, k, v = (t.reshape(b, s, heads, h // heads) for t in (q, k, v))
    att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / (h // heads) ** 0.5, axis=-1)
    x = x + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, s, h) @ p["proj"]
    return x + jax.nn.gelu(_norm(x, p["ln2"]) @ p["fc1"]) @ p["fc2"]


def loss(params: dict, x: jax.Array) -> jax.Array:
    for p in params["layers"]:
        x = block(p, x)
    return (x**2).mean()


def train_step(params: dict, x: jax.Array):
    return jax.value_and_grad(loss)(params, x)
