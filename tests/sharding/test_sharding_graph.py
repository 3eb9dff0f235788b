"""The step function's graph as ParallelBlocks (issue 5, part 1): contractions with a parameter
operand, grown along communication-free operators, and the layers found as one repeated segment."""

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from gpt_example import gpt  # noqa: E402

from paraplan.sharding.graph import find_segments, parallel_blocks, trace  # noqa: E402
from timing import assert_no_slower  # noqa: E402


def test_every_weight_matrix_of_a_gpt_layer_opens_one_block():
    g = gpt()
    graph = trace(g.loss, g.init_params(2), jnp.ones((2, 16, 64)))
    blocks = parallel_blocks(graph)
    assert len(blocks) == 2 * 4  # qkv, proj, fc1, fc2 per layer
    shapes = [graph.param_shapes[b.weight] for b in blocks[:4]]
    assert shapes == [(64, 192), (64, 64), (64, 256), (256, 64)]
    # the MLP's GELU joins fc1's block: its sharding passes through without communication
    fc1 = blocks[2]
    assert {"tanh", "mul", "add"} <= {e.primitive for e in fc1.members}


def test_the_layers_are_found_as_one_repeated_segment():
    g = gpt()
    for layers in (1, 3, 6):
        blocks = parallel_blocks(trace(g.loss, g.init_params(layers), jnp.ones((2, 16, 64))))
        seg = find_segments(blocks)
        if layers == 1:
            assert seg.repeats == 0 and len(seg.unique_blocks) == 4
        else:
            assert seg.repeats == layers and len(seg.segment) == 4 and seg.prefix == seg.suffix == ()


def test_a_training_step_folds_each_backward_contraction_into_its_forward_block():
    g = gpt()
    graph = trace(g.train_step, g.init_params(2), jnp.ones((2, 16, 64)))
    blocks = parallel_blocks(graph)
    # one block per weight; the input gradient dx = dy @ W.T is the same block's backward
    assert len(blocks) == 2 * 4
    assert all(len(b.later_uses) == 1 for b in blocks)
    assert all(b.later_uses[0].index > blocks[-1].entry.index for b in blocks)
    assert find_segments(blocks).repeats == 2


def test_head_alignment_comes_from_the_reshapes_into_and_out_of_heads():
    g = gpt()
    blocks = parallel_blocks(trace(g.loss, g.init_params(1), jnp.ones((2, 16, 64))))
    qkv, proj, fc1, fc2 = blocks
    assert qkv.n_outer == g.heads_for(64) == 4  # (b, s, 3h) -> (b, s, heads, 3 * head_dim)
    assert proj.k_outer == 4  # (b, s, heads, head_dim) -> (b, s, h)
    assert fc1.n_outer is None and fc2.k_outer is None


def test_analysing_a_32_layer_gpt_is_fast():
    """Linear in the layers, measured in this run: 32 layers cost no more than 2 layers times 40
    (16 x measured; a pass quadratic in the layers would be 256 x)."""
    g = gpt()

    def analysed(layers: int):
        return find_segments(parallel_blocks(trace(g.loss, g.init_params(layers), jnp.ones((2, 16, 64)))))

    assert analysed(32).repeats == 32
    assert_no_slower(lambda: analysed(32), lambda: analysed(2), factor=40, repeat=3)
