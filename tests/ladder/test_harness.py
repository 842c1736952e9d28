"""The harness under every rung: honest flags, OUT_DIR claimed only when a run starts, bounded
checkpoints that say what wrote them, restarts that recover with or without a checkpoint."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import PROBES
from scaledl.hpc import launchers
from scaledl.ladder import harness

QUICK = ["--epochs", "1", "--train-limit", "640", "--log-interval", "5"]


def rung(name, *args, env=None, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", f"scaledl.ladder.{name}", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd)


def launch(command, env=None, timeout=300):
    full = launchers.local_env(2, {**os.environ, **(env or {})})
    full["PYTHONPATH"] = os.pathsep.join([str(PROBES), full.get("PYTHONPATH", "")])
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=full)


def one_error_line(result, *words):
    """Exit 2 and one line on stderr, the last one, naming `words`."""
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and "error:" in lines[-1], result.stderr[-2000:]
    for word in words:
        assert word in lines[-1], lines[-1]


def snapshot(path):
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_parsing_flags_touches_nothing_on_disk(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("a run\n")
    config = harness.parse_args("ddp", ["--out-dir", str(tmp_path / "new"), "--overwrite"])
    harness.parse_args("ddp", ["--out-dir", str(tmp_path), "--overwrite"])
    assert config.overwrite and not (tmp_path / "new").exists()
    assert (tmp_path / "metrics.jsonl").read_text() == "a run\n"


@pytest.mark.parametrize("name, flag", [("single_tf", "--resume"), ("single_tf", "--checkpoint-every"),
                                        ("horovod_tf", "--on-nonfinite"), ("pipeline", "--on-nonfinite"),
                                        ("pipeline", "--precision")])
def test_a_rung_refuses_the_flags_it_does_not_honour(name, flag):
    parser = harness.parser(name, without=__import__(f"scaledl.ladder.{name}", fromlist=["x"]).NOT_HONOURED)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args([flag, "1"])
    assert exit_info.value.code == 2


@pytest.mark.slow
def test_single_tf_resume_is_refused_and_the_run_kept(tmp_path, monkeypatch):
    # Run as a learner would, `python -m` in a plain shell: TensorFlow's start-up lines must not
    # come before the one error line.
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    first = rung("single_tf", *QUICK, "--out-dir", str(tmp_path))
    assert first.returncode == 0, first.stderr[-2000:]
    before = snapshot(tmp_path)
    again = rung("single_tf", *QUICK, "--out-dir", str(tmp_path), "--resume")
    one_error_line(again, "unrecognized arguments: --resume")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("args, words", [
    (["--out-dir", ""], ["--out-dir is empty"]),
    (["--out-dir", "  "], ["--out-dir is empty"]),
    (["--lr", "inf"], ["--lr must be a finite number"]),
    (["--momentum", "nan"], ["--momentum must be a finite number"]),
    (["--warmup-epochs", "inf"], ["--warmup-epochs must be a finite number"]),
    (["--keep-checkpoints", "0"], ["--keep-checkpoints must be > 0"]),
    (["--data-dir", ""], ["--data-dir is empty"]),
])
def test_bad_values_are_one_line_and_write_nothing(tmp_path, args, words):
    result = rung("single_torch", *QUICK, *(args if "--out-dir" in args else ["--out-dir", "out", *args]), cwd=tmp_path)
    one_error_line(result, *words)
    assert os.listdir(tmp_path) == []


def test_an_out_dir_that_cannot_be_created_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    one_error_line(rung("single_torch", *QUICK, "--out-dir", str(tmp_path / "file" / "run")), "cannot create --out-dir")


@pytest.mark.slow
def test_the_single_device_rung_ignores_an_enclosing_slurm_allocation(tmp_path):
    # An sbatch script's batch step carries SLURM_PROCID=0 and SLURM_NTASKS=4: one process still trains on all data.
    slurm = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4", "SLURM_NNODES": "1"}
    result = rung("single_torch", *QUICK, "--out-dir", str(tmp_path), env=slurm)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "single_torch: 10 steps per epoch" in result.stdout  # 640 samples / 64, not a quarter of them


@pytest.mark.slow
def test_torch_checkpoints_are_bounded_and_record_what_wrote_them(tmp_path):
    result = rung("single_torch", *QUICK, "--checkpoint-every", "2", "--keep-checkpoints", "3", "--out-dir",
                  str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    kept = sorted(p.name for p in tmp_path.glob("checkpoint*.pt"))
    assert kept == ["checkpoint.pt", "checkpoint.step6.pt", "checkpoint.step8.pt"], kept
    meta = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["extra"]["meta"]
    assert meta["rung"] == "single_torch" and meta["world_size"] == 1 and meta["num_params"] == 206922


@pytest.mark.slow
def test_deepspeed_keeps_only_the_newest_checkpoints(tmp_path):
    command = launchers.torchrun(2, "scaledl.ladder.deepspeed", [*QUICK, "--checkpoint-every", "1",
                                                                 "--keep-checkpoints", "2", "--out-dir", str(tmp_path)])
    result = launch(command)
    assert result.returncode == 0, result.stderr[-3000:]
    kept = sorted(p.name for p in (tmp_path / "checkpoint").glob("global_step*"))
    assert kept == ["global_step4", "global_step5"], kept  # 640 / (64 x 2) = 5 steps, one checkpoint each


@pytest.mark.slow
def test_resuming_with_another_rung_or_world_size_is_refused_up_front(tmp_path):
    ddp = launch(launchers.torchrun(2, "scaledl.ladder.ddp", [*QUICK, "--out-dir", str(tmp_path)]))
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    before = snapshot(tmp_path)
    fsdp = launch(launchers.torchrun(2, "scaledl.ladder.fsdp", [*QUICK, "--out-dir", str(tmp_path), "--resume"]))
    assert fsdp.returncode != 0 and "rung 'ddp' (now 'fsdp')" in fsdp.stderr, fsdp.stderr[-3000:]
    alone = launch(launchers.torchrun(1, "scaledl.ladder.ddp", [*QUICK, "--out-dir", str(tmp_path), "--resume"]))
    assert alone.returncode != 0 and "world_size 2 (now 1)" in alone.stderr, alone.stderr[-3000:]
    assert snapshot(tmp_path) == before  # nothing trained, nothing written


@pytest.mark.slow
def test_a_torchrun_restart_before_the_first_checkpoint_starts_the_run_again(tmp_path):
    # No --checkpoint-every: the first attempt dies with nothing to resume from.
    command = launchers.torchrun(2, "fault_probe", ["scaledl.ladder.ddp", *QUICK, "--out-dir", str(tmp_path)])
    command.insert(command.index("--standalone") + 1, "--max-restarts=1")
    result = launch(command, env={"FAULT": "kill", "FAULT_RANK": "1", "FAULT_STEP": "3"})
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["params_in_sync"] is True
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["type"] for r in records].count("config") == 1  # the failed attempt's metrics were replaced
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 5


def test_plots_leave_the_notebooks_matplotlib_alone(tmp_path):
    code = f"""
import json, matplotlib
matplotlib.use("svg")
import matplotlib.pyplot as plt
plt.figure()
from scaledl import metrics
from scaledl.cli import demo
path = {str(tmp_path / "metrics.jsonl")!r}
open(path, "w").write(json.dumps({{"type": "log", "step": 1, "loss": 1.0, "samples_per_s": 10.0}}) + "\\n")
metrics.plot_history(path)
demo.plot([{{"rung": "ddp", "world_size": 2, "samples_per_s": 5.0, "test_accuracy": 0.9,
             "state_bytes_per_rank": 2**20, "ok": True}}], {str(tmp_path / "demo.png")!r})
print(matplotlib.get_backend(), len(plt.get_fignums()))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["svg", "1"]
    assert (tmp_path / "demo.png").stat().st_size > 1000 and (tmp_path / "metrics.png").exists()


def test_demo_refuses_an_out_dir_that_holds_a_demo(tmp_path):
    (tmp_path / "demo.json").write_text("[]\n")
    result = subprocess.run([os.path.join(os.path.dirname(sys.executable), "scaledl"), "demo", "--out-dir",
                             str(tmp_path), "--rungs", "single_torch"], capture_output=True, text=True, timeout=120)
    one_error_line(result, "already holds a demo", "--overwrite")
    assert os.listdir(tmp_path) == ["demo.json"]


@pytest.mark.slow
def test_a_failing_rung_in_the_demo_shows_its_one_line_error(tmp_path):
    scaledl = os.path.join(os.path.dirname(sys.executable), "scaledl")
    result = subprocess.run([scaledl, "demo", "--out-dir", str(tmp_path), "--rungs", "single_torch", "--train-limit",
                             "10"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    (row,) = json.loads((tmp_path / "demo.json").read_text())
    assert not row["ok"] and row["error"].startswith("exit 2: ") and "fewer than one --batch-size" in row["error"]
