"""Command lines that start N local processes with each launcher the ladder uses.

Rungs do not care which launcher started them (`scaledl.launch_env` reads them all); these
builders are for the demo, the tests and the notebooks, which start rungs on this node.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from scaledl.errors import ERROR_DIR_VAR
from scaledl.launch_env import free_port

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_GRACE_S = 15.0  # after forwarding a signal, how long the launcher gets before its group is killed


def local_env(nproc: int, base: dict | None = None, largest: int | None = None,
              accelerators: tuple[str | None, int] | None = None) -> dict:
    """The environment for N local ranks: one share of the cores each, MPI allowed to run here.

    Where this node's GPUs cannot give each rank its own (NCCL refuses two ranks on one GPU), the
    ranks run on the CPU: an empty CUDA_VISIBLE_DEVICES, and DS_ACCELERATOR=cpu so that DeepSpeed's
    launcher does not look for GPUs.  `largest`: the largest world size of runs that are compared
    with this one (a scaling sweep); where that one must go to the CPU, so does this, so that
    1 rank and N ranks train on the same kind of device.  `accelerators`: this node's (kind,
    count), found when not given.
    """
    env = dict(os.environ if base is None else base)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Open MPI refuses to run as root (containers, CI) unless both are set.
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if nproc > (os.cpu_count() or 1):
        env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    kind, count = visible_accelerators(env, accelerators)
    if kind == "cuda" and max(nproc, largest or 0) > count:
        env["CUDA_VISIBLE_DEVICES"], env["DS_ACCELERATOR"] = "", "cpu"
    env.setdefault("DS_ACCELERATOR", kind if count else "cpu")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up banner, once per rank
    return env


def visible_accelerators(env: dict, accelerators: tuple[str | None, int] | None = None) -> tuple[str | None, int]:
    """The accelerator kind and count that processes started with `env` see.

    torch counts the GPUs once per process, so a notebook whose engines were moved to the CPU (an
    empty CUDA_VISIBLE_DEVICES in its os.environ) still counts them: read the mask here too.
    """
    if accelerators is None:
        from scaledl import devices  # imports torch: only when asked

        accelerators = devices.node_accelerators()
    kind, count = accelerators
    mask = env.get("CUDA_VISIBLE_DEVICES")
    if kind == "cuda" and mask is not None:
        count = min(count, len([entry for entry in mask.split(",") if entry.strip()]))
    return kind, count


def tool(name: str) -> str:
    """A console script of this Python's environment, else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    return beside if os.path.exists(beside) else (shutil.which(name) or name)


# The launchers' own modules.  A venv made over a site's framework module (--system-site-packages,
# as `make setup SYSTEM=polaris` makes it) has no console scripts for the module's packages, and
# the module's script on PATH would start the ranks with the module's Python, which does not see
# this venv's packages (scaledl among them): run the launcher with this Python instead.
LAUNCHER_MODULES = {"torchrun": "torch.distributed.run", "deepspeed": "deepspeed.launcher.runner"}


def launcher_command(name: str) -> list[str]:
    """How to start a launcher so that its ranks run this Python: its script beside this Python,
    else `python -m` its module (torchrun, deepspeed), else the script on PATH."""
    if name in LAUNCHER_MODULES and not os.path.exists(os.path.join(os.path.dirname(sys.executable), name)):
        return [sys.executable, "-m", LAUNCHER_MODULES[name]]
    return [tool(name)]


def python_module(module: str, args=()) -> list[str]:
    return [sys.executable, "-m", module, *args]


def torchrun(nproc: int, module: str, args=()) -> list[str]:
    return [*launcher_command("torchrun"), "--standalone", f"--nproc_per_node={nproc}", "-m", module, *args]


def mpirun(nproc: int, module: str, args=()) -> list[str]:
    return [tool("mpirun"), "-np", str(nproc), "--bind-to", "none", *python_module(module, args)]


def horovodrun(nproc: int, module: str, args=(), controller: str = "gloo") -> list[str]:
    return [tool("horovodrun"), "-np", str(nproc), "-H", f"localhost:{nproc}", f"--{controller}",
            *python_module(module, args)]


def deepspeed(nproc: int, module: str, args=()) -> list[str]:
    # The launcher's default port is a fixed 29500: two jobs on one node would collide.  At its default
    # log level (info) it also prints its command lines and, after the rung's summary, a line per rank
    # that exited well (deepspeed/launcher/runner.py and launch.py, --log_level, 0.17.6-0.19.8): its
    # warnings and errors still show.
    return [*launcher_command("deepspeed"), f"--num_gpus={nproc}", f"--master_port={free_port()}",
            "--log_level=warning", "--module", module, *args]


def for_launcher(launcher: str, nproc: int, module: str, args=()) -> list[str]:
    if launcher == "python":
        return python_module(module, args)
    builders = {"torchrun": torchrun, "mpirun": mpirun, "horovodrun": horovodrun, "deepspeed": deepspeed}
    if launcher not in builders:
        raise ValueError(f"unknown launcher {launcher!r}: use python, {', '.join(builders)}")
    return builders[launcher](nproc, module, args)


def run_launcher(command: list[str], env: dict | None = None, **popen) -> int:
    """Run a launcher command to its end the way `scaledl launch` does, and return its exit status.

    - The launcher runs in a process group of its own; SIGINT, SIGTERM and SIGHUP sent to this
      process go to that whole group, and this process waits for it (then kills what is left),
      so a scheduler's or a wrapper's signal ends every rank instead of orphaning them.
    - The ranks' one-line errors (`scaledl.errors`) arrive after everything the launcher
      printed around them (its own tracebacks, its failure summary): the line of the lowest
      rank that failed with a user error is printed again last, and its status (2) is
      returned instead of the launcher's (1).

    - Once a signal was forwarded, the launcher's own traceback about it (torchrun prints one
      per signal) is left out: each rank says in one line that it stopped.

    `popen` goes to subprocess.Popen (stdout=, stderr=, cwd=), so the demo can log to a file.
    """
    env = dict(os.environ if env is None else env)
    relay = "stderr" not in popen
    with tempfile.TemporaryDirectory(prefix="scaledl-errors-") as error_dir:
        env[ERROR_DIR_VAR] = error_dir
        process = subprocess.Popen(command, env=env, start_new_session=True,
                                   **({"stderr": subprocess.PIPE} if relay else {}), **popen)
        signalled: list[int] = []
        if relay:
            relay_thread = threading.Thread(target=_relay, args=(process.stderr, signalled), daemon=True)
            relay_thread.start()

        def forward(signum, frame):
            signalled.append(signum)
            _signal_group(process.pid, signum)

        previous = {}
        for signum in FORWARDED:
            try:
                previous[signum] = signal.signal(signum, forward)
            except ValueError:  # not the main thread: the caller handles signals
                break
        try:
            code = _wait(process, signalled)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            _signal_group(process.pid, signal.SIGKILL)  # whatever the launcher left behind in its group
            if relay:
                relay_thread.join(timeout=5)
        failed = _rank_errors(Path(error_dir))
    if signalled:
        return 128 + signalled[0]
    if code != 0 and failed:
        print(failed["line"], file=_where_errors_go(popen), flush=True)
        return failed["code"]
    return code


def _relay(stream, signalled: list[int]) -> None:
    """Copy the launcher's stderr to ours line by line; after a signal, without Python tracebacks."""
    skipping = False
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        if signalled:
            if line.startswith("Traceback (most recent call last)"):
                skipping = True
                continue
            if skipping:
                # A traceback's frames are indented; its last line (the exception) is not.
                skipping = line[:1].isspace()
                continue
        sys.stderr.write(line)
        sys.stderr.flush()
    stream.close()


def _where_errors_go(popen: dict):
    """The launcher's stderr when the caller redirected it to a file (the demo's log), else ours."""
    for stream in (popen.get("stderr"), popen.get("stdout") if popen.get("stderr") == subprocess.STDOUT else None):
        if hasattr(stream, "write"):
            return stream
    return sys.stderr


def _wait(process: subprocess.Popen, signalled: list[int]) -> int:
    """Wait for the launcher; once a signal was forwarded, kill its group after STOP_GRACE_S."""
    deadline = None
    while True:
        try:
            return process.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        if signalled and deadline is None:
            deadline = time.monotonic() + STOP_GRACE_S
        if deadline is not None and time.monotonic() > deadline:
            _signal_group(process.pid, signal.SIGKILL)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _rank_errors(folder: Path) -> dict | None:
    """The error the ranks left (`scaledl.errors`): a cause before a consequence (a rank that stopped
    because another did), a user error (status 2) before others, lowest rank first."""
    records = []
    for path in folder.glob("rank*.json"):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    records = [r for r in records if isinstance(r, dict) and {"rank", "code", "line"} <= set(r)]
    if not records:
        return None
    return min(records, key=lambda r: (bool(r.get("consequence")), r["code"] != 2, r["rank"]))


def local_device_count() -> int:
    """One rank per GPU on a GPU node, else 2 CPU ranks."""
    from scaledl import devices  # imports torch: only when asked

    return devices.device_count() or 2
