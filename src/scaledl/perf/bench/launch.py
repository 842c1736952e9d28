"""Start the benchmark worker (`scaledl.perf.bench.worker`) with a real launcher and read its JSON.

Multi-rank measurements need real processes: the worker runs under torchrun, horovodrun,
the deepspeed launcher or plain python (one rank), exactly as the rungs do, and rank 0
writes what it measured to a JSON file that the parent suite reads and compares.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from scaledl.hpc import launchers

WORKER = "scaledl.perf.bench.worker"


class WorkerError(RuntimeError):
    pass


def worker_env(nproc: int, threads: int) -> dict:
    env = launchers.local_env(nproc)
    env["OMP_NUM_THREADS"] = str(threads)  # every variant gets the same threads per rank
    return env


def run_worker(launcher: str, nproc: int, mode: str, args: list, out: Path, threads: int = 1,
               timeout_s: float = 600) -> dict:
    """Run one worker job to completion and return rank 0's JSON."""
    out.parent.mkdir(parents=True, exist_ok=True)
    command = launchers.for_launcher(launcher, nproc, WORKER,
                                     [mode, *map(str, args), "--threads", str(threads), "--out", str(out)])
    log = out.with_suffix(".log")
    with open(log, "w") as output:
        done = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, timeout=timeout_s,
                              env=worker_env(nproc, threads))
    if done.returncode != 0 or not out.is_file():
        tail = log.read_text()[-2000:]
        raise WorkerError(f"{' '.join(command)} exited {done.returncode}; see {log}\n{tail}")
    return json.loads(out.read_text())


def run_together(copies: int, mode: str, args: list, out: Path, threads: int = 1, timeout_s: float = 600) -> list[dict]:
    """`copies` one-rank workers started at once, each its own job (no process group between them),
    timing their steps side by side once all are warm: the single-device step with every core (or
    device) of the node busy, as it is in an N-rank job.  Returns each copy's JSON."""
    import shutil

    out.parent.mkdir(parents=True, exist_ok=True)
    folder = out.with_suffix(".ready")
    shutil.rmtree(folder, ignore_errors=True)
    started = []
    for copy in range(copies):
        path = out.with_name(f"{out.stem}-copy{copy}.json")
        command = launchers.for_launcher("python", 1, WORKER, [
            mode, *map(str, args), "--threads", str(threads), "--together", str(folder), "--copies", str(copies),
            "--out", str(path)])
        log = open(path.with_suffix(".log"), "w")
        started.append((path, log, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                    env=worker_env(copies, threads))))
    failed = []
    for path, log, process in started:
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        log.close()
        if code != 0 or not path.is_file():
            failed.append(f"{path.with_suffix('.log')} (exit {code})")
    shutil.rmtree(folder, ignore_errors=True)
    if failed:
        raise WorkerError(f"{copies} copies of the worker together: failed: {', '.join(failed)}")
    return [json.loads(path.read_text()) for path, _, _ in started]


class ServeWorker:
    """A one-rank worker that keeps its variant built and times a block of steps on request.

    Used to interleave variants A B A B ... without paying a process start per block."""

    def __init__(self, variant: str, log_dir: Path, threads: int, micro_batch_size: int, warmup: int):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.variant = variant
        self.log_path = log_dir / f"serve-{variant}.log"
        self._log = open(self.log_path, "w")
        command = launchers.python_module(WORKER, ["serve", "--variant", variant, "--threads", str(threads),
                                                   "--micro-batch-size", str(micro_batch_size),
                                                   "--warmup", str(warmup)])
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                        text=True, env=worker_env(1, threads))

    def _read_laps(self) -> list[float]:
        from scaledl.perf.bench.worker import LAPS_TAG

        for line in self.process.stdout:  # libraries may print on stdout too: skip to the tag
            if line.startswith(LAPS_TAG):
                return json.loads(line[len(LAPS_TAG):])
        self.process.wait()
        raise WorkerError(f"the {self.variant} worker exited {self.process.returncode}; see {self.log_path}\n"
                          f"{self.log_path.read_text()[-2000:]}")

    def ready(self) -> None:
        self._read_laps()

    def time_steps(self, steps: int) -> list[float]:
        self.process.stdin.write(f"{steps}\n")
        self.process.stdin.flush()
        return self._read_laps()

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write("quit\n")
                self.process.stdin.close()
                self.process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self._log.close()

