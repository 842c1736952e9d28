"""A job's whole output, under each launcher: quiet when it works, one cause when a rank stops on an error.

Real ranks under real launchers; each assertion is on everything the job printed.  What a
launcher adds itself (torchrun's log lines and failure summary, mpirun's and horovodrun's
reports) is set aside by `ranks_output`; what is left must be exactly the ranks' lines: no
traceback, no BrokenPipeError, no second error.
"""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from conftest import PROBES, tool
from scaledl.hpc import launchers

pytestmark = pytest.mark.slow
ARGS = ["--epochs", "1", "--train-limit", "512", "--timeout", "20"]  # 4 steps per epoch on 2 ranks
RUNGS = {"torchrun": "ddp", "mpirun": "ddp", "horovodrun": "horovod_torch", "scaledl launch": "ddp"}
TORCH_LOG = re.compile(r"^[WEI]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")  # torchrun's own logger
RANK_PREFIX = re.compile(r"^\[\d+\]<std(out|err)>:")  # horovodrun tags each rank's line
# The deepspeed launcher's own logger (runner.py, launch.py); the ranks' DeepSpeed lines name other files.
DEEPSPEED_LAUNCHER_LOG = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+\] \[[A-Z]+\] \[(runner|launch)\.py:\d+:")
# A successful run under DeepSpeed's own launcher too: ZeRO-3, whose gathers and reduce-scatters used to print
# torch's deprecation warnings, on CPU ranks, where DeepSpeed builds its shared-memory op.
QUIET = {**RUNGS, "deepspeed": "deepspeed"}
RUNG_ARGS = {"deepspeed": ["--zero-stage", "3"]}


def command(launcher: str, rung: str, args: list[str], probe: bool = False) -> list[str]:
    module, args = ("fault_probe", [f"scaledl.ladder.{rung}", *args]) if probe else (f"scaledl.ladder.{rung}", args)
    if launcher == "scaledl launch":
        return [tool("scaledl"), "launch", "-n", "2", "--", module, *args]
    return launchers.for_launcher(launcher, 2, module, args)


def run(launcher: str, rung: str, args: list[str], **fault: str) -> subprocess.CompletedProcess:
    env = launchers.local_env(2, {k: v for k, v in os.environ.items() if not k.startswith(("PBS_", "SLURM_"))})
    env.update(fault, PYTHONPATH=os.pathsep.join([str(PROBES), env.get("PYTHONPATH", "")]))
    return subprocess.run(command(launcher, rung, args, probe=bool(fault)), capture_output=True, text=True,
                          env=env, timeout=300)


def ranks_output(launcher: str, text: str) -> list[str]:
    """The lines the ranks printed, without what the launcher says around them."""
    lines = text.splitlines()
    if launcher == "horovodrun":
        return [RANK_PREFIX.sub("", line) for line in lines if RANK_PREFIX.match(line)]
    if launcher == "deepspeed":
        lines = [line for line in lines if not DEEPSPEED_LAUNCHER_LOG.match(line)]
    if launcher == "mpirun":  # its reports stand between two rules of dashes
        rules = [i for i, line in enumerate(lines) if re.fullmatch(r"-{20,}", line)]
        report = {i for a, b in zip(rules[::2], rules[1::2]) for i in range(a, b + 1)}
        lines = [line for i, line in enumerate(lines) if i not in report]
    else:  # torchrun: its log lines, and its failure summary (its own traceback, then a table between ==== rules)
        start = next((i for i, line in enumerate(lines[:-1]) if line == "Traceback (most recent call last):"
                      and "bin/torchrun" in lines[i + 1]), None)
        if start is not None:
            end = max(i for i, line in enumerate(lines) if line.startswith("=" * 20))
            lines = lines[:start] + lines[end + 1:]
        lines = [line for line in lines if not (TORCH_LOG.match(line) or re.fullmatch(r"\*+", line.strip())
                                                or "OMP_NUM_THREADS" in line or line.startswith("scaledl launch: "))]
    return [line for line in lines if line.strip()]


@pytest.mark.parametrize("launcher", list(QUIET))
def test_a_run_that_works_prints_only_its_own_lines(tmp_path, launcher):
    rung = QUIET[launcher]
    for attempt in range(3 if launcher == "horovodrun" else 1):  # horovodrun's endings raced the watcher
        result = run(launcher, rung, [*ARGS, *RUNG_ARGS.get(rung, []), "--out-dir", str(tmp_path / str(attempt))])
        assert result.returncode == 0, result.stderr[-3000:]
        lines = ranks_output(launcher, result.stdout + result.stderr)
        assert len(lines) == 2, f"attempt {attempt}:\n" + "\n".join(lines)
        assert lines[0] == f"{rung}: 4 steps per epoch on 2 ranks, cpu"
        assert lines[1].startswith(f"summary rung={rung} world_size=2 ") and "params_in_sync=True" in lines[1]
        assert "Traceback" not in result.stdout + result.stderr
        # The last line of all is the rung's: nothing a launcher says after a run that worked.
        assert (result.stdout + result.stderr).strip().splitlines()[-1] == lines[1] or launcher != "deepspeed"


@pytest.mark.parametrize("launcher", list(RUNGS))
def test_a_ranks_error_is_the_one_cause_and_the_others_say_they_follow_it(tmp_path, launcher):
    rung = RUNGS[launcher]
    result = run(launcher, rung, [*ARGS, "--out-dir", str(tmp_path)], FAULT="error", FAULT_RANK="0", FAULT_STEP="2")
    cause = f"scaledl.ladder.{rung}: error: fault injected at step 2 on rank 0"
    assert result.returncode == 2 if launcher == "scaledl launch" else result.returncode != 0, result.stderr[-3000:]
    lines = [line for line in ranks_output(launcher, result.stdout + result.stderr)
             if line != f"{rung}: 4 steps per epoch on 2 ranks, cpu"]
    output = "\n".join(lines)
    # Rank 1 finds rank 0 gone in a collective and says so; under a bare launcher it may instead
    # be stopped by the launcher's SIGTERM first (it cannot tell that signal from a user's).
    consequence = re.compile(rf"scaledl\.ladder\.{rung}: rank 1: stopping because rank 0 (stopped; see its line "
                             r"above|is gone \(it stopped, crashed or hung\); its line above, or the launcher's "
                             r"report, says why)$")
    signalled = f"scaledl.ladder.{rung}: stopped by SIGTERM (rank 1 of 2)"
    assert lines.count(cause) == (2 if launcher == "scaledl launch" else 1), output
    others = [line for line in lines if line != cause]
    assert len(others) <= 1 and all(consequence.match(line) or line == signalled for line in others), output
    if launcher == "scaledl launch":
        assert result.stderr.strip().splitlines()[-1] == cause  # the cause, last
        assert all("see its line above" in line for line in others), output
    whole = result.stdout + result.stderr
    assert "BrokenPipeError" not in whole and "Interrupted" not in whole, whole[-3000:]
    assert "Traceback" not in output, whole[-3000:]
