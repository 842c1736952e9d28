"""Command lines that start N local processes with each launcher the ladder uses.

Rungs do not care which launcher started them (`scaledl.launch_env` reads them all); these
builders are for the demo, the tests and the notebooks, which start rungs on this node.
"""
from __future__ import annotations

import os
import shutil
import sys

from scaledl.launch_env import free_port


def local_env(nproc: int, base: dict | None = None) -> dict:
    """The environment for N local ranks: one share of the cores each, MPI allowed to run here."""
    env = dict(os.environ if base is None else base)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Open MPI refuses to run as root (containers, CI) unless both are set.
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if nproc > (os.cpu_count() or 1):
        env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    env.setdefault("DS_ACCELERATOR", _deepspeed_accelerator())
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up banner, once per rank
    return env


def _deepspeed_accelerator() -> str:
    """DeepSpeed guesses its accelerator; on a machine with no GPU say "cpu" so it need not."""
    try:
        import torch
    except ImportError:
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    return "cpu"


def tool(name: str) -> str:
    """A console script of this Python's environment, else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    return beside if os.path.exists(beside) else (shutil.which(name) or name)


def python_module(module: str, args=()) -> list[str]:
    return [sys.executable, "-m", module, *args]


def torchrun(nproc: int, module: str, args=()) -> list[str]:
    return [tool("torchrun"), "--standalone", f"--nproc_per_node={nproc}", "-m", module, *args]


def mpirun(nproc: int, module: str, args=()) -> list[str]:
    return [tool("mpirun"), "-np", str(nproc), "--bind-to", "none", *python_module(module, args)]


def horovodrun(nproc: int, module: str, args=(), controller: str = "gloo") -> list[str]:
    return [tool("horovodrun"), "-np", str(nproc), "-H", f"localhost:{nproc}", f"--{controller}",
            *python_module(module, args)]


def deepspeed(nproc: int, module: str, args=()) -> list[str]:
    # The launcher's default port is a fixed 29500: two jobs on one node would collide.
    return [tool("deepspeed"), f"--num_gpus={nproc}", f"--master_port={free_port()}", "--module", module, *args]


def for_launcher(launcher: str, nproc: int, module: str, args=()) -> list[str]:
    if launcher == "python":
        return python_module(module, args)
    builders = {"torchrun": torchrun, "mpirun": mpirun, "horovodrun": horovodrun, "deepspeed": deepspeed}
    if launcher not in builders:
        raise ValueError(f"unknown launcher {launcher!r}: use python, {', '.join(builders)}")
    return builders[launcher](nproc, module, args)
