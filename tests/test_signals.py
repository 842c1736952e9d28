"""Signals to real launchers end every rank within seconds, one line per rank, and leave nothing behind.

A batch scheduler's walltime SIGTERM, a wrapper that signals its child, Ctrl-C in a terminal,
a launcher killed with SIGKILL: after each, no rank of the job may keep training, and no
/dev/shm/deepspeed_* buffer of the job may remain (each is 69 MB of RAM).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import PROBES, tool
from scaledl.hpc import launchers

# Long enough that no run ends on its own while the test waits for it to be stopped.
ARGS = ["--epochs", "500", "--train-limit", "2048", "--log-interval", "5"]
GONE_WITHIN_S = 15  # the ranks' own grace is 5 s; the rest is slack for a loaded 2-core machine
pytestmark = pytest.mark.slow


def clean_env(nproc: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PBS_", "SLURM_", "PALS_", "PMI_", "OMPI_COMM"))}
    env = launchers.local_env(nproc, env)
    env["PYTHONPATH"] = os.pathsep.join([str(PROBES), env.get("PYTHONPATH", "")])
    return env


def processes_of(marker: str) -> list[psutil.Process]:
    """Every live process whose command line names `marker` (the run's unique --out-dir)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            if process.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(process.info["cmdline"] or ()):
                found.append(process)
        except psutil.Error:
            continue
    return found


def shm_buffers(port: int | None = None) -> set[str]:
    names = {p.name for p in Path("/dev/shm").glob("deepspeed_*")}
    return {n for n in names if port is None or f"_{port}_" in n}


def start(command: list[str], out_dir: Path, nproc: int = 2, new_session: bool = False) -> subprocess.Popen:
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(nproc),
                            start_new_session=new_session)


def wait_until_training(out_dir: Path, limit_s: float = 240) -> None:
    """Until the run has logged a training step (every rank is past its start-up)."""
    deadline = time.monotonic() + limit_s
    metrics = out_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.is_file() and '"step"' in metrics.read_text().replace('"type": "config"', ""):
            return
        time.sleep(0.2)
    pytest.fail(f"no training step logged in {out_dir} within {limit_s} s")


def assert_all_gone(process: subprocess.Popen, marker: str, sent_at: float) -> tuple[str, str]:
    """The launcher exits and no process of the run is left, within GONE_WITHIN_S of the signal."""
    try:
        stdout, stderr = process.communicate(timeout=GONE_WITHIN_S + 30)
    except subprocess.TimeoutExpired:
        for child in processes_of(marker):
            child.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"the launcher did not exit after the signal\n{stderr[-3000:]}")
    left = processes_of(marker)
    while left and time.monotonic() - sent_at < GONE_WITHIN_S:
        time.sleep(0.2)
        left = processes_of(marker)
    for child in left:
        child.kill()
    assert not left, f"still running {time.monotonic() - sent_at:.0f} s after the signal: " \
                     f"{[' '.join(p.cmdline()) for p in left]}\n{stderr[-3000:]}"
    return stdout, stderr


def rank_lines(stderr: str, rung: str) -> list[str]:
    return [line for line in stderr.splitlines() if f"scaledl.ladder.{rung}: stopped by" in line]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_scaledl_launch_ends_every_rank(tmp_path, signum):
    out_dir = tmp_path / "run"
    launch = start([tool("scaledl"), "launch", "-n", "2", "--", "scaledl.ladder.ddp", *ARGS, "--out-dir", str(out_dir)],
                   out_dir)
    wait_until_training(out_dir)
    launch.send_signal(signum)
    sent_at = time.monotonic()
    _, stderr = assert_all_gone(launch, str(out_dir), sent_at)
    assert launch.returncode == 128 + signum, stderr[-3000:]
    lines = rank_lines(stderr, "ddp")
    name = signal.Signals(signum).name
    # One line per rank (a rank that the launcher's own SIGTERM reached first may say SIGTERM).
    assert 1 <= len(lines) <= 2 and all("stopped by SIG" in line for line in lines), stderr[-3000:]
    assert any(name in line for line in lines) or signum != signal.SIGINT, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]


def test_ctrl_c_under_a_bare_torchrun_is_one_line_per_rank(tmp_path):
    # A terminal's Ctrl-C goes to the foreground process group: torchrun (its ranks run in
    # sessions of their own and hear it from torchrun).
    out_dir = tmp_path / "run"
    torchrun = start(launchers.torchrun(2, "scaledl.ladder.ddp", [*ARGS, "--out-dir", str(out_dir)]), out_dir,
                     new_session=True)
    wait_until_training(out_dir)
    os.killpg(torchrun.pid, signal.SIGINT)
    _, stderr = assert_all_gone(torchrun, str(out_dir), time.monotonic())
    lines = rank_lines(stderr, "ddp")
    assert len(lines) == 2 and {"(rank 0 of 2)" in lines[0] or "(rank 0 of 2)" in lines[1]}, stderr[-3000:]
    # What is left is torchrun's own report of the signal: no traceback from any rank.
    assert stderr.count("Traceback") <= 1 and "scaledl/" not in stderr.split("Traceback")[-1], stderr[-3000:]


def test_sigterm_to_the_deepspeed_runner_ends_every_rank_and_frees_shared_memory(tmp_path):
    out_dir = tmp_path / "run"
    command = launchers.deepspeed(2, "scaledl.ladder.deepspeed", [*ARGS, "--out-dir", str(out_dir)])
    port = int(next(a for a in command if a.startswith("--master_port=")).split("=")[1])
    runner = start(command, out_dir)
    wait_until_training(out_dir)
    runner.send_signal(signal.SIGTERM)  # the runner alone, as a wrapper or a scheduler would
    _, stderr = assert_all_gone(runner, str(out_dir), time.monotonic())
    assert len(rank_lines(stderr, "deepspeed")) <= 2, stderr[-3000:]
    assert not shm_buffers(port), shm_buffers(port)


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_ranks_die_with_a_launcher_killed_outright(tmp_path, launcher):
    # SIGKILL cannot be forwarded: the ranks must notice their launcher is gone.
    out_dir = tmp_path / "run"
    rung = "ddp" if launcher == "torchrun" else "deepspeed"
    command = launchers.for_launcher(launcher, 2, f"scaledl.ladder.{rung}", [*ARGS, "--out-dir", str(out_dir)])
    process = start(command, out_dir)
    wait_until_training(out_dir)
    process.kill()
    sent_at = time.monotonic()
    process.communicate()
    left = processes_of(str(out_dir))
    while left and time.monotonic() - sent_at < GONE_WITHIN_S:
        time.sleep(0.2)
        left = processes_of(str(out_dir))
    for child in left:
        child.kill()
    assert not left, [" ".join(p.cmdline()) for p in left]


def test_an_interrupted_deepspeed_start_leaves_no_shared_memory(tmp_path):
    # Ctrl-C right after the shared-memory op made its buffers, before training starts.
    out_dir = tmp_path / "run"
    command = launchers.deepspeed(2, "scaledl.ladder.deepspeed", [*ARGS, "--out-dir", str(out_dir)])
    port = int(next(a for a in command if a.startswith("--master_port=")).split("=")[1])
    runner = start(command, out_dir, new_session=True)
    deadline = time.monotonic() + 240
    while not shm_buffers(port) and time.monotonic() < deadline and runner.poll() is None:
        time.sleep(0.02)
    assert shm_buffers(port), "DeepSpeed made no shared-memory buffer (the shm_comm op did not start)"
    time.sleep(1.0)
    os.killpg(runner.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole foreground group
    assert_all_gone(runner, str(out_dir), time.monotonic())
    assert not shm_buffers(port), shm_buffers(port)


# A rank under a launcher, ending on its own while its launcher ends too (horovodrun's per-rank
# process reaps the rank and exits at once).  A child that outlives the rank holds its end of
# the wakeup socket, so the watcher hears no end-of-file and finds both gone at its next look.
RACE = r"""
import os, subprocess, sys, time

RANK = '''
import os, subprocess, sys, time
from scaledl import signals
signals.install("rank: stopped by {signal}")
subprocess.Popen(["sleep", "2"], pass_fds=(signals.install.writer.fileno(),), stderr=subprocess.DEVNULL)
print("ready", flush=True)
time.sleep(float(sys.argv[1]))
os._exit(0)
'''
rank = subprocess.Popen([sys.executable, "-c", RANK, sys.argv[1]], stdout=subprocess.PIPE, text=True,
                        env={**os.environ, "LOCAL_RANK": "0"})
rank.stdout.readline()
rank.wait()
os._exit(0)
"""


def test_the_watcher_says_nothing_when_the_rank_and_its_launcher_end_together():
    for attempt in range(6):
        delay = 0.1 * (attempt % 3)  # where in the watcher's half-second look the ending falls
        # The launcher's stderr is the rank's and its watcher's: it is read until the watcher has exited.
        result = subprocess.run([sys.executable, "-c", RACE, str(delay)], capture_output=True, text=True,
                                env=clean_env(1), timeout=60)
        assert result.returncode == 0 and result.stderr == "", f"attempt {attempt}:\n{result.stderr}"


def catches(pid: int, signum: int) -> bool:
    """The process has a handler of its own for `signum` (bit signum-1 of SigCgt in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(caught >> (signum - 1) & 1)


# The rung, started as `python -m` starts it (argv[0] is "-m" while its package imports), with a
# gate in front of the import system: the first import of torch leaves a mark and waits there.  The
# test looks at the rank at that one moment, which no polling of a process that imports torch in a
# fraction of a second can be sure to catch.  The gate waits in short sleeps, not one: numpy's import has
# started a second thread (OpenBLAS's), and the kernel may hand a process's signal to that thread;
# Python then runs the handler in the main thread at its next bytecode, which one long sleep would
# put off for its whole length (a real import runs bytecode all along).
GATED_RUNG = """
import importlib.abc, pathlib, runpy, sys, time
MARK = pathlib.Path(sys.argv[1])
class Gate(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            MARK.touch()
            until = time.monotonic() + 60
            while time.monotonic() < until:  # runs Python between short sleeps, as an import does
                time.sleep(0.01)
        return None
sys.meta_path.insert(0, Gate())
sys.argv = ["-m", "--epochs", "1", "--out-dir", str(MARK.parent / "run")]
runpy.run_module("scaledl.ladder.single_torch", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])  # Python catches SIGINT from its start
def test_a_signal_while_a_rung_still_imports_torch_ends_it_quietly(signum, tmp_path):
    # horovodrun starts each rank from a shell (`sh -c`, two commands, so the shell stays) and,
    # when one rank fails, sends SIGTERM to the others, often while they still import torch.  A
    # rank killed outright by the signal makes that shell print "Terminated" under the rank's tag.
    # The rank must catch it from its first moment, before torch is loaded, and end with the
    # shell's status and no line at all.
    # The signal at its default, as a launcher leaves it: under `nohup` SIGHUP is ignored, and a rank
    # rightly leaves an ignored SIGHUP alone (scaledl.signals).
    importing = tmp_path / "importing-torch"
    shell = subprocess.Popen(["sh", "-c", f'cd . ; {sys.executable} -c "$0" {importing}', GATED_RUNG],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=clean_env(1), preexec_fn=lambda: signal.signal(signum, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not importing.exists() and shell.poll() is None:
        time.sleep(0.01)
    assert importing.exists(), f"the rung never imported torch: {shell.communicate(timeout=60)}"
    rank = psutil.Process(shell.pid).children()[0]
    assert catches(rank.pid, signum), "the rung did not catch the signal before it imported torch"
    rank.send_signal(signum)
    out, err = shell.communicate(timeout=60)
    assert shell.returncode == 128 + signum and err == "" and out == "", (shell.returncode, err)


def rank_process(marker: str, rank: int, limit_s: float = 60) -> psutil.Process:
    """The rank `rank` of the run whose command line names `marker` (its launcher has no RANK)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for process in processes_of(marker):
            try:
                if process.environ().get("RANK") == str(rank):
                    return process
            except psutil.Error:
                continue
        time.sleep(0.2)
    pytest.fail(f"no rank {rank} of {marker} within {limit_s} s")


def logged_steps(out_dir: Path) -> list[list[int]]:
    """The steps metrics.jsonl logged, one list per start of the run (each starts with its config line)."""
    runs: list[list[int]] = []
    for line in (out_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("type") == "config":
            runs.append([])
        elif record.get("type") == "log":
            runs[-1].append(record["step"])
    return runs


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_a_stop_request_to_one_rank_saves_at_a_step_every_rank_agrees_on_and_resume_goes_on(tmp_path, launcher):
    # Slurm's warning before a time limit (sbatch --signal=USR1@120, passed on by the job script)
    # reaches the ranks one by one; here only rank 1 hears it.  Every rank must stop at the same
    # step, after saving there, or the checkpoint is torn and a resume trains from an older one.
    out_dir = tmp_path / "run"
    rung, command = ("ddp", launchers.torchrun) if launcher == "torchrun" else ("deepspeed", launchers.deepspeed)
    flags = [*ARGS, "--out-dir", str(out_dir)]
    process = start(command(2, f"scaledl.ladder.{rung}", flags), out_dir)
    wait_until_training(out_dir)
    rank_process(str(out_dir), 1).send_signal(signal.SIGUSR1)
    sent_at = time.monotonic()
    _, stderr = assert_all_gone(process, str(out_dir), sent_at)
    assert process.returncode == 0, stderr[-3000:]  # done as asked: the launcher says nothing more
    assert not (out_dir / "summary.json").exists()  # ... but the run is not finished
    stopped = [line for line in stderr.splitlines() if "on SIGUSR1" in line]
    assert len(stopped) == 1 and "saved a checkpoint at step" in stopped[0], stderr[-3000:]
    step = int(stopped[0].split("at step ")[1].split()[0])
    trained = logged_steps(out_dir)[0]
    assert step == trained[-1] and step % 5 == 0, (step, trained)  # the metrics line every rank reached
    # The same command with --resume goes on from that step, not from the start or an older one.
    resumed = subprocess.run(command(2, f"scaledl.ladder.{rung}", [*flags, "--resume", "--max-steps", str(step + 5)]),
                             capture_output=True, text=True, env=clean_env(2), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert logged_steps(out_dir)[1] == [step + 5], logged_steps(out_dir)
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["params_in_sync"] is True
