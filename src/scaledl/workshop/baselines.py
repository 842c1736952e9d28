"""The one-rank baseline a data-parallel run is measured against, and the verdict on its speed-up (lessons 4-7).

Each rank gets one device of its own: a GPU on Polaris, a core on a CPU node.  So the baseline is one rank on one
device.  On a CPU that means one core: the process's threads limited to its share (PyTorch reads OMP_NUM_THREADS,
TensorFlow ignores it and reads its own two variables), and, where Linux's `taskset` exists, the process pinned to
that many cores, because TensorFlow keeps threads of its own busy beyond those pools.

`speedup_verdict` words a speed-up the same way in every lesson.  Reruns of one command on a shared machine land
up to `SPREAD` apart (lesson 7 measures the spread of its own runs beside it): a ratio within it of 1 is no
measured speed-up and no measured slow-down.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from scaledl.hpc import launchers

SPREAD = 0.2  # about a fifth between reruns of one command on 2 shared cores


def thread_env(env: dict, threads: int) -> dict:
    """`env` with every framework's thread count set to `threads`: PyTorch's (OMP_NUM_THREADS) and TensorFlow's
    two pools, which it sizes by itself otherwise."""
    count = str(threads)
    return {**env, "OMP_NUM_THREADS": count, "TF_NUM_INTRAOP_THREADS": count, "TF_NUM_INTEROP_THREADS": count}


def pinned(command: list[str], cores: int, first: int = 0) -> list[str]:
    """`command` run on `cores` cores from core `first` only (`taskset -c first-last`), or as it is where
    taskset is missing (it is Linux's util-linux; macOS has none)."""
    taskset = shutil.which("taskset")
    return [taskset, "-c", f"{first}-{first + cores - 1}", *command] if taskset else list(command)


def one_rank_samples_per_s(module: str, flags=(), cores: int = 1, largest: int | None = None) -> float:
    """Run a one-device rung (`scaledl.ladder.single_torch` or `single_tf`) as one rank on `cores` cores, with
    `flags` and an output folder of its own; its samples/s.  `largest`: the world size it is compared with, so
    that it trains on the device kind those ranks get (`launchers.local_env`)."""
    folder = tempfile.mkdtemp(prefix=f"{module.rsplit('.', 1)[-1]}-")
    command = launchers.python_module(module, [*flags, "--out-dir", folder])
    return alone_samples_per_s(command, launchers.local_env(1, largest=largest), folder, cores)


def whole_machine_samples_per_s(module: str, flags=()) -> float:
    """The same rung as one process with every core of this machine, not pinned: context for a baseline."""
    folder = tempfile.mkdtemp(prefix=f"{module.rsplit('.', 1)[-1]}-")
    command = launchers.python_module(module, [*flags, "--out-dir", folder])
    return _samples_per_s(command, launchers.local_env(1), folder)


def alone_samples_per_s(command: list[str], env: dict, folder: str, cores: int = 1) -> float:
    """A distributed rung launched for ONE rank by `command` (its own launcher's line, writing to `folder`), pinned
    to `cores` cores with every framework's threads set, as the baseline is: the framework's own work on each step
    (its hooks, its thread, its collectives on one rank) with no partner to exchange with or wait for."""
    return _samples_per_s(pinned(command, cores), thread_env(env, cores), folder)


def side_by_side_samples_per_s(module: str, flags=(), count: int = 2, cores: int = 1,
                               on_gpus: bool = False) -> list[float]:
    """`count` runs of a one-device rung at once, run r pinned to its own `cores` cores (and GPU r on a GPU node),
    with no framework between them: each run's samples/s.  What sharing the machine alone costs a rank."""
    folders = [tempfile.mkdtemp(prefix=f"{module.rsplit('.', 1)[-1]}-") for _ in range(count)]
    runs = []
    for r, folder in enumerate(folders):
        env = thread_env(launchers.local_env(1, largest=count), cores)
        env |= {"CUDA_VISIBLE_DEVICES": str(r)} if on_gpus else {}
        command = pinned(launchers.python_module(module, [*flags, "--out-dir", folder]), cores, first=r * cores)
        runs.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for run in runs:
        _, errors = run.communicate()
        if run.returncode != 0:
            raise RuntimeError(f"{module} failed beside the others (exit {run.returncode}):\n{errors[-2000:]}")
    return [json.loads(Path(folder, "summary.json").read_text())["samples_per_s"] for folder in folders]


def _samples_per_s(command: list[str], env: dict, folder: str) -> float:
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command[-6:])} failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
    return json.loads(Path(folder, "summary.json").read_text())["samples_per_s"]


def speedup_verdict(speedup: float, world_size: int, spread: float = SPREAD) -> str:
    """One line on `speedup` (N ranks' samples/s over one rank's), judged against the run-to-run `spread`."""
    if world_size > 1 and speedup >= 0.9 * world_size:
        return "close to the ideal"
    if speedup > 1 + spread:
        return "faster than one rank, short of the ideal"
    if speedup >= 1 - spread:
        return f"within {spread:.0%} of one rank, the spread of reruns: no speed-up measured"
    return "slower than one rank, beyond the spread of reruns"
