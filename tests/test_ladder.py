"""Every rung trains for real to >= 95% on the embedded MNIST, with its real launcher."""
import difflib
import json
from pathlib import Path

import pytest
import torch

from conftest import PROBES, ROOT, reports, run, tool
from scaledl import launchers

LADDER = ROOT / "src" / "scaledl" / "ladder"


def train(launcher, rung, out_dir, *args, nproc=2):
    command = launchers.for_launcher(launcher, nproc, f"scaledl.ladder.{rung}", ["--out-dir", str(out_dir), *args])
    output = run(command, timeout=600, nproc=nproc).stdout
    summary = json.loads((Path(out_dir) / "summary.json").read_text())
    assert f"summary rung={rung} world_size={summary['world_size']}" in output
    return summary


@pytest.mark.slow
def test_single_torch_reaches_95_percent(tmp_path):
    summary = train("python", "single_torch", tmp_path, nproc=1)
    assert summary["world_size"] == 1 and summary["test_accuracy"] >= 0.95
    assert summary["samples_per_s"] > 0 and summary["memory_bytes_per_rank"] > 0
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["type"] == "config" and lines[-1]["type"] == "summary"


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])
def test_ddp_reaches_95_percent_with_ranks_in_sync(tmp_path, launcher):
    summary = train(launcher, "ddp", tmp_path)
    assert summary["world_size"] == 2 and summary["test_accuracy"] >= 0.95
    assert summary["params_in_sync"] is True


@pytest.mark.slow
@pytest.mark.parametrize("launcher, options", [("horovodrun", []), ("mpirun", ["--fp16-allreduce", "--precision", "bf16"])])
def test_horovod_torch_reaches_95_percent_with_ranks_in_sync(tmp_path, launcher, options):
    summary = train(launcher, "horovod_torch", tmp_path, *options)
    assert summary["world_size"] == 2 and summary["test_accuracy"] >= 0.95
    assert summary["params_in_sync"] is True


@pytest.mark.slow
def test_single_tf_reaches_95_percent(tmp_path):
    summary = train("python", "single_tf", tmp_path, nproc=1)
    assert summary["world_size"] == 1 and summary["test_accuracy"] >= 0.95


@pytest.mark.slow
@pytest.mark.parametrize("launcher, options", [("horovodrun", []), ("mpirun", ["--keras-fit"])])
def test_horovod_tf_reaches_95_percent_with_ranks_in_sync(tmp_path, launcher, options):
    summary = train(launcher, "horovod_tf", tmp_path, *options)
    assert summary["world_size"] == 2 and summary["test_accuracy"] >= 0.95
    assert summary["params_in_sync"] is True


@pytest.mark.slow
@pytest.mark.parametrize("launcher, options", [("deepspeed", ["--zero-stage", "2"]),
                                               ("torchrun", ["--zero-stage", "3", "--offload-optimizer", "--offload-params"])])
def test_deepspeed_reaches_95_percent_with_ranks_in_sync(tmp_path, launcher, options):
    summary = train(launcher, "deepspeed", tmp_path, *options)
    assert summary["world_size"] == 2 and summary["test_accuracy"] >= 0.95
    assert summary["params_in_sync"] is True and summary["zero_stage"] == int(options[1])


@pytest.mark.slow
def test_fsdp_reaches_95_percent_with_ranks_in_sync(tmp_path):
    summary = train("torchrun", "fsdp", tmp_path)
    assert summary["world_size"] == 2 and summary["test_accuracy"] >= 0.95
    assert summary["params_in_sync"] is True


@pytest.mark.slow
def test_pipeline_reaches_95_percent_with_the_model_split(tmp_path):
    summary = train("torchrun", "pipeline", tmp_path)
    assert summary["world_size"] == 2 and summary["test_accuracy"] >= 0.95
    whole = sum(t.numel() * t.element_size() for t in torch.load(tmp_path / "model.pt", weights_only=True).values())
    assert 0 < summary["stage_param_bytes"] < whole  # rank 0 holds only its stage


@pytest.mark.slow
def test_params_in_sync_detects_a_difference():
    found = reports(run([tool("torchrun"), "--standalone", "--nproc_per_node=2", str(PROBES / "sync_probe.py")]).stdout)
    assert [(r["same"], r["after_change"]) for r in found] == [(True, False), (True, False)]


def code_lines(path):
    """The rung's lines after its module docstring."""
    text = path.read_text()
    return text[text.index('"""', 3) + 3:].splitlines()


# The limits are what each framework needs, kept from growing; horovod_tf carries two APIs
# (DistributedGradientTape and Keras' model.fit), deepspeed builds its JSON config from the flags.
@pytest.mark.parametrize("base, rung, limit", [("single_torch", "ddp", 40), ("single_torch", "horovod_torch", 48),
                                               ("single_tf", "horovod_tf", 80), ("ddp", "deepspeed", 100),
                                               ("ddp", "fsdp", 40)])
def test_each_rung_is_a_small_marked_diff_of_the_one_before(base, rung, limit):
    diff = list(difflib.unified_diff(code_lines(LADDER / f"{base}.py"), code_lines(LADDER / f"{rung}.py"),
                                     lineterm="", n=0))[2:]
    changed = [line for line in diff if line[:1] in "+-"]
    assert len(changed) <= limit, "\n".join(diff)
    hunks = "\n".join(diff).split("\n@@")
    # Every change a learner sees is marked, so they can find what the framework needs.
    unmarked = [hunk for hunk in hunks if "+" in hunk and "# New Code #" not in hunk and "RUNG =" not in hunk]
    assert not unmarked, "hunks without a # New Code # marker:\n" + "\n---\n".join(unmarked)
