"""A finished run exits 0, every time: the DeepSpeed rung at each ZeRO stage, FSDP2 and DDP, run back
to back while two busy loops keep the cores loaded, as a shared node or a busy test machine does.

A rank that aborts after its work (`terminate called without an active exception`, SIGABRT) marks
a good run failed for every launcher and scheduler: a requeue, an alert, a lost allocation.  The
rungs leave through scaledl.distributed.exit_process, after teardown() has finished every group's
collectives and waited for gloo's workers; tests/test_distributed.py covers a script that does not.
"""
import os
import subprocess
import sys

import pytest

from scaledl.hpc import launchers

RUNS = 3  # each, back to back
ARGS = ["--epochs", "1", "--train-limit", "256", "--log-interval", "2", "--timeout", "60"]
RUNGS = {
    **{f"zero{stage}": ("deepspeed", ["--zero-stage", str(stage)]) for stage in range(4)},
    "fsdp": ("fsdp", []),
    "ddp": ("ddp", []),
}


@pytest.fixture
def busy_cores():
    """Two processes that spin for the whole test, one per core of a 2-core machine."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    yield
    for process in spinning:
        process.kill()
        process.wait()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNGS))
def test_a_finished_run_exits_0_every_time_under_load(tmp_path, busy_cores, name):
    module, flags = RUNGS[name]
    env = launchers.local_env(2, {k: v for k, v in os.environ.items() if not k.startswith(("PBS_", "SLURM_"))})
    for attempt in range(RUNS):
        out_dir = tmp_path / str(attempt)
        command = launchers.torchrun(2, f"scaledl.ladder.{module}", [*ARGS, *flags, "--out-dir", str(out_dir)])
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        assert result.returncode == 0, (f"{name}, run {attempt + 1} of {RUNS}: exit {result.returncode}\n"
                                        f"{result.stderr[-3000:]}")
        assert "terminate called" not in result.stderr, result.stderr[-3000:]
        assert (out_dir / "summary.json").is_file()
