"""docs/extending.md's recipes work as written: each is applied, step by step, to a copy of the
package (a toy GPU, a toy pipeline schedule, a toy export target), and the commands the
recipe's last step names run against that copy. The files a recipe edits are the ones its
section names, and a schedule touches ``specs/``, ``schedule/`` and ``export/`` only."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "paraplan"
DOC = (ROOT / "docs" / "extending.md").read_text()

pytestmark = pytest.mark.slow  # a copy of the package and a dozen fresh processes (~20 s)


def _section(title: str) -> str:
    return DOC.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """A copy of the package, importable ahead of the installed one."""
    src = tmp_path_factory.mktemp("toy") / "src"
    shutil.copytree(PACKAGE, src / "paraplan", ignore=shutil.ignore_patterns("__pycache__"))
    return src


def _edit(copy: Path, relative: str, old: str, new: str) -> None:
    path = copy / "paraplan" / relative
    text = path.read_text()
    assert text.count(old) == 1, f"{relative}: the recipe's anchor {old!r} is gone"
    path.write_text(text.replace(old, new))


def _paraplan(copy: Path, *args: str) -> subprocess.CompletedProcess:
    code = ("import sys, paraplan; assert paraplan.__file__.startswith(sys.argv[1]), paraplan.__file__; "
            "from paraplan.cli.app import main; sys.argv = ['paraplan', *sys.argv[2:]]; main()")
    env = {**os.environ, "PYTHONPATH": str(copy), "COLUMNS": "100"}
    done = subprocess.run([sys.executable, "-c", code, str(copy), *args], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _files_named(section: str) -> set[str]:
    return set(re.findall(r"`src/paraplan/([\w/.<>-]+)`", section))


def test_a_gpu_is_one_yaml_file_in_the_catalog(copy):
    section = _section("A GPU")
    assert "catalog/gpus/<name>.yaml" in _files_named(section)
    gpus = copy / "paraplan" / "catalog" / "gpus"
    text = (gpus / "h100-sxm5-80gb.yaml").read_text()
    # steps 1-4: name and aliases; the peaks (fp8 left out: the toy lacks it); the reference node
    text = re.sub(r"^name: .*$", "name: TOY-GPU-64GB", text, count=1, flags=re.M)
    text = re.sub(r"^aliases: .*$", "aliases: [TOY-GPU, NVIDIA TOY-GPU]", text, count=1, flags=re.M)
    text = re.sub(r"^  fp8: .*\n", "", text, count=1, flags=re.M)
    text = re.sub(r"^hbm_bytes: .*$", "hbm_bytes: 64 GiB", text, count=1, flags=re.M)
    (gpus / "toy-gpu-64gb.yaml").write_text(text)
    # step 5
    assert "TOY-GPU-64GB" in _paraplan(copy, "catalog", "gpus").stdout
    pred = json.loads(_paraplan(copy, "predict", "--gpu", "TOY-GPU", "--format", "json").stdout)
    h100 = json.loads(_paraplan(copy, "predict", "--gpu", "H100-SXM5-80GB", "--format", "json").stdout)
    assert pred["iteration_s"] == pytest.approx(h100["iteration_s"], rel=1e-12)  # the same chip, less memory
    done = subprocess.run([sys.executable, "-c", "from paraplan.cli.app import main; main()", "predict",
                           "--gpu", "TOY-GPU", "--precision", "fp8"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(copy)}, timeout=300)
    assert done.returncode == 2 and "fp8" in done.stderr and "Traceback" not in done.stderr


def test_a_pipeline_schedule_touches_specs_schedule_and_export_only(copy):
    section = _section("A pipeline schedule")
    named = _files_named(section)
    assert {"specs/enums.py", "specs/frameworks.py", "schedule/orders.py", "schedule/closed_form.py"} <= named
    assert all(name.split("/")[0] in {"specs", "schedule", "export"} for name in named)
    # step 1: the member (it runs 1F1B's order and has no property of its own)
    _edit(copy, "specs/enums.py", '    ZB_V = "zb-v"', '    ZB_V = "zb-v"\n    TOY = "toy-1f1b"')
    # step 2: torchtitan (framework fsdp) runs it
    _edit(copy, "specs/frameworks.py", "schedules=(_S.ONE_F_ONE_B, _S.INTERLEAVED, _S.GPIPE, _S.ZB_H1, _S.ZB_V),",
          "schedules=(_S.ONE_F_ONE_B, _S.INTERLEAVED, _S.GPIPE, _S.ZB_H1, _S.ZB_V, _S.TOY),")
    # step 3: nothing to add, orders.py and closed_form.py run 1F1B's order for a name they lack
    # step 4: the export's name for it
    _edit(copy, "export/torchtitan.py", 'Schedule.ZB_V: "ZBVZeroBubble"}',
          'Schedule.ZB_V: "ZBVZeroBubble", Schedule.TOY: "1F1B"}')
    # step 5
    plan = ["--framework", "fsdp", "--pp", "4", "--tp", "8", "--zero-stage", "3", "--recompute", "full",
            "--format", "json"]
    toy = json.loads(_paraplan(copy, "predict", "--schedule", "toy-1f1b", *plan).stdout)
    one = json.loads(_paraplan(copy, "predict", "--schedule", "1f1b", *plan).stdout)
    assert toy["iteration_s"] == pytest.approx(one["iteration_s"], rel=1e-12)
    found = _paraplan(copy, "search", "--framework", "fsdp", "--schedule", "toy-1f1b,1f1b", "--pp", "2,4",
                      "--global-batch-size", "32",  # torch pipelining keeps every micro-batch's logits
                      "--recompute", "full",
                      "--format", "json").stdout
    assert "toy-1f1b" in found
    job = copy / "toy-job.yaml"
    job.write_text("model: llama-3-8b\ncluster: {name: dgx-h100, num_nodes: 4}\nprecision: bf16\nparallel: {tp: 8, pp: 4, dp: 1, "
                   "framework: fsdp, zero_stage: 3, recompute: full, schedule: toy-1f1b, micro_batch_size: 1, "
                   "global_batch_size: 32}\n")
    recipe = _paraplan(copy, "export", "torchtitan", str(job)).stdout.split('"""')[-1]
    # torchtitan runs it as 1F1B, its default schedule, which the recipe does not repeat
    assert "pipeline_parallel_degree=4," in recipe and "pipeline_parallel_schedule" not in recipe


def test_no_module_outside_specs_schedule_and_export_names_a_schedule():
    """What makes the recipe above true: the rest of the package asks for properties."""
    members = "|".join(["GPIPE", "ONE_F_ONE_B", "INTERLEAVED", "ZB_H1", "ZB_V"])
    named = [f"{path.relative_to(PACKAGE)}:{n}" for path in sorted(PACKAGE.rglob("*.py"))
             if path.relative_to(PACKAGE).parts[0] not in {"specs", "schedule", "export"}
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(rf"\bSchedule\.({members})\b", line.split("#")[0]) and '"""' not in line]
    assert named == [], "modules that branch on a schedule's name: " + ", ".join(named)


def test_an_export_target_is_one_module_and_its_registration(copy):
    section = _section("An export target")
    assert {"export/<target>.py", "export/__init__.py"} <= _files_named(section)
    # step 1: the module, pure functions
    (copy / "paraplan" / "export" / "toyjson.py").write_text(
        '"""A toy target: the plan as JSON (checked against nothing: a test of docs/extending.md)."""\n\n'
        "import json\n\n\ndef render_toyjson(job, prediction=None) -> str:\n"
        "    return json.dumps(job.parallel.model_dump(mode='json'), sort_keys=True) + '\\n'\n\n\n"
        "def notes(job, prediction=None) -> list[str]:\n    return []\n")
    # step 2: registered
    _edit(copy, "export/__init__.py", "from paraplan.export import deepspeed, megatron, slurm, torchtitan",
          "from paraplan.export import deepspeed, megatron, slurm, toyjson, torchtitan")
    _edit(copy, "export/__init__.py", 'TARGETS = ("megatron", "deepspeed", "torchtitan", "slurm")',
          'TARGETS = ("megatron", "deepspeed", "torchtitan", "slurm", "toyjson")')
    _edit(copy, "export/__init__.py", '"torchtitan": torchtitan, "slurm": slurm}',
          '"torchtitan": torchtitan, "slurm": slurm, "toyjson": toyjson}')
    _edit(copy, "export/__init__.py", '"torchtitan": render_torchtitan, "slurm": render_slurm}',
          '"torchtitan": render_torchtitan, "slurm": render_slurm, "toyjson": toyjson.render_toyjson}')
    # step 3
    out = json.loads(_paraplan(copy, "export", "toyjson", str(ROOT / "examples" / "mistral-7b-one-node.yaml")).stdout)
    assert out["data_parallel_size"] == 8 and out["zero_stage"] == 3 and "schedule" in out
