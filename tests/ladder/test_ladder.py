"""Every rung trains to >= 95% on the embedded MNIST, with its real launcher.

The two single-device rungs train there for real.  A data- or model-parallel rung whose step equals the
single device's to float round-off (tests/ladder/test_equivalence.py: DDP, Horovod with either framework and
Keras' fit, DeepSpeed ZeRO 0-3, FSDP2, the pipeline) computes the same parameters, step after step, so it lands
at the same accuracy: training it again for three epochs would only repeat that run.  What changes the
arithmetic runs to 95% itself here: Horovod's fp16 all-reduce, Adasum, ZeRO-3 with both offloads, and the
tensor-parallel rungs (their own task)."""
import difflib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PROBES, ROOT, reports, run, tool
from scaledl.hpc import launchers

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
@pytest.mark.parametrize("launcher, options", [("mpirun", ["--fp16-allreduce", "--precision", "bf16"]),
                                               ("mpirun", ["--adasum"])])
def test_horovod_torch_reaches_95_percent_with_ranks_in_sync(tmp_path, launcher, options):
    summary = train(launcher, "horovod_torch", tmp_path, *options)
    assert summary["world_size"] == 2 and summary["test_accuracy"] >= 0.95
    assert summary["params_in_sync"] is True


@pytest.mark.parametrize("flags, named", [(["--precision", "fp16"], "bf16"), (["--on-nonfinite", "skip"], "stop")])
def test_adasum_refuses_what_its_hooks_cannot_undo_before_anything_starts(tmp_path, flags, named):
    # Adasum's optimizer steps inside backward's hooks: on gradients fp16 has not unscaled yet, and
    # before the non-finite check could skip the step (the parameters then hold the local update).
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "scaledl.ladder.horovod_torch", "--adasum", *flags,
                             "--out-dir", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and not out.exists()
    assert result.stderr.strip().count("\n") == 0 and "--adasum" in result.stderr and named in result.stderr


@pytest.mark.slow
def test_single_tf_reaches_95_percent(tmp_path):
    summary = train("python", "single_tf", tmp_path, nproc=1)
    assert summary["world_size"] == 1 and summary["test_accuracy"] >= 0.95


@pytest.mark.slow
@pytest.mark.parametrize("launcher, options", [("torchrun", ["--zero-stage", "3", "--offload-optimizer",
                                                             "--offload-params"])])
def test_deepspeed_reaches_95_percent_with_ranks_in_sync(tmp_path, launcher, options):
    summary = train(launcher, "deepspeed", tmp_path, *options)
    assert summary["world_size"] == 2 and summary["test_accuracy"] >= 0.95
    assert summary["params_in_sync"] is True and summary["zero_stage"] == int(options[1])


TRANSFORMER = ["--width", "64", "--depth", "2", "--heads", "4", "--seq-len", "32"]


@pytest.mark.slow
@pytest.mark.parametrize("rung, nproc, options", [("tensor_parallel", 2, []), ("fsdp_tp", 4, ["--tp", "2"])])
def test_tensor_parallel_rungs_learn_the_token_task_with_ranks_in_sync(tmp_path, rung, nproc, options):
    summary = train("torchrun", rung, tmp_path, *TRANSFORMER, "--epochs", "2", "--train-limit", "4096", *options,
                    nproc=nproc)
    assert summary["world_size"] == nproc and summary["test_accuracy"] >= 0.9  # chance: 0.1
    assert summary["params_in_sync"] is True  # the whole tensors every rank gathers are the same


@pytest.mark.slow
def test_params_in_sync_detects_a_difference():
    found = reports(run([tool("torchrun"), "--standalone", "--nproc_per_node=2", str(PROBES / "sync_probe.py")]).stdout)
    assert [(r["same"], r["after_change"]) for r in found] == [(True, False), (True, False)]


MARK = "# New Code #"


def changed_lines(base: str, rung: str, docstring: bool = True) -> list[str]:
    """`diff base.py rung.py` as unified-diff lines (+ added, - removed), no context, no headers;
    without the module docstrings' lines when `docstring` is False."""
    old, new = ((LADDER / f"{name}.py").read_text().splitlines() for name in (base, rung))
    skip_old, skip_new = (set() if docstring else set(range(_docstring_end(lines))) for lines in (old, new))
    found = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag != "equal":
            found += ["-" + old[i] for i in range(i1, i2) if i not in skip_old]
            found += ["+" + new[j] for j in range(j1, j2) if j not in skip_new]
    return found


def _docstring_end(lines: list[str]) -> int:
    """The index of the line after the module docstring."""
    return next(i for i, line in enumerate(lines) if i > 0 and line.rstrip().endswith('"""')) + 1


def unmarked(diff: list[str]) -> list[str]:
    """Added lines that are neither marked nor covered by a marked line, checked line by line.

    A marked line covers the lines that continue it: its body or continuation lines (indented
    deeper), and, when it is a comment (`# New Code #: ...` above a block), the lines after it at
    its own indentation up to a blank line.  `RUNG = ...` is exempt, and the module docstring
    (which names the rung) is left out by `changed_lines(..., docstring=False)`.  Removed lines
    need no mark: they are the base's."""
    found, cover = [], None  # cover: (indentation, comment) of the marked line in force
    for line in diff:
        if not line.startswith("+"):
            cover = None  # a run of added lines ends at a removed line
            continue
        text = line[1:]
        indent = len(text) - len(text.lstrip())
        if MARK in text:
            cover = (indent, text.lstrip().startswith("#"))
        elif not text.strip():
            cover = None
        elif cover and (indent > cover[0] or (cover[1] and indent == cover[0])):
            pass
        elif not text.startswith("RUNG = "):
            found.append(text)
            cover = None
    return found


# The limits are what each framework needs: what a learner reads in `diff base.py rung.py`
# (docstring included).  single_torch -> ddp is the ddp-tutorial-series' 40 lines, and one more: the
# all-reduce left out of a micro batch's backward that is not the step's last (--grad-accum); Horovod and
# DeepSpeed have a few lines more for it too (backward_passes_per_step, the engine's own micro batch count),
# and Horovod one to refuse ranks it cannot join (torchrun's); DeepSpeed 13 for its own activation checkpointing
# (the config's section, checkpointing.configure, the blocks' checkpoint, --offload-activations).
@pytest.mark.parametrize("base, rung, limit", [("single_torch", "ddp", 41), ("single_torch", "horovod_torch", 72),
                                               ("single_tf", "horovod_tf", 100), ("ddp", "deepspeed", 120),
                                               ("ddp", "fsdp", 30), ("single_torch", "tensor_parallel", 76),
                                               ("fsdp", "fsdp_tp", 52)])
def test_each_rung_is_a_small_marked_diff_of_the_one_before(base, rung, limit):
    diff = changed_lines(base, rung)
    assert len(diff) <= limit, "\n".join(diff)
    missing = unmarked(changed_lines(base, rung, docstring=False))
    assert not missing, f"lines {rung}.py adds to {base}.py without a {MARK} marker:\n" + "\n".join(missing)


def test_the_marker_check_catches_an_unmarked_line():
    """The check above fails on what it must catch: an unmarked added line, even right after a
    marked block, and a change hidden in a hunk whose only marker is on a removed line."""
    assert unmarked(["+    dist.init_process_group()  # New Code #", "+    model.half()"]) == ["    model.half()"]
    assert unmarked(["-    run(x)  # New Code #", "+    run(y)"]) == ["    run(y)"]
    assert unmarked(["+    # New Code #: two calls", "+    a()", "+    b()", "+", "+    c()"]) == ["    c()"]
    assert unmarked(["+    if ok:  # New Code #", "+        step()", "+    other()"]) == ["    other()"]
    assert not unmarked(['+RUNG = "ddp"', "+", "-    old()  # New Code #"])


def test_the_single_device_rung_has_no_distributed_code():
    text = (LADDER / "single_torch.py").read_text()
    for word in ("torch.distributed", "DistributedSampler", "init_process_group", "distributed.", "rank"):
        assert word not in text, word


@pytest.mark.parametrize("base, rung, calls", [
    ("single_torch", "tensor_parallel", ("init_process_group(", "init_device_mesh(", "ColwiseParallel()",
                                         "RowwiseParallel()", "parallelize_module(model, mesh", "FullState(",
                                         "destroy_process_group()")),
    ("fsdp", "fsdp_tp", ('mesh_dim_names=("dp", "tp")',
                         'tensor_parallel.wrap(model, device, mesh["tp"], sequence_parallel)',
                         'fully_shard(layer, mesh=mesh["dp"]', "DistributedSampler(train_set, dp_size, dp_rank",
                         "replicas=dp_size"))])
def test_the_tensor_parallel_rungs_show_what_they_need(base, rung, calls):
    added = "\n".join(line for line in changed_lines(base, rung) if line.startswith("+"))
    for call in calls:
        assert call in added, call


def test_the_ddp_rung_shows_what_ddp_needs():
    """What the ddp-tutorial-series' multigpu.py adds to single_gpu.py is written in the DDP rung."""
    added = "\n".join(line for line in changed_lines("single_torch", "ddp") if line.startswith("+"))
    for call in ("init_process_group(", "set_device_index(", "DistributedSampler(", "set_epoch(", "DDP(model",
                 "device_ids=", ".module", "destroy_process_group()", "rank == 0"):
        assert call in added, call



@pytest.mark.slow
@pytest.mark.parametrize("rung", ["horovod_torch", "horovod_tf"])
def test_a_horovod_rung_under_torchrun_stops_instead_of_training_alone_on_each_rank(tmp_path, rung):
    """torchrun (what `scaledl launch` starts on a laptop) starts 2 processes that Horovod cannot join:
    each hvd.init() makes a job of one, and both would train alone into the same directory.  The rung
    compares the two and stops; `scaledl launch` names the first rank's line last (under a bare
    torchrun the first rank to stop can take the other down before it prints)."""
    out = tmp_path / "run"
    result = subprocess.run([tool("scaledl"), "launch", "-n", "2", "--", f"scaledl.ladder.{rung}", "--epochs", "1",
                             "--out-dir", str(out)], capture_output=True, text=True, timeout=300,
                            env=launchers.local_env(2))
    assert result.returncode != 0 and not out.exists()
    assert "error: Horovod sees 1 rank but torchrun started 2: start the Horovod rungs with horovodrun" \
        in result.stderr, result.stderr[-2000:]
