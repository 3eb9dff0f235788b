"""scripts/extract_megatron_flags.py reads Megatron-LM's parser from source as Megatron-LM builds it:
literal add_argument calls, and ArgumentGroupFactory's flags from dataclass fields by its own rule
(megatron/training/argument_utils.py, _build_argparse_kwargs_from_field). Checked on a small
checkout written here, shaped like Megatron-LM's."""

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "extract_megatron_flags.py"
FIXTURE = ROOT / "tests" / "fixtures" / "megatron_flags.json"

ARGUMENTS = '''
import argparse
from megatron.core.transformer import TransformerConfig
from megatron.training.argument_utils import ArgumentGroupFactory


def add_megatron_arguments(parser):
    parser = _add_network_size_args(parser)
    parser = _add_distributed_args(parser)
    return parser


def _add_network_size_args(parser):
    exclude = ["activation_func", "init_only_field"]
    ArgumentGroupFactory(TransformerConfig, exclude=exclude).build_group(parser, "transformer")
    group = parser.add_argument_group(title="network size")
    group.add_argument("--swiglu", action="store_true", help="SwiGLU.")
    group.add_argument("--initial-loss-scale", type=float, default=2**32)
    group.add_argument("--timing-log-level", type=int, default=0, choices=range(0, 3))
    return parser


def _add_distributed_args(parser):
    from megatron.training.config import TrainingConfig

    ArgumentGroupFactory(TrainingConfig).build_group(parser, "training")
    group = parser.add_argument_group(title="distributed")
    group.add_argument("--no-overlap-p2p-communication", action="store_false", dest="overlap_p2p_comm")
    group.add_argument("--cp-comm-type", nargs="+", type=str, default=["p2p"])
    return parser


def _never_called(parser):
    parser.add_argument("--not-a-flag", type=int)
'''

CORE = '''
import enum
from dataclasses import dataclass, field
from typing import Callable, List, Literal, Optional


class AttnBackend(enum.Enum):
    flash = 1
    auto = 5


@dataclass
class ModelParallelConfig:
    tensor_model_parallel_size: int = 1
    sequence_parallel: bool = False
    perform_initialization: bool = field(default=True, metadata={"argparse_meta": {"arg_names": ["--no-initialization"]}})
'''

TRANSFORMER = '''
from dataclasses import dataclass, field
from typing import Callable, List, Literal, Optional

from ..model_parallel_config import AttnBackend, ModelParallelConfig


@dataclass
class TransformerConfig(ModelParallelConfig):
    num_layers: int = field(default=0, metadata={"argparse_meta": {"default": None}})
    """Number of layers."""
    add_bias_linear: bool = True
    apply_rope_fusion: Optional[bool] = None
    normalization: Literal["LayerNorm", "RMSNorm"] = "LayerNorm"
    recompute_modules: Optional[List[str]] = None
    attention_backend: AttnBackend = AttnBackend.auto
    activation_func: Callable = None
    init_only_field: int = 3
    computed: int = field(init=False, default=0)
    sequence_parallel: bool = True
'''

TRAINING = '''
from dataclasses import dataclass, field


@dataclass(kw_only=True)
class TrainingConfig:
    train_samples: int | None = None
    iterations_to_skip: list[int] = field(default_factory=list)
'''


def script():
    spec = importlib.util.spec_from_file_location("extract_megatron_flags", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def extract(root):
    return script().extract(root)


def checkout(tmp_path):
    files = {"megatron/training/arguments.py": ARGUMENTS, "megatron/core/model_parallel_config.py": CORE,
             "megatron/core/transformer/transformer_config.py": TRANSFORMER,
             "megatron/training/config/training_config.py": TRAINING}
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return tmp_path


def test_dataclass_fields_become_flags_by_megatrons_own_naming_rule(tmp_path):
    flags = {o: entry for entry in extract(checkout(tmp_path))["arguments"] for o in entry["options"]}
    assert flags["--tensor-model-parallel-size"]["type"] == "int"  # inherited from the base class
    # a bool defaulting to False is store_true; to True (or None) it is --no-/--disable- store_false
    # the subclass's redefinition (default True) wins: --no-sequence-parallel, no --sequence-parallel
    assert flags["--no-sequence-parallel"]["action"] == "store_false" and "--sequence-parallel" not in flags
    assert flags["--no-add-bias-linear"] is flags["--disable-add-bias-linear"]
    assert flags["--no-apply-rope-fusion"]["action"] == "store_false"  # Optional[bool] = None: None != False
    assert flags["--no-initialization"]["dest"] == "perform_initialization"  # argparse_meta's arg_names
    assert flags["--num-layers"]["default"] is None  # argparse_meta's default
    assert flags["--normalization"]["choices"] == ["LayerNorm", "RMSNorm"]
    assert (flags["--recompute-modules"]["type"], flags["--recompute-modules"]["nargs"]) == ("str", "+")
    assert flags["--attention-backend"]["choices"] == ["flash", "auto"]
    assert flags["--train-samples"]["type"] == "int" and flags["--iterations-to-skip"]["default"] == []
    for absent in ("--activation-func", "--init-only-field", "--computed", "--not-a-flag"):
        assert absent not in flags  # excluded, init=False, or in a function the parser never calls


def test_literal_add_argument_calls_keep_their_action_type_and_folded_default(tmp_path):
    table = extract(checkout(tmp_path))
    flags = {o: entry for entry in table["arguments"] for o in entry["options"]}
    assert flags["--no-overlap-p2p-communication"] == {
        "options": ["--no-overlap-p2p-communication"], "group": "_add_distributed_args", "action": "store_false",
        "dest": "overlap_p2p_comm", "default": True}
    assert flags["--swiglu"]["default"] is False and "help" not in flags["--swiglu"]
    assert flags["--initial-loss-scale"]["default"] == 2**32
    assert flags["--timing-log-level"]["choices"] == [0, 1, 2]  # range(0, 3), as argparse tests membership
    assert flags["--cp-comm-type"]["nargs"] == "+"
    assert table["unresolved"] == [] and table["conflicts"] == []
    json.dumps(table)  # the fixture is JSON


def test_the_table_names_one_commit_and_the_sha256_of_every_file_it_read(tmp_path):
    root = checkout(tmp_path)
    source = script().table_at(root, "0" * 40)["source"]
    assert source["commit"] == "0" * 40
    assert set(source["files"]) == {"megatron/training/arguments.py", "megatron/core/model_parallel_config.py",
                                    "megatron/core/transformer/transformer_config.py",
                                    "megatron/training/config/training_config.py"}
    (root / "megatron/training/config/training_config.py").write_text(TRAINING + "\n")
    changed = script().table_at(root, "0" * 40)["source"]["files"]
    assert changed["megatron/training/config/training_config.py"] != source["files"][
        "megatron/training/config/training_config.py"]


def test_the_extractor_will_not_run_without_the_commit_its_sources_come_from(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        script().main([str(checkout(tmp_path))])
    assert stop.value.code == 2 and "--commit" in capsys.readouterr().err


def test_the_fixture_is_read_from_one_pinned_commit_and_names_each_file_by_its_hash():
    table = json.loads(FIXTURE.read_text())
    source = table["source"]
    assert source["repository"] == "NVIDIA/Megatron-LM" and re.fullmatch(r"[0-9a-f]{40}", source["commit"])
    assert "megatron/training/arguments.py" in source["files"]
    assert all(re.fullmatch(r"[0-9a-f]{64}", digest) for digest in source["files"].values())
    # no other commit anywhere in the table: every file was read at the pinned one
    assert re.findall(r"\b[0-9a-f]{40}\b", FIXTURE.read_text()) == [source["commit"]]
    assert table["unresolved"] == [], "every ArgumentGroupFactory group is read"


def pinned_sources(commit):
    """The Megatron-LM files the fixture was read from: $MEGATRON_LM_SOURCE, or
    ../shared/data/megatron-lm/<commit>; the test skips where neither is present (Megatron-LM's source
    is not part of this repository)."""
    for folder in (os.environ.get("MEGATRON_LM_SOURCE"), ROOT.parent / "shared" / "data" / "megatron-lm" / commit):
        if folder and (Path(folder) / "megatron" / "training" / "arguments.py").is_file():
            return Path(folder)
    pytest.skip(f"Megatron-LM's sources at {commit[:12]} are not present ($MEGATRON_LM_SOURCE)")


def test_regenerating_the_fixture_from_the_pinned_files_gives_it_back_byte_for_byte():
    text = FIXTURE.read_text()
    source = json.loads(text)["source"]
    folder = pinned_sources(source["commit"])
    module = script()
    for path, digest in source["files"].items():  # the same files, or the comparison means nothing
        assert module.file_sha256(folder / path) == digest, path
    assert module._dumps(module.table_at(folder, source["commit"], source.get("note"))) == text
