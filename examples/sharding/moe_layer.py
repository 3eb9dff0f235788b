"""A small mixture-of-experts model in plain JAX, for `paraplan.sharding`: layers of a
Switch-Transformer MoE MLP (a router, top-1 gating with a capacity, experts as batched weights
``[experts, hidden, ffn]``). ``train_step(params, x)`` returns the loss and gradients;
``example_args()`` gives the arguments ``paraplan sharding`` traces it with.

The experts' contractions have the experts as a batch dimension, so a mesh axis can split them
(expert parallelism): tokens, routed within their group (GShard), then reach their experts
through an all-to-all.

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
    """Top-1 (Switch) routing of x[G, S, h] -- G groups (sequences) of S tokens, as GShard groups
    them -- to the experts, with a fixed capacity per expert and group: routing never mixes
    groups, so with the groups split over devices the dispatch is an all-to-all."""
    tokens, experts = x.shape[1], p["router"].shape[1]
    capacity = int(CAPACITY_FACTOR * tokens / experts)
    probs = jax.nn.softmax(x @ p["router"], axis=-1)  # [G, S, E]
    expert = jnp.argmax(probs, axis=-1)
    mask = jax.nn.one_hot(expert, experts, dtype=x.dtype)
    position = (jnp.cumsum(mask, axis=1) - 1.0) * mask  # slot of each token in its expert, per group
    keep = mask * (position < capacity)
    dispatch = keep[..., None] * jax.nn.one_hot(position.astype(jnp.int32), capacity, dtype=x.dtype)  # [G,S,E,C]
    combine = dispatch * (probs * keep)[..., None]
    x_e = jnp.einsum("gsec,gsh->egch", dispatch, x)
    h = jax.nn.gelu(jnp.einsum("egch,ehf->egcf", x_e, p["w_in"]))
    y_e = jnp.einsum("egcf,efh->egch", h, p["w_out"])
    return jnp.einsum("gsec,egch->gsh", combine, y_e)


def loss(params: dict, x: jax.Array) -> jax.Array:
    for p in params["layers"]:
        x = x + moe(p, _norm(x, p["norm"]))
    return (x**2).mean()


def train_step(params: dict, x: jax.Array):
    return jax.value_and_grad(loss)(params, x)


def example_args(num_layers: int = 2, hidden: int = 128, batch: int = 8, seq: int = 64):
    """(params, x) for ``train_step``, concrete, so that the plan can be compiled and checked."""
    x = jax.random.normal(jax.random.PRNGKey(1), (batch, seq, hidden), jnp.float32)
    return init_params(num_layers, hidden), x
