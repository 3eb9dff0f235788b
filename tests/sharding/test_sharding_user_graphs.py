"""Step functions as users write them (issue 5): weights stored transposed or shared between
layers, layers of different widths, bf16, extra step arguments -- and the HLO forms XLA emits
on GPUs -- each planned, specced and checked correctly."""

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import paraplan.sharding  # noqa: E402
from paraplan.sharding.graph import find_segments, parallel_blocks, trace  # noqa: E402
from paraplan.sharding.plan import analyse, plan_of  # noqa: E402
from paraplan.sharding.verify import Verification, collective_bytes  # noqa: E402

AXES = {"data": 2, "model": 4}


def value_and_grad(loss):
    return lambda p, x: jax.value_and_grad(loss)(p, x)


def test_layers_of_different_widths_are_not_taken_for_repeats():
    def loss(p, x):
        for name in ("w0", "w1", "w2"):
            x = jnp.tanh(x @ p[name])
        return (x**2).mean()

    params = {"w0": jax.ShapeDtypeStruct((1024, 1536), jnp.float32),
              "w1": jax.ShapeDtypeStruct((1536, 1536), jnp.float32),
              "w2": jax.ShapeDtypeStruct((1536, 1536), jnp.float32)}
    x = jax.ShapeDtypeStruct((8, 1024), jnp.float32)
    blocks = parallel_blocks(trace(value_and_grad(loss), params, x))
    seg = find_segments(blocks)
    assert 0 not in seg.segment  # w0 [1024, 1536] is not w1 [1536, 1536]
    a = analyse(value_and_grad(loss), (params, x), {"model": 8})
    assert (a.costs.shapes[0].k, a.costs.shapes[1].k) == (1024, 1536)


def test_a_weight_shared_by_every_layer_is_costed_for_every_use():
    def loss(p, x):
        for _ in range(4):
            x = x + jnp.tanh(x @ p["w"])
        return (x**2).mean()

    p = {"w": jax.ShapeDtypeStruct((1024, 1024), jnp.float32)}
    x = jax.ShapeDtypeStruct((8, 512, 1024), jnp.float32)
    blocks = parallel_blocks(trace(value_and_grad(loss), p, x))
    # four forward uses; three input gradients (the first use reads the batch, which needs none)
    assert len(blocks) == 4 and sum(len(b.later_uses) for b in blocks) == 3
    assert [b.needs_dx for b in blocks] == [False, True, True, True]


def test_weights_stored_transposed_get_the_spec_of_the_dimension_the_plan_splits(devices):
    """PyTorch's [out, in] layout used as x @ W.T: the column split lands on W's first dimension."""
    def loss(p, x):
        h = jax.nn.gelu(x @ p["up"].T)
        x = x + h @ p["down"].T
        return (x**2).mean()

    h = 64
    k = jax.random.split(jax.random.PRNGKey(0), 2)
    params = {"up": jax.random.normal(k[0], (4 * h, h)) / 8, "down": jax.random.normal(k[1], (h, 4 * h)) / 16}
    x = jax.random.normal(jax.random.PRNGKey(1), (8, 16, h))
    a = analyse(value_and_grad(loss), (params, x), AXES)
    plan = plan_of(a, [("M", "N"), ("M", "K")])  # Megatron: up column, down row
    assert plan.param_specs["up"] == ("model", None) and plan.param_specs["down"] == (None, "model")
    check = plan.verify(value_and_grad(loss), (params, x))
    assert check.matches and check.flag is None, check.flag


def test_a_reshaped_weight_is_kept_whole_and_costed_whole():
    def loss(p, x):
        return ((x @ p["w"].reshape(64, 256)) ** 2).mean()

    params = {"w": jax.ShapeDtypeStruct((64, 16, 16), jnp.float32)}
    x = jax.ShapeDtypeStruct((8, 64), jnp.float32)
    a = analyse(value_and_grad(loss), (params, x), AXES)
    assert all(c in ("M", None) for s in a.costs.options[0] for c in s)


@pytest.mark.slow
def test_bf16_plans_are_compared_within_bf16_rounding(devices):
    from gpt_example import gpt

    g = gpt()
    p, x = g.example_args(num_layers=2, hidden=256, batch=8, seq=64)
    p = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), p)
    x = x.astype(jnp.bfloat16)
    a = analyse(g.train_step, (p, x), AXES)
    check = plan_of(a, [("M", "N"), ("M", "K"), ("M", "N"), ("M", "K")] * 2).verify(g.train_step, (p, x))
    assert check.matches, check.max_abs_error


@pytest.mark.slow
def test_a_step_with_extra_arguments_and_scalars_in_the_batch_is_verified(devices):
    from gpt_example import gpt

    g = gpt()

    def step(params, batch, lr):
        value, grads = jax.value_and_grad(g.loss)(params, batch["x"])
        return value, jax.tree_util.tree_map(lambda w, d: w - lr * d, params, grads)

    params, x = g.example_args(num_layers=2, hidden=64, batch=8, seq=16)
    args = (params, {"x": x, "step": jnp.zeros((), jnp.int32)}, 0.1)
    plan = paraplan.sharding.search(step, args, AXES)
    assert plan.verify(step, args).matches


def test_combined_async_collectives_and_narrow_dtypes_are_counted_as_xla_emits_them():
    hlo = """
  %ags = ((f32[2,4]{1,0}, f32[2,4]{1,0}), (f32[8,4]{1,0}, f32[8,4]{1,0})) all-gather-start(f32[2,4]{1,0} %a, f32[2,4]{1,0} %b), replica_groups={{0,1,2,3}}
  %agd = (f32[8,4]{1,0}, f32[8,4]{1,0}) all-gather-done(%ags)
  %cps = (f32[16]{0}, f32[16]{0}, u32[], u32[]) collective-permute-start(f32[16]{0} %p), source_target_pairs={{0,1}}
  %x = f8e4m3fn[1024]{0} all-reduce(f8e4m3fn[1024]{0} %c), to_apply=%sum
  %y = s64[100]{0} all-reduce(s64[100]{0} %d), to_apply=%sum
"""
    assert collective_bytes(hlo) == {"all-gather": 256.0, "collective-permute": 64.0, "all-reduce": 1024.0 + 800.0}


def test_a_collective_of_another_kind_than_predicted_is_flagged_even_at_equal_bytes():
    check = Verification(None, None, {"all-gather": 1.0e6}, {"all-reduce": 1.0e6}, None, None, 0.0)
    assert check.bytes_difference == 0.0
    assert check.flag is not None and "all-gather" in check.flag
    fine = Verification(None, None, {"all-reduce": 1.0e6 + 10}, {"all-reduce": 1.0e6}, None, None, 0.0)
    assert fine.flag is None
