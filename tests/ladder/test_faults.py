"""A dead, hung or diverged rank ends the job fast and clearly; a restarted job loses nothing.

Faults are injected by `probes/fault_probe.py` inside real ranks under real launchers: the
rank SIGKILLs or SIGSTOPs itself, or its loss turns NaN, at a chosen training step.
"""
import os
import subprocess
import time

import psutil
import pytest
import torch

from conftest import PROBES
from scaledl.hpc import launchers

TIMEOUT_S = 10
ARGS = ["--train-limit", "1280", "--epochs", "1", "--timeout", str(TIMEOUT_S)]
LAUNCH = {
    "ddp": lambda args: launchers.torchrun(2, "fault_probe", ["scaledl.ladder.ddp", *args]),
    "horovod_torch": lambda args: launchers.horovodrun(2, "fault_probe", ["scaledl.ladder.horovod_torch", *args]),
    "deepspeed": lambda args: launchers.deepspeed(2, "fault_probe", ["scaledl.ladder.deepspeed", *args]),
}


def run_with_fault(command, fault: str | None, step: int, limit_s: float) -> tuple[subprocess.CompletedProcess, float]:
    faults = {"FAULT": fault, "FAULT_RANK": "1", "FAULT_STEP": str(step)} if fault else {}
    env = launchers.local_env(2, {**os.environ, **faults})
    env["PYTHONPATH"] = os.pathsep.join([str(PROBES), env.get("PYTHONPATH", "")])
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        stdout, stderr = process.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        # Launchers start ranks in sessions of their own: kill the whole tree, or the ranks
        # would keep the output pipes open.
        for child in [*psutil.Process(process.pid).children(recursive=True), psutil.Process(process.pid)]:
            child.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"{' '.join(command)} still running after {limit_s} s\n{stdout[-3000:]}\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr), time.monotonic() - start


@pytest.mark.slow
@pytest.mark.parametrize("rung", list(LAUNCH))
def test_a_killed_rank_ends_the_job_within_the_timeout_four_times_running(tmp_path, rung):
    # Start-up (imports, rendezvous) takes a few seconds before the fault; the job must then
    # end well within the collective timeout, every time: four runs, rank 1 killed in its forward at steps 2 to 5
    # (the survivor then waits in that step's gradient all-reduce), so that an end that hangs now and then shows.
    for step in (2, 3, 4, 5):
        result, elapsed = run_with_fault(LAUNCH[rung]([*ARGS, "--out-dir", str(tmp_path / str(step))]),
                                         "kill", step=step, limit_s=60)
        assert result.returncode != 0, result.stdout[-2000:]
        assert elapsed < 30 + TIMEOUT_S, f"killed at step {step}: {elapsed:.0f} s"
        assert "summary rung=" not in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("rung, message", [
    ("ddp", f"a collective waited the --timeout of {TIMEOUT_S} s for a peer rank"),
    ("deepspeed", f"a collective waited the --timeout of {TIMEOUT_S} s for a peer rank"),
    # Horovod's background thread fails first and shuts Horovod down; the rung sees a lost peer.
    ("horovod_torch", "rank 0: stopping because rank 1 is gone (it stopped, crashed or hung)"),
])
def test_a_hung_rank_fails_the_others_after_the_collective_timeout(tmp_path, rung, message):
    result, elapsed = run_with_fault(LAUNCH[rung]([*ARGS, "--out-dir", str(tmp_path)]), "stop", step=3, limit_s=120)
    assert result.returncode != 0
    # Rank 0 gives up after the timeout; the launcher then kills the stopped rank after its
    # own grace period (torchrun's and deepspeed's: 30 s).
    assert message in result.stdout + result.stderr, result.stderr[-3000:]
    assert elapsed < 90


@pytest.mark.slow
@pytest.mark.parametrize("rung, what", [("ddp", "gradients"), ("deepspeed", "loss")])
def test_a_nan_on_one_rank_stops_every_rank_naming_step_and_checkpoint(tmp_path, rung, what):
    args = [*ARGS, "--checkpoint-every", "3", "--out-dir", str(tmp_path)]
    result, _ = run_with_fault(LAUNCH[rung](args), "nan", step=5, limit_s=120)
    assert result.returncode != 0
    checkpoint_path = tmp_path / ("checkpoint" if rung == "deepspeed" else "checkpoint.pt")
    for rank in (0, 1):
        assert (f"error: non-finite {what} at step 5 on rank {rank}" in result.stderr
                and f"last good checkpoint {checkpoint_path}" in result.stderr), result.stderr[-3000:]
    if rung == "ddp":
        saved = torch.load(checkpoint_path, weights_only=True)
        assert saved["step"] == 3 and all(torch.isfinite(t).all() for t in saved["model"].values())


@pytest.mark.slow
def test_skip_policy_skips_the_bad_step_and_finishes_in_sync(tmp_path):
    result, _ = run_with_fault(LAUNCH["ddp"]([*ARGS, "--on-nonfinite", "skip", "--out-dir", str(tmp_path)]),
                               "nan", step=5, limit_s=120)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "step 5: non-finite gradients" in output and "step skipped (1 so far)" in output, output[-3000:]
    assert "params_in_sync=True" in result.stdout
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert all(torch.isfinite(t).all() for t in saved["model"].values())


@pytest.mark.slow
def test_torchrun_restart_resumes_to_the_same_parameters(tmp_path):
    args = ["--train-limit", "1280", "--epochs", "2", "--checkpoint-every", "4"]
    whole_run = launchers.torchrun(2, "scaledl.ladder.ddp", [*args, "--out-dir", str(tmp_path / "whole")])
    whole, _ = run_with_fault(whole_run, None, step=0, limit_s=120)
    assert whole.returncode == 0, whole.stderr[-3000:]
    restarted = launchers.torchrun(2, "fault_probe", ["scaledl.ladder.ddp", *args, "--out-dir", str(tmp_path / "cut")])
    restarted.insert(restarted.index("--standalone") + 1, "--max-restarts=1")
    result, _ = run_with_fault(restarted, "kill", step=9, limit_s=180)  # rank 1 dies after the step-8 checkpoint
    assert result.returncode == 0, result.stderr[-3000:]
    history = (tmp_path / "cut" / "metrics.jsonl").read_text()
    assert history.count('"type": "config"') == 2  # the first attempt and the restart
    expected = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)
    resumed = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert resumed["step"] == expected["step"] == 20
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, resumed["model"][name]), name
