"""Offload (ZeRO-Offload, ZeRO-Infinity, Megatron-Core activation offload): what leaves the GPU,
what the host must hold, what the copies and the CPU step cost, and which plans the frameworks
refuse."""

import json

import pytest
from pydantic import ValidationError

from paraplan import predict
from paraplan.catalog import resolve_job
from paraplan.export.deepspeed import render_deepspeed
from paraplan.export.megatron import render_megatron
from paraplan.export.torchtitan import torchtitan_config
from paraplan.inventory import count_job
from paraplan.inventory.job import adam_state_bytes
from paraplan.prediction.memory import activations_per_microbatch, estimate_memory
from paraplan.prediction.offload import FALLBACK_CPU_ADAM_PARAMS_PER_S, HOST_GRAD_BYTES
from paraplan.specs import ConfigError, ParallelPlan


def job(cluster="dgx-h100", **parallel):
    plan = {"micro_batch_size": 1, "global_batch_size": 64, **parallel}
    return resolve_job({"model": "gpt3-1.3b", "cluster": cluster, "parallel": plan, "precision": "bf16"})


def test_offloading_the_optimizer_frees_exactly_its_states_and_puts_them_and_fp32_gradients_on_the_host():
    on = job(zero_stage=2, framework="deepspeed", offload_optimizer="cpu")
    off = job(zero_stage=2, framework="deepspeed")
    m_on, m_off = estimate_memory(count_job(on))[0], estimate_memory(count_job(off))[0]
    assert m_on.optimizer_states == 0.0
    # ZeRO-2 offload keeps the gradient partition on the host too (the GPU: only its buckets)
    assert m_on.gradients == 0.0
    assert m_off.total - m_on.total == pytest.approx(m_off.optimizer_states + m_off.gradients)
    shard = count_job(on).stages[0].params / 8
    assert m_on.host == pytest.approx(shard * (adam_state_bytes(on.precision) + HOST_GRAD_BYTES))
    assert m_off.host == 0.0


def test_zero_1_optimizer_offload_keeps_the_gradient_buffer_on_the_gpu():
    on = job(zero_stage=1, framework="megatron", offload_optimizer="cpu")
    off = job(zero_stage=1, framework="megatron")
    assert estimate_memory(count_job(on))[0].gradients == estimate_memory(count_job(off))[0].gradients > 0


def test_offloading_zero3_parameters_frees_exactly_the_parameter_shard():
    both = job(zero_stage=3, framework="deepspeed", offload_optimizer="cpu", offload_param="cpu")
    opt = job(zero_stage=3, framework="deepspeed", offload_optimizer="cpu")
    m_both, m_opt = estimate_memory(count_job(both))[0], estimate_memory(count_job(opt))[0]
    assert m_both.weights == 0.0
    assert m_opt.total - m_both.total == pytest.approx(m_opt.weights)
    assert m_both.host - m_opt.host == pytest.approx(m_opt.weights)


def test_offloading_k_of_n_layers_activations_frees_k_over_n_of_the_held_activations():
    on = job(cluster="vista-gh200", zero_stage=1, global_batch_size=8, cpu_offloading=True, cpu_offloading_num_layers=6)
    inv = count_job(on)
    held, _ = activations_per_microbatch(inv, inv.stages[0])
    off = job(cluster="vista-gh200", zero_stage=1, global_batch_size=8)
    m_on, m_off = estimate_memory(inv)[0], estimate_memory(count_job(off))[0]
    assert m_off.activations - m_on.activations == pytest.approx(held * 6 / 24)
    assert m_on.host == pytest.approx(held * 6 / 24)


def test_the_optimizer_step_on_the_cpu_takes_the_nodes_adam_time_plus_the_parameter_copy_back():
    j = job(zero_stage=1, offload_optimizer="cpu")
    inv = count_job(j)
    shard = inv.stages[0].params / 8
    link = j.cluster.host_link.p2p_bytes_per_s
    expected = shard * 8 / FALLBACK_CPU_ADAM_PARAMS_PER_S + shard * inv.param_bytes / link
    assert predict(j).stages[0].optimizer_s == pytest.approx(expected)


def test_offload_makes_the_iteration_longer_by_the_cpu_step_and_the_exposed_copies():
    base, on = predict(job(zero_stage=1)), predict(job(zero_stage=1, offload_optimizer="cpu"))
    extra = on.iteration_s - base.iteration_s
    st_on, st_off = on.stages[0], base.stages[0]
    expected = (st_on.optimizer_s - st_off.optimizer_s) + 32 * st_on.offload_mb_s  # 32 micro-batches
    assert extra == pytest.approx(expected, rel=1e-6)
    assert extra > 0


def test_a_slow_host_link_leaves_activation_copies_exposed_and_a_fast_one_hides_them():
    slow = {"name": "dgx-h100", "host_link": {"bandwidth": "1 GB/s", "latency": "10 us"}}
    plan = dict(zero_stage=1, global_batch_size=8, cpu_offloading=True, cpu_offloading_num_layers=12)
    assert predict(job(cluster=slow, **plan)).stages[0].offload_mb_s > 0
    assert predict(job(cluster="vista-gh200", **plan)).stages[0].offload_mb_s == 0.0


def test_a_prediction_says_which_host_data_it_assumed():
    notes = " ".join(predict(job(zero_stage=1, offload_optimizer="cpu")).uncalibrated)
    assert "CPU-Adam" in notes
    plain = " ".join(predict(job(zero_stage=1)).uncalibrated)
    assert "CPU-Adam" not in plain and "host" not in plain


def test_a_plan_needing_more_host_memory_than_the_node_has_is_flagged():
    small = {"name": "dgx-h100", "host": {"memory": "1 GB"}}
    notes = " ".join(predict(job(cluster=small, zero_stage=1, offload_optimizer="cpu")).uncalibrated)
    assert "does not fit on the host" in notes


def test_nvme_offload_without_a_catalog_nvme_bandwidth_fails_naming_the_field():
    with pytest.raises(ConfigError, match=r"cluster\.host\.nvme_bandwidth"):
        predict(job(zero_stage=3, framework="deepspeed", offload_optimizer="nvme"))


def test_a_search_trying_nvme_offload_on_a_cluster_without_its_bandwidth_fails_in_one_line_naming_the_field():
    """It was a traceback (a ValueError from the screen's cost tables)."""
    from typer.testing import CliRunner

    from paraplan.cli.app import app

    result = CliRunner().invoke(app, ["search", "--model", "gpt3-1.3b", "--cluster", "dgx-h100", "--framework",
                                      "deepspeed", "--zero", "3", "--offload", "none,nvme", "--mbs", "1"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "cluster.host.nvme_bandwidth" in lines[0], result.output


@pytest.mark.parametrize(("plan", "field"), [
    (dict(offload_param="cpu", zero_stage=2, framework="deepspeed"), "parallel.offload_param"),
    (dict(offload_optimizer="cpu", zero_stage=0, framework="deepspeed"), "parallel.offload_optimizer"),
    (dict(offload_optimizer="nvme", zero_stage=2, framework="deepspeed"), "parallel.offload_optimizer"),
    (dict(offload_param="cpu", zero_stage=3), "parallel.offload_param"),
    (dict(offload_optimizer="cpu", zero_stage=2), "parallel.offload_optimizer"),
    (dict(offload_optimizer="cpu", zero_stage=3, framework="fsdp"), "parallel.offload_optimizer"),
    (dict(cpu_offloading=True, cpu_offloading_num_layers=2, pp=2), "parallel.cpu_offloading"),
    (dict(cpu_offloading=True, cpu_offloading_num_layers=2, recompute="full"), "parallel.cpu_offloading"),
    (dict(cpu_offloading=True, cpu_offloading_num_layers=2, framework="deepspeed"), "parallel.cpu_offloading"),
    (dict(cpu_offloading=True), "parallel.cpu_offloading_num_layers"),
    (dict(cpu_offloading_num_layers=2), "parallel.cpu_offloading_num_layers"),
])
def test_offload_a_framework_does_not_support_fails_in_one_line_naming_the_field(plan, field):
    with pytest.raises(ValidationError) as err:
        ParallelPlan(**plan)
    message = err.value.errors()[0]["msg"]
    assert field in message and "\n" not in message


def test_offloading_every_layers_activations_is_refused_as_megatron_core_does():
    with pytest.raises(ConfigError, match="cpu_offloading_num_layers: 24 must be less than num_layers=24"):
        job(zero_stage=1, cpu_offloading=True, cpu_offloading_num_layers=24)


def test_deepspeed_export_offloads_as_the_plan_says():
    cfg = json.loads(render_deepspeed(job(zero_stage=3, framework="deepspeed", offload_optimizer="cpu",
                                          offload_param="cpu")))
    zero = cfg["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert "offload_optimizer" not in json.loads(render_deepspeed(job(zero_stage=3, framework="deepspeed")))[
        "zero_optimization"]


def test_megatron_export_offloads_the_optimizer_and_refuses_activation_offload():
    assert "--optimizer-cpu-offload" in render_megatron(job(zero_stage=1, offload_optimizer="cpu"))
    assert "--optimizer-cpu-offload" not in render_megatron(job(zero_stage=1))
    with pytest.raises(ConfigError, match=r"parallel\.cpu_offloading"):
        render_megatron(job(zero_stage=1, cpu_offloading=True, cpu_offloading_num_layers=4))


def test_megatron_export_refuses_a_deepspeed_plans_parameter_offload():
    with pytest.raises(ConfigError, match=r"parallel\.offload_param"):
        render_megatron(job(zero_stage=3, framework="deepspeed", offload_optimizer="cpu", offload_param="cpu"))


def test_torchtitan_export_turns_on_fsdp_cpu_offload():
    on = job(zero_stage=3, framework="fsdp", offload_optimizer="cpu", offload_param="cpu")
    assert torchtitan_config(on)["training"]["enable_cpu_offload"] is True
    assert "enable_cpu_offload" not in torchtitan_config(job(zero_stage=3, framework="fsdp"))["training"]


def test_a_saved_job_keeps_its_offload():
    from paraplan.catalog.jobfile import job_mapping

    j = job(zero_stage=3, framework="deepspeed", offload_optimizer="cpu", offload_param="cpu")
    again = resolve_job(job_mapping(j))
    assert (again.parallel.offload_optimizer, again.parallel.offload_param) == ("cpu", "cpu")


def test_the_search_tries_optimizer_offload_on_and_off_and_the_screen_agrees_with_predict():
    from paraplan.catalog import load_cluster, load_model
    from paraplan.search import SearchSpace
    from paraplan.search.screen import screen_plans

    space = SearchSpace(tp=(1,), pp=(1,), zero_stage=(1, 2), micro_batch_size=(1,), framework="deepspeed",
                        offload_optimizer=("none", "cpu"))
    screen = screen_plans(load_model("gpt3-1.3b"), load_cluster("dgx-h100"), 64, space=space)
    devices = [screen.job(i).parallel.offload_optimizer for i in range(len(screen))]
    assert sorted(set(devices)) == ["cpu", "none"]
    for i in range(len(screen)):
        pred = predict(screen.job(i))
        assert screen.iteration_s[i] == pytest.approx(pred.iteration_s, rel=1e-6)
        assert screen.memory_bytes[i] == pytest.approx(max(m.total for m in pred.memory), rel=1e-12)


def test_an_offload_device_the_search_does_not_know_fails_naming_the_axis():
    from paraplan.search import SearchSpace

    with pytest.raises(ConfigError, match="offload_optimizer: 'disk'"):
        SearchSpace(offload_optimizer=("none", "disk"))
