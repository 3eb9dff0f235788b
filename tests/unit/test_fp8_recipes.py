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


def test_a_recipe_without_fp8_precision_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^parallel\.fp8_recipe: current is an FP8 recipe.*bf16") as err:
        job("current", precision="bf16")
    assert "\n" not in str(err.value)


def test_tensorwise_is_read_as_current_scaling():
    assert job("tensorwise").parallel.fp8_recipe is FP8Recipe.CURRENT


@pytest.mark.parametrize("cluster", ["dgx-h100", "dgx-b200"])
def test_the_more_passes_a_recipe_makes_over_its_tensors_the_slower_its_iteration(cluster):
    times = {r: predict(job(r, cluster=cluster)).iteration_s for r in ("delayed", "current", "rowwise")}
    bf16 = predict(job(precision="bf16", cluster=cluster)).iteration_s
    assert times["delayed"] < times["current"] < times["rowwise"] < bf16


def test_presets_set_their_cited_recipe_only_for_fp8_jobs_and_a_stated_one_wins():
    titan = job(framework="torchtitan-0.1", tp=1, sequence_parallel=False)
    assert titan.parallel.fp8_recipe is FP8Recipe.CURRENT
    assert titan.preset.taken["fp8_recipe"] == "current"
    assert job(framework="torchtitan", tp=1, sequence_parallel=False).preset.taken["fp8_recipe"] == "rowwise"  # 0.3
    assert "fp8_recipe" not in job(framework="torchtitan", precision="bf16", tp=1, sequence_parallel=False).preset.taken
    assert job(framework="nemo-24.07").parallel.fp8_recipe is FP8Recipe.DELAYED
    stated = job("rowwise", framework="torchtitan-0.1", tp=1, sequence_parallel=False)
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


# NVFP4 (TE NVFP4BlockScaling; arXiv 2509.25149): 0.5 byte per E2M1 value and one E4M3 scale per 16
NVFP4 = 0.5 + 1 / 16


def test_nvfp4_is_accepted_on_b200_and_gb200_and_refused_on_h100_in_one_line_naming_the_field():
    assert job("nvfp4", cluster="dgx-b200").parallel.fp8_recipe is FP8Recipe.NVFP4
    assert job("nvfp4", cluster="gb200-nvl72").parallel.fp8_recipe is FP8Recipe.NVFP4
    with pytest.raises(ConfigError, match=r"^parallel\.fp8_recipe: nvfp4 needs FP4 tensor cores.*H100") as err:
        job("nvfp4")
    assert "\n" not in str(err.value)


def test_precision_fp4_and_nvfp4_read_as_fp8_with_the_nvfp4_recipe_and_a_contradicting_recipe_is_refused():
    for spelling in ("fp4", "nvfp4"):
        spelled = job(precision=spelling, cluster="dgx-b200")
        assert spelled.precision.value == "fp8"
        assert spelled.parallel.fp8_recipe is FP8Recipe.NVFP4
    assert predict(job(precision="fp4", cluster="dgx-b200")).iteration_s == predict(
        job("nvfp4", cluster="dgx-b200")).iteration_s
    with pytest.raises(ConfigError, match=r"^parallel\.fp8_recipe: mxfp8 contradicts precision: fp4"):
        job("mxfp8", precision="fp4", cluster="dgx-b200")


def test_nvfp4_casts_read_each_tensor_three_times_and_write_two_nvfp4_copies_with_their_scales():
    ops = layer(job("nvfp4", cluster="dgx-b200"))
    plain, fed, grads = gemm_elements(ops)
    e = 2
    # amax pass (with the Hadamard-transformed amax), rowwise cast, columnwise RHT cast;
    # no norm writes the NVFP4 input (its amax comes first)
    per = 3 * e + 2 * NVFP4
    cast = ops["fp8_cast"]
    assert cast.bytes == pytest.approx((plain + fed) * per)
    assert cast.bwd_bytes == pytest.approx(grads * per)
    # the 16x16 Hadamard transform of the weight gradient's operands: 32 FLOPs per element
    assert cast.flops == pytest.approx((plain + fed) * (3 + 32))
    weights, m = ops["fp8_weight_cast"], job("nvfp4", cluster="dgx-b200").parallel.num_microbatches
    assert weights.bytes == pytest.approx((2 * e + 2 * NVFP4) * dict(weights.dims)["params"] / m, rel=1e-6)
    assert recipe_costs(FP8Recipe.NVFP4).copy_bytes == pytest.approx(2 * NVFP4)


def test_nvfp4_gemms_run_on_the_fp4_tensor_cores_reading_nvfp4_operands_and_saving_an_nvfp4_input():
    nv, delayed = layer(job("nvfp4", cluster="dgx-b200")), layer(job("delayed", cluster="dgx-b200"))
    fc, fd = nv["linear3"], delayed["linear3"]
    m, k = dict(fc.dims)["m"], dict(fc.dims)["k"]
    assert fc.fp4 and fc.fp8 and not fd.fp4
    # forward: input and weight at 0.5625 bytes per element instead of FP8's 1
    assert fd.bytes - fc.bytes == pytest.approx((1 - NVFP4) * (m * k + fc.params))
    assert fc.saved_bytes == pytest.approx(NVFP4 * fd.saved_bytes)


def test_an_nvfp4_job_is_timed_at_the_fp4_peak_and_says_its_fp4_curve_is_transferred_uncalibrated():
    from paraplan.costmodel.roofline import AnalyticalCostModel
    from paraplan.specs import Phase, Precision

    nv = job("nvfp4", cluster="dgx-b200")
    fc = layer(nv)["linear3"]
    model = AnalyticalCostModel(nv.cluster, nv.precision, sustained=False)
    fp8_twin = layer(job("delayed", cluster="dgx-b200"))["linear3"]
    # the same curve fraction at twice the peak (B200: 9 PFLOPS FP4, 4.5 FP8): a large GEMM half as long
    assert nv.cluster.gpu.flops_for(Precision.FP4) == 2 * nv.cluster.gpu.flops_for(Precision.FP8)
    ratio = model.estimate_op_s(fc, Phase.FWD) / model.estimate_op_s(fp8_twin, Phase.FWD)
    assert 0.45 < ratio < 0.75
    notes = predict(nv).uncalibrated
    assert any("fp4 gemm kernels" in n and "uncalibrated" in n for n in notes)
    assert not any("fp4" in n for n in predict(job("delayed", cluster="dgx-b200")).uncalibrated)


def test_nvfp4_is_faster_than_mxfp8_and_delayed_and_bf16_on_b200():
    times = {r: predict(job(r, cluster="dgx-b200")).iteration_s for r in ("nvfp4", "mxfp8", "delayed")}
    bf16 = predict(job(precision="bf16", cluster="dgx-b200")).iteration_s
    assert times["nvfp4"] < min(times["mxfp8"], times["delayed"]) < bf16


def test_nvfp4_exports_megatron_s_fp4_flags_and_torchtitan_refuses_it():
    nv = " ".join(render("megatron", job("nvfp4", cluster="dgx-b200")).split())
    assert "--bf16 --fp4-format e2m1 --fp4-recipe nvfp4" in nv
    assert "--fp8-format" not in nv
    fsdp = {"framework": "fsdp", "tp": 1, "sequence_parallel": False, "zero_stage": 3}
    with pytest.raises(ConfigError, match=r"^parallel\.fp8_recipe: nvfp4 is not exported to torchtitan"):
        render("torchtitan", job("nvfp4", cluster="dgx-b200", **fsdp))



def test_the_prediction_table_names_the_fp8_recipe_beside_the_precision():
    from typer.testing import CliRunner

    from paraplan.cli.app import app

    result = CliRunner().invoke(app, ["predict", "--model", "llama-3-8b", "--cluster", "dgx-b200", "--precision", "fp4",
                                      "--tp", "1", "--global-batch-size", "64"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "fp8 (nvfp4), recompute" in result.output
