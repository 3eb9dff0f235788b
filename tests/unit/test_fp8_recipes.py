"""FP8 recipes (``parallel.fp8_recipe``): each recipe's casts, amax passes and transposes as
operators with the bytes its kernels move (Transformer Engine's recipes; torchao's
``roofline_utils`` for tensorwise, rowwise and mxfp8), the GPUs that run them, the presets that
choose them and the flags the exports write."""

from __future__ import annotations

import pytest

from paraplan.catalog import resolve_job
from paraplan.export import render
from paraplan.inventory import count_job
from paraplan.inventory.fp8 import recipe_costs
from paraplan.prediction import predict
from paraplan.specs import ConfigError, FP8Recipe

LLAMA = {"name": "llama-3-8b", "seq_length": 4096}


def job(recipe=None, precision="fp8", cluster="dgx-h100", framework=None, **parallel):
    plan = {"tp": 2, "sequence_parallel": True, "micro_batch_size": 1, "global_batch_size": 32, **parallel}
    if recipe is not None:
        plan["fp8_recipe"] = recipe
    if framework is not None:
        plan["framework"] = framework
    return resolve_job({"model": LLAMA, "cluster": {"name": cluster, "num_nodes": 1}, "parallel": plan,
                        "precision": precision})


def layer(j):
    return {op.name: op for op in count_job(j).stages[0].layer_ops}


def gemm_elements(ops):
    """Elements of the FP8 GEMMs' inputs (norm-fed ones apart) and output gradients."""
    inputs = {n: dict(op.dims)["m"] * dict(op.dims)["k"] for n, op in ops.items() if op.fp8}
    grads = sum(dict(op.dims)["m"] * dict(op.dims)["n"] for op in ops.values() if op.fp8)
    fed = inputs["linear1"] + inputs["linear3"]
    return sum(inputs.values()) - fed, fed, grads


@pytest.mark.parametrize(("recipe", "cluster", "per_element"), [
    ("delayed", "dgx-h100", lambda e: e + 2),  # TE cast_transpose: read e, write FP8 and its transpose
    ("current", "dgx-h100", lambda e: 2 * e + 2),  # an amax pass first, then the cast and transpose
    ("rowwise", "dgx-h100", lambda e: 3 * e + 2),  # rows cast, 16-bit transpose, columns cast
    ("mxfp8", "dgx-b200", lambda e: e + 2 + 2 / 32),  # both block-scaled copies and one E8M0 per 32
])
def test_each_recipe_s_casts_move_the_bytes_its_kernels_read_and_write(recipe, cluster, per_element):
    ops = layer(job(recipe, cluster=cluster))
    plain, fed, grads = gemm_elements(ops)
    e = 2
    # the norm writes delayed scaling's FP8 input itself (only the transpose is left); the other
    # recipes need the whole tensor's (or block's) scale first and cast it as any other input
    fed_bytes = 2 if recipe == "delayed" else per_element(e)
    cast = ops["fp8_cast"]
    assert cast.bytes == pytest.approx(plain * per_element(e) + fed * fed_bytes)
    assert cast.bwd_bytes == pytest.approx(grads * per_element(e))
    assert recipe in cast.role


def test_delayed_and_current_scaling_differ_only_by_the_amax_and_scale_work():
    delayed, current = layer(job("delayed")), layer(job("current"))
    assert delayed.keys() == current.keys()
    casts = {"fp8_cast", "fp8_weight_cast"}
    assert {n: op for n, op in delayed.items() if n not in casts} == {
        n: op for n, op in current.items() if n not in casts}
    plain, fed, grads = gemm_elements(delayed)
    e = 2
    # the weights' cast (once per iteration, 1/m per micro-batch) reads them once more too
    weights, m = delayed["fp8_weight_cast"], job().parallel.num_microbatches
    extra = current["fp8_weight_cast"].bytes - weights.bytes
    assert extra == pytest.approx(e * dict(weights.dims)["params"] / m, rel=1e-6)
    # current scaling reads every tensor once more for its amax, and the norm cannot write the
    # FP8 input (read e, write 2 instead of the transpose's 2)
    assert current["fp8_cast"].bytes - delayed["fp8_cast"].bytes == pytest.approx(e * plain + (2 * e + 2 - 2) * fed)
    assert current["fp8_cast"].bwd_bytes - delayed["fp8_cast"].bwd_bytes == pytest.approx(e * grads)
    d, c = predict(job("delayed")), predict(job("current"))
    assert d.memory[0].weights > c.memory[0].weights  # delayed scaling's amax histories
    assert d.memory[0].weights - c.memory[0].weights < 4e6  # a few MB: 1024 fp32 per tensor


def test_an_unstated_recipe_is_delayed_scaling_to_the_last_bit():
    unstated, delayed = job(), job("delayed")
    assert count_job(unstated).stages[0].layer_ops == count_job(delayed).stages[0].layer_ops
    assert predict(unstated).iteration_s == predict(delayed).iteration_s
    assert predict(unstated).memory == predict(delayed).memory


def test_mxfp8_reads_a_scale_byte_per_32_operand_elements_and_keeps_block_scaled_weight_copies():
    mx, delayed = layer(job("mxfp8", cluster="dgx-b200")), layer(job("delayed", cluster="dgx-b200"))
    fc = mx["linear3"]
    m, k = dict(fc.dims)["m"], dict(fc.dims)["k"]
    assert fc.bytes - delayed["linear3"].bytes == pytest.approx((m * k + fc.params) / 32)
    assert recipe_costs(FP8Recipe.MXFP8).copy_bytes == pytest.approx(2 + 2 / 32)


def test_rowwise_keeps_the_16_bit_input_for_the_weight_gradient():
    rowwise, delayed = layer(job("rowwise")), layer(job("delayed"))
    assert rowwise["linear3"].saved_bytes == pytest.approx(2 * delayed["linear3"].saved_bytes)


def test_mxfp8_is_refused_on_h100_naming_the_field_and_accepted_on_b200():
    with pytest.raises(ConfigError, match=r"^parallel\.fp8_recipe: mxfp8 needs .*H100"):
        job("mxfp8")
    assert predict(job("mxfp8", cluster="dgx-b200")).iteration_s > 0


def test_a_recipe_without_fp8_precision_and_nvfp4_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^parallel\.fp8_recipe: current is an FP8 recipe.*bf16") as err:
        job("current", precision="bf16")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"^parallel\.fp8_recipe: nvfp4 is not modelled"):
        job("nvfp4", cluster="dgx-b200")


def test_tensorwise_is_read_as_current_scaling():
    assert job("tensorwise").parallel.fp8_recipe is FP8Recipe.CURRENT


@pytest.mark.parametrize("cluster", ["dgx-h100", "dgx-b200"])
def test_the_more_passes_a_recipe_makes_over_its_tensors_the_slower_its_iteration(cluster):
    times = {r: predict(job(r, cluster=cluster)).iteration_s for r in ("delayed", "current", "rowwise")}
    bf16 = predict(job(precision="bf16", cluster=cluster)).iteration_s
    assert times["delayed"] < times["current"] < times["rowwise"] < bf16


def test_presets_set_their_cited_recipe_only_for_fp8_jobs_and_a_stated_one_wins():
    titan = job(framework="torchtitan", tp=1, sequence_parallel=False)
    assert titan.parallel.fp8_recipe is FP8Recipe.CURRENT
    assert titan.preset.taken["fp8_recipe"] == "current"
    assert "fp8_recipe" not in job(framework="torchtitan", precision="bf16", tp=1, sequence_parallel=False).preset.taken
    assert job(framework="nemo-24.07").parallel.fp8_recipe is FP8Recipe.DELAYED
    stated = job("rowwise", framework="torchtitan", tp=1, sequence_parallel=False)
    assert stated.parallel.fp8_recipe is FP8Recipe.ROWWISE
    assert stated.preset.overridden["fp8_recipe"] == ("rowwise", "current")


def test_megatron_exports_pass_the_recipe_and_refuse_one_megatron_lacks():
    assert "--fp8-format hybrid --fp8-recipe tensorwise" in " ".join(render("megatron", job("current")).split())
    mx = " ".join(render("megatron", job("mxfp8", cluster="dgx-b200")).split())
    assert "--fp8-format e4m3 --fp8-recipe mxfp8" in mx
    assert "--fp8-recipe" not in render("megatron", job())  # unstated: Megatron-LM's own default, delayed
    with pytest.raises(ConfigError, match=r"^parallel\.fp8_recipe: Megatron-LM has no rowwise"):
        render("megatron", job("rowwise"))


def test_torchtitan_exports_pass_rowwise_and_refuse_per_tensor_scaling():
    fsdp = {"framework": "fsdp", "tp": 1, "sequence_parallel": False, "zero_stage": 3}
    assert 'recipe_name="rowwise"' in render("torchtitan", job("rowwise", **fsdp))
    with pytest.raises(ConfigError, match=r"^parallel\.fp8_recipe: torchtitan's Float8LinearConverter"):
        render("torchtitan", job("delayed", **fsdp))
