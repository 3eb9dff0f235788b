"""Compiling a plan on 8 CPU devices (issue 5, part 5): the sharded step equals the unsharded one,
and XLA's all-reduce bytes equal the analytic ones for Megatron's tensor parallelism."""


import pytest

jax = pytest.importorskip("jax")
from gpt_example import gpt  # noqa: E402

from paraplan.sharding.graph import parallel_blocks, trace  # noqa: E402
from paraplan.sharding.verify import verify, weight_specs  # noqa: E402

AXES = (("data", 2), ("model", 4))
MEGATRON = [("M", "N"), ("M", "K"), ("M", "N"), ("M", "K")]  # column, row, column, row


@pytest.fixture(scope="module")
def model(devices):
    g = gpt()
    params = g.init_params(2, hidden=64)
    x = jax.random.normal(jax.random.PRNGKey(1), (8, 16, 64))
    return g, params, x


@pytest.mark.parametrize("plan", [pytest.param("replicated", marks=pytest.mark.slow), "data",
                                  pytest.param("megatron", marks=pytest.mark.slow)])
def test_a_sharded_step_computes_what_the_unsharded_step_does(model, plan):
    g, params, x = model
    for fn in (g.loss, g.train_step):
        graph = trace(fn, params, x)
        blocks = parallel_blocks(graph)[:8]
        strategies = {"replicated": [(None, None)] * 4, "data": [("M", "M")] * 4, "megatron": MEGATRON}[plan] * 2
        batch = {"replicated": (), "data": ("data", "model"), "megatron": ("data",)}[plan]
        result = verify(fn, (params, x), AXES, weight_specs(graph, blocks, strategies, ("data", "model")), batch, graph)
        assert result.matches, result.max_abs_error


def test_megatron_forward_all_reduces_exactly_the_analytic_bytes(model):
    g, params, x = model
    graph = trace(g.loss, params, x)
    blocks = parallel_blocks(graph)
    result = verify(g.loss, (params, x), AXES, weight_specs(graph, blocks, MEGATRON * 2, ("data", "model")), ("data",), graph)
    tokens_per_data_shard = 8 * 16 // 2
    analytic = 2 * 2 * tokens_per_data_shard * 64 * 4  # proj and fc2 outputs (row parallel), 2 layers, fp32
    # plus the 4-byte loss, averaged over the data axis
    assert result.xla_collective_bytes["all-reduce"] == analytic + 4


@pytest.mark.slow
def test_the_python_entry_point_returns_partition_specs_that_apply_to_the_arrays(model):
    import numpy as np
    from jax.sharding import NamedSharding

    import paraplan.sharding

    g, params, x = model
    plan = paraplan.sharding.search(g.train_step, (params, x), {"data": 2, "model": 4})
    assert len(plan.strategies) == 2 * 4  # one block per weight; the backward is folded in
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    specs = plan.partition_specs()
    placed = jax.tree_util.tree_map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), params, specs)
    step = jax.jit(plan.apply(mesh))
    loss, grads = step(placed, jax.device_put(x, NamedSharding(mesh, plan.batch_spec())))
    expected_loss, expected_grads = g.train_step(params, x)
    assert np.allclose(loss, expected_loss, rtol=1e-5)
    assert all(np.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in
               zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(expected_grads), strict=True))
    assert plan.verify(g.train_step, (params, x)).matches
    tight = paraplan.sharding.search(g.loss, (params, x), {"data": 2, "model": 4}, memory_budget=plan.memory_bytes / 3)
    assert tight.fits and tight.verify(g.loss, (params, x)).matches
