"""A small mixture-of-experts model in plain JAX, for `paraplan.sharding`: layers of a
Switch-Transformer MoE MLP (a router, top-1 gating with a capacity, experts as batched weights
``[experts, hidden, ffn]``). ``train_step(params, x)`` returns the loss and gradients;
``example_args()`` gives the arguments ``paraplan sharding`` traces it with.

The experts' contractions have the experts as a batch dimension, so a mesh axis can split them
(expert parallelism): tokens then reach their experts through an all-to-all.

    paraplan sharding examples/sharding/moe_layer.py:train_step --mesh data=2,model=4
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

EXPERTS = 8
CAPACITY_FACTOR = 2.0


def init_params(num_layers: int = 2, hidden: int = 128, ffn: int | None = None, experts: int = EXPERTS,
                seed: int = 0) -> dict:
    ffn = ffn or 4 * hidden
    keys = jax.random.split(jax.random.PRNGKey(seed), num_layers * 3)
    layers = []
    for i in range(num_layers):
        k = keys[3 * i:3 * i + 3]
        layers.append({
            "norm": jnp.ones((hidden,)),
            "router": jax.random.normal(k[0], (hidden, experts), jnp.float32) * hidden**-0.5,
            "w_in": jax.random.normal(k[1], (experts, hidden, ffn), jnp.float32) * hidden**-0.5,
            "w_out": jax.random.normal(k[2], (experts, ffn, hidden), jnp.float32) * ffn**-0.5,
        })
    return {"layers": layers}


def _norm(x, g):
    return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g


def moe(p: dict, x: jax.Array) -> jax.Array:
    """Top-1 (Switch) routing of tokens x[T, h] to the experts, with a fixed capacity per expert."""
    tokens, experts = x.shape[0], p["router"].shape[1]
    capacity = int(CAPACITY_FACTOR * tokens / experts)
    probs = jax.nn.softmax(x @ p["router"], axis=-1)
    expert = jnp.argmax(probs, axis=-1)
    mask = jax.nn.one_hot(expert, experts, dtype=x.dtype)  # [T, E]
    position = (jnp.cumsum(mask, axis=0) - 1.0) * mask  # slot of each token in its expert
    keep = mask * (position < capacity)
    dispatch = keep[:, :, None] * jax.nn.one_hot(position.astype(jnp.int32), capacity, dtype=x.dtype)  # [T, E, C]
    combine = dispatch * (probs * keep)[:, :, None]
    x_e = jnp.einsum("tec,th->ech", dispatch, x)
    h = jax.nn.gelu(jnp.einsum("ech,ehf->ecf", x_e, p["w_in"]))
    y_e = jnp.einsum("ecf,efh->ech", h, p["w_out"])
    return jnp.einsum("tec,ech->th", combine, y_e)


def loss(params: dict, x: jax.Array) -> jax.Array:
    b, s, h = x.shape
    x = x.reshape(b * s, h)
    for p in params["layers"]:
        x = x + moe(p, _norm(x, p["norm"]))
    return (x**2).mean()


def train_step(params: dict, x: jax.Array):
    return jax.value_and_grad(loss)(params, x)


def example_args(num_layers: int = 2, hidden: int = 128, batch: int = 8, seq: int = 64):
    """(params, x) for ``train_step``, concrete, so that the plan can be compiled and checked."""
    x = jax.random.normal(jax.random.PRNGKey(1), (batch, seq, hidden), jnp.float32)
    return init_params(num_layers, hidden), x
