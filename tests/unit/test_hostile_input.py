"""Hostile input at the edge (issue 15 parts 1, 4, 5): every bad job file or mapping ends in a
short one-line ConfigError naming the field, quickly, and nothing is silently coerced."""

import json

import pytest

from paraplan.catalog import load_job, resolve_job
from paraplan.catalog.hf import model_from_hf_config
from paraplan.catalog.jobs import read_job_mapping
from paraplan.catalog.userdata import MAX_DEPTH, MAX_VALUES, load_json, load_yaml
from paraplan.specs import ConfigError
from timing import assert_no_slower

BASE = {"model": "gpt2", "cluster": "dgx-a100", "parallel": {"tp": 2}}


def bomb(levels: int = 9, width: int = 9) -> str:
    """A flow sequence whose anchors each alias the previous one ``width`` times: about 300
    bytes that expand to width**levels values."""
    names = "abcdefghijklmnopqrstuvwxyz"
    parts = [f"&{names[0]} [" + ",".join("x" * width) + "]"]
    for level in range(1, levels):
        parts.append(f"&{names[level]} [" + ",".join([f"*{names[level - 1]}"] * width) + "]")
    return "[" + ", ".join(parts) + "]"


def error_of(raw) -> str:
    with pytest.raises(ConfigError) as info:
        resolve_job(raw)
    return one_line(info.value)


def file_error(tmp_path, text: str, name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_job(path)
    return one_line(info.value)


def refused_or_loaded(tmp_path, text: str) -> None:
    """Read ``text`` as a job file, whether or not it is valid (a reference for timing)."""
    path = tmp_path / "reference.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        load_job(path)
    except ConfigError:
        pass


def one_line(err: Exception) -> str:
    message = str(err)
    assert "\n" not in message
    assert len(message) < 300, message[:400]
    return message


# --- part 1: alias bombs and what an error echoes ---------------------------------------------


@pytest.mark.parametrize("field", [
    "parallel:\n  tp: {bomb}", "name: {bomb}", "model: {bomb}", "train_tokens: {bomb}", "precision: {bomb}",
    "cluster: {{gpu: {{name: x, peak_flops: {{bf16: 1e15}}, hbm_bandwidth: 1e12, hbm_bytes: {bomb}}}}}",
])
def test_a_yaml_alias_bomb_is_refused_quickly_with_one_line(tmp_path, field):
    text = "model: gpt2\ncluster: dgx-a100\n" if not field.startswith(("model", "cluster")) else ""
    text += "cluster: dgx-a100\n" if field.startswith("model") else ""
    text += "model: gpt2\n" if field.startswith("cluster") else ""
    text += field.format(bomb=bomb()) + "\n"
    assert len(text) < 400
    message = file_error(tmp_path, text)
    assert "alias" in message and f"{MAX_VALUES:,}" in message
    # quickly: no slower than the same file with a two-item list in place of the bomb (expanding
    # the bomb's 387 million values would take minutes)
    sane = text.replace(bomb(), "[x, x]")
    assert_no_slower(lambda: file_error(tmp_path, text), lambda: refused_or_loaded(tmp_path, sane), factor=10)


def test_anchors_and_aliases_of_a_sane_size_still_load():
    data = load_yaml("a: &gpu {name: x, hbm_bytes: 80 GB}\nb: [*gpu, *gpu]\n", "f.yaml")
    assert data["b"][0] == data["b"][1] == {"name": "x", "hbm_bytes": "80 GB"}


def test_a_self_referencing_alias_is_refused():
    with pytest.raises(ConfigError, match="refers to itself"):
        load_yaml("a: &a [1, *a]\n", "f.yaml")


def test_an_error_echoes_a_short_repr_of_a_large_value():
    message = error_of({**BASE, "parallel": {"tp": list(range(100_000))}})
    assert message.startswith("parallel.tensor_model_parallel_size: ") or message.startswith("parallel.tp: ")
    assert "..." in message


def test_a_huge_unit_string_is_echoed_short():
    gpu = {"name": "x", "peak_flops": {"bf16": 1e15}, "hbm_bandwidth": 1e12, "hbm_bytes": "9" * 50_000 + " XB"}
    message = error_of({"model": "gpt2", "cluster": {"gpu": gpu, "gpus_per_node": 1}})
    assert message.startswith("cluster.gpu.hbm_bytes")
    # quickly: no slower than refusing a five-digit one (a parse quadratic in the digits is 10^4 x)
    short = {**gpu, "hbm_bytes": "99999 XB"}
    assert_no_slower(lambda: error_of({"model": "gpt2", "cluster": {"gpu": gpu, "gpus_per_node": 1}}),
                     lambda: error_of({"model": "gpt2", "cluster": {"gpu": short, "gpus_per_node": 1}}), factor=10)


def test_an_unknown_catalog_name_of_a_megabyte_is_echoed_short():
    assert error_of({"model": "m" * 1_000_000, "cluster": "dgx-a100"}).startswith("model: unknown model")


# --- part 4: tracebacks instead of exit 2 -------------------------------------------------------


@pytest.mark.parametrize("cluster", [3, ["a", "b"], None, True, 2.5])
def test_a_cluster_that_is_neither_a_name_nor_a_mapping_is_a_config_error(cluster):
    assert error_of({"model": "gpt2", "cluster": cluster}).startswith("cluster: expected")


@pytest.mark.parametrize("cluster", [{"name": "dgx-a100", 3: 4}, {"node_groups": [{"name": "dgx-a100", 3: 4}]}])
def test_a_cluster_key_that_is_not_a_string_is_a_config_error(cluster):
    assert error_of({"model": "gpt2", "cluster": cluster}).startswith("cluster")


@pytest.mark.parametrize("name", ["job.yaml", "job.json"])
def test_a_document_nested_two_thousand_deep_is_refused(tmp_path, name):
    """One line naming the file. The reason is paraplan's limit, or PyYAML's own when its parser
    refuses the depth first (PyYAML 6.0.4's libyaml: "exceeded maximum nesting depth"): the
    wording is the parser's, so only the file and the one line are asserted here."""
    deep = "[" * 2000 + "]" * 2000
    text = f'{{"model": "gpt2", "cluster": "dgx-a100", "name": {deep}}}'
    message = file_error(tmp_path, text, name)
    assert message.startswith(f"{tmp_path / name}: ")


@pytest.mark.parametrize("name", ["job.yaml", "job.json"])
def test_a_document_nested_one_level_past_the_limit_is_refused_naming_the_limit(tmp_path, name):
    deep = "[" * MAX_DEPTH + "]" * MAX_DEPTH  # the job mapping is one more level
    text = f'{{"model": "gpt2", "cluster": "dgx-a100", "name": {deep}}}'
    message = file_error(tmp_path, text, name)
    assert message.startswith(f"{tmp_path / name}: nested more than {MAX_DEPTH} levels deep")


def test_a_yaml_document_nested_within_the_limit_loads():
    assert load_yaml("a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1), "f.yaml")["a"] is not None


def test_an_integer_of_ten_thousand_digits_is_a_config_error(tmp_path):
    for name in ("job.yaml", "job.json"):
        message = file_error(tmp_path, '{"model": "gpt2", "cluster": "dgx-a100", "train_tokens": ' + "9" * 10_000 + "}",
                             name)
        assert message.startswith(str(tmp_path / name))


def test_an_hf_config_nested_too_deeply_is_a_config_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"a": ' + "[" * 5000 + "]" * 5000 + "}", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^model\.hf_config: .*nested"):
        model_from_hf_config(path, {})


# --- part 5: silent coercions ------------------------------------------------------------------


@pytest.mark.parametrize(("where", "value", "shown"), [
    ({"parallel": {"tp": True}}, True, "True"),
    ({"parallel": {"tp": "2"}}, "2", "'2'"),
    ({"parallel": {"tp": 2.0}}, 2.0, "2.0"),
    ({"parallel": {"micro_batch_size": 1.5}}, 1.5, "1.5"),
    ({"parallel": {"zero_stage": False}}, False, "False"),
    ({"cluster": {"name": "dgx-a100", "num_nodes": True}}, True, "True"),
])
def test_an_integer_field_takes_whole_numbers_only(where, value, shown):
    message = error_of({**BASE, **where})
    field = "cluster.num_nodes" if "cluster" in where else "parallel."
    assert message.startswith(field) and "whole number" in message and shown in message


def test_an_integer_valued_float_is_refused_with_what_to_write():
    message = error_of({**BASE, "parallel": {"tp": 2.0}})
    assert message == "parallel.tp: expected a whole number, got 2.0 (write 2)"


def test_a_boolean_field_takes_true_or_false_only():
    assert error_of({**BASE, "parallel": {"sequence_parallel": 1}}).startswith("parallel.sequence_parallel: ")
    assert error_of({**BASE, "parallel": {"fsdp_version": True, "framework": "fsdp"}}).startswith(
        "parallel.fsdp_version: ")


def test_a_float_field_refuses_a_boolean_but_takes_yaml_exponents(tmp_path):
    model = {"name": "gpt2", "rotary_percent": True, "position_embedding": "rotary"}
    assert error_of({**BASE, "model": model}).startswith("model.rotary_percent: ")
    path = tmp_path / "job.yaml"
    path.write_text("model: {name: gpt2, position_embedding: rotary, rope_theta: 1e6}\ncluster: dgx-a100\n"
                    "train_tokens: 1e9\n", encoding="utf-8")
    job = load_job(path)  # PyYAML reads 1e6 as a string: a float field still takes it
    assert job.model.rope_theta == 1e6 and job.train_tokens == 1e9


def test_unit_strings_still_work_for_quantity_fields():
    gpu = {"name": "x", "peak_flops": {"bf16": "312 TFLOPS"}, "hbm_bandwidth": "2 TB/s", "hbm_bytes": "80 GB"}
    job = resolve_job({"model": "gpt2", "cluster": {"gpu": gpu, "gpus_per_node": 1}})
    assert job.cluster.gpu.hbm_bytes == 80e9


def test_a_stage_without_layers_is_refused():
    message = error_of({**BASE, "cluster": {"name": "dgx-a100", "num_nodes": 1},
                        "parallel": {"tp": 4, "pp": 2, "layers_per_stage": [12, 0]}})
    assert message.startswith("parallel.layers_per_stage") and ">= 1" in message and "[12, 0]" in message


def test_a_duplicate_yaml_key_names_both_lines(tmp_path):
    message = file_error(tmp_path, "model: gpt2\ncluster: dgx-a100\nparallel:\n  tp: 2\n  pp: 1\n  tp: 4\n")
    assert message.endswith("job.yaml: duplicate key 'tp' (lines 4 and 6)")


def test_a_duplicate_top_level_yaml_key_is_refused(tmp_path):
    message = file_error(tmp_path, "model: gpt2\nmodel: gpt2\ncluster: dgx-a100\n")
    assert "'model'" in message and "lines 1 and 2" in message


def test_a_duplicate_json_key_names_the_key(tmp_path):
    message = file_error(tmp_path, json.dumps(BASE)[:-1] + ', "model": "gpt2"}', "job.json")
    assert "duplicate key 'model'" in message


def test_a_yaml_merge_key_still_overrides_without_being_a_duplicate():
    data = load_yaml("base: &b {tp: 2, pp: 2}\nparallel:\n  <<: *b\n  tp: 4\n", "f.yaml")
    assert data["parallel"] == {"tp": 4, "pp": 2}


def test_read_job_mapping_and_the_json_loader_share_the_limits(tmp_path):
    with pytest.raises(ConfigError, match="duplicate key 'a'"):
        load_json('{"a": 1, "a": 2}', "f.json")
    path = tmp_path / "j.json"
    path.write_text('{"a": 1, "a": 2}', encoding="utf-8")
    with pytest.raises(ConfigError, match="duplicate key 'a'"):
        read_job_mapping(path)


def test_every_example_job_file_still_loads():
    from pathlib import Path

    examples = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        load_job(path)


@pytest.mark.parametrize("where", [{"model": {"name": "gpt2", "seq_length": 10**400}},
                                   {"cluster": {"name": "dgx-a100", "num_nodes": 10**30}},
                                   {"parallel": {"tp": 2**53 + 2}}])
def test_a_count_beyond_two_to_the_53_is_refused(where):
    message = error_of({**BASE, **where})
    assert "at most 2**53" in message


def test_a_value_too_large_to_repr_is_still_echoed_short():
    from paraplan.specs import short_repr

    assert short_repr(10**5000) == "an integer of about 5000 digits"
    assert short_repr([10**5000]) == "a list too large to show"


def test_a_yaml_syntax_error_says_what_is_wrong_and_where(tmp_path):
    message = file_error(tmp_path, "model: gpt2\ncluster: [dgx-a100\n")
    assert "not valid YAML" in message and "line 3" in message and "expected" in message
