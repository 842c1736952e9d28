"""Live ranks for the lessons: ipyparallel engines started the way a training job starts its ranks.

    cluster, ranks = engines.start()    # one rank per GPU of this node (per tile on Aurora), else 2 on the CPU
    %%px                                # a cell that runs on every rank
    ...
    cluster.stop_cluster_sync()

The engines are started by the launcher of the machine the notebook runs on, so each rank
finds its place exactly as a training script would (`scaledl.setup()` reads the launcher's
variables): Open MPI's `mpiexec` on a laptop, PALS `mpiexec` with its CPU binding inside a
Polaris or Aurora PBS job, `srun` inside a Slurm allocation.  All ranks sit on the node the
notebook runs on: a notebook drives one node; the job scripts in `jobs/` drive many.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from typing import Mapping

from scaledl.devices import accelerator_count, node_accelerators
from scaledl.hpc import launchers
from scaledl.hpc.launch import Target, build_plan
from scaledl.launch_env import LaunchError
from scaledl.hpc.systems import detect_system

CPU_RANKS = 2  # without a GPU: enough ranks to see every collective, few enough for a laptop
ENGINE = "ipyparallel.engine"
# ipyparallel starts MPI engines with --mpi (its MPIEngineSetLauncher.program), which imports
# mpi4py, and so MPI_Init, in every engine; where srun starts tasks without an MPI plugin
# (MpiDefault=none, common) an Open MPI engine aborts there.  Under srun the engines drop that
# flag and take srun's task id as their engine id: no MPI needed (scaledl.setup reads srun's
# variables too).  (A flag wins over --IPEngine.use_mpi=False in traitlets, so it must go.)
SLURM_ENGINE = ("import os, sys; sys.argv[1:] = [a for a in sys.argv[1:] if a != '--mpi'] + "
                "['--IPEngine.id=' + os.environ['SLURM_PROCID']]; "
                "from ipyparallel.engine.app import main; main()")


@dataclass(frozen=True)
class EnginePlan:
    """How the engines start: ipyparallel runs `mpi_cmd -n world_size *mpi_args python -m ipyparallel.engine`."""

    system: str
    world_size: int
    mpi_cmd: list[str]
    mpi_args: list[str]
    env: dict[str, str] = field(default_factory=dict)  # set for the engines (communication presets)
    note: str = ""  # why the ranks run where they do, when it is not one per GPU

    def line(self, *program: str) -> str:
        """The launch as one line, `program` (the engine's command, say) at its end: words joined by
        single spaces, so an empty `mpi_args` (Open MPI on a laptop) leaves no gap."""
        return " ".join([*self.mpi_cmd, "-n", str(self.world_size), *self.mpi_args, *program])


def default_world_size(accelerators: int | None = None) -> int:
    """One rank per accelerator, as a training job runs, where the node has two or more; else
    CPU_RANKS ranks on the CPU (a lesson about several ranks needs at least two, and NCCL will
    not put two ranks on one GPU)."""
    accelerators = accelerator_count() if accelerators is None else accelerators
    return accelerators if accelerators >= 2 else CPU_RANKS


def _on_the_cpu(world_size: int, kind: str | None, accelerators: int) -> tuple[dict[str, str], str]:
    """The engines' environment and a note when the ranks outnumber this node's accelerators.

    NCCL refuses two ranks on one GPU (ncclInvalidUsage: init.cc up to 2.29; from 2.30.3 unless
    NCCL_MULTI_RANK_GPU_ENABLE=1, topo.cc then init.cc), so such ranks run on the CPU with gloo: an empty
    CUDA_VISIBLE_DEVICES hides the GPUs from the engines, and from every library they load (DeepSpeed picks its
    accelerator by itself)."""
    if not accelerators or world_size <= accelerators:
        return {}, ""
    if kind != "cuda":
        raise LaunchError(f"WORLD_SIZE = {world_size} is more ranks than this node's {accelerators} {kind} devices, "
                          f"and two ranks cannot share one: set WORLD_SIZE to at most {accelerators}")
    return {"CUDA_VISIBLE_DEVICES": ""}, (f"on the CPU with gloo: this node's {accelerators} GPU"
                                          f"{'s' if accelerators > 1 else ''} cannot give each of {world_size} "
                                          "ranks its own, which NCCL needs")


def plan(world_size: int | None = None, system: str | None = None, env: Mapping[str, str] | None = None,
         hostname: str | None = None, accelerators: tuple[str | None, int] | None = None) -> EnginePlan:
    """The launch of `world_size` engines on this node (default: one per GPU, else 2 on the CPU),
    for the system detected from `env` (PBS, Slurm, host names) or named (local, polaris, aurora,
    slurm).  `accelerators`: this node's (kind, count), found when not given."""
    env = dict(os.environ if env is None else env)
    accelerators = node_accelerators() if accelerators is None else accelerators
    world_size = default_world_size(accelerators[1]) if world_size is None else world_size
    if not isinstance(world_size, int) or world_size < 1:
        raise LaunchError(f"WORLD_SIZE must be a whole number of ranks, at least 1, got {world_size!r}")
    hidden, note = _on_the_cpu(world_size, *accelerators)
    if system is None:
        system, _ = detect_system(env, hostname)
    if system == "local":
        # Open MPI's mpiexec; as root and with more ranks than cores it needs permission.
        extra = {k: v for k, v in launchers.local_env(world_size, env).items()
                 if k.startswith("OMPI_") and env.get(k) != v}
        return EnginePlan("local", world_size, [launchers.tool("mpiexec")], [], {**extra, **hidden}, note)
    # The batch systems: the same command `scaledl launch` builds, all ranks on this node.
    launch = build_plan(world_size, Target(ENGINE), ppn=world_size, system=system, env=env, hostname=hostname)
    command = list(launch.command)
    python_at = command.index(sys.executable)
    options = command[1:python_at]
    where = options.index("-n")
    del options[where:where + 2]  # ipyparallel puts `-n world_size` after the command itself
    return EnginePlan(system, world_size, command[:1], options, {**launch.env, **hidden}, note)


def start(world_size: int | None = None, system: str | None = None, timeout_s: float = 180):
    """Start the engines, wait for every one, and make `%%px` run on them.

    Returns (cluster, view): `view` runs code on every rank and blocks until all are done, so a
    `%%px` cell shows what each rank printed; `cluster.stop_cluster_sync()` stops them.
    """
    import logging

    import ipyparallel as ipp

    how = plan(world_size, system)
    os.environ.update(how.env)  # the engines inherit the notebook's environment
    # TensorFlow's C++ start-up lines (oneDNN, CPU instructions) on every rank's stderr, as
    # launchers.local_env and `make lab` keep them out; a value the user set stays.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # start_and_connect_sync waits for every engine for engine_timeout seconds (60 by default,
    # ipyparallel/cluster/cluster.py): ranks that import torch on a busy node can take longer.
    cluster = ipp.Cluster(n=how.world_size, engines="mpi", log_level=logging.WARNING,
                          engine_timeout=max(1, math.ceil(timeout_s)))
    cluster.config.MPILauncher.mpi_cmd = how.mpi_cmd
    cluster.config.MPILauncher.mpi_args = how.mpi_args
    if how.system == "slurm":
        cluster.config.MPIEngineSetLauncher.engine_cmd = [sys.executable, "-c", SLURM_ENGINE]
    command = how.line()
    try:
        # start_and_connect_sync, without its progress bar: a notebook keeps only a widget's first
        # frame ("0/2 engine/s"), and the line printed below says the ranks are up.
        cluster.start_cluster_sync(n=how.world_size)
        client = cluster.connect_client_sync()
        client.wait_for_engines(how.world_size, timeout=cluster.engine_timeout, interactive=False)
    except BaseException as error:
        # A start that timed out leaves the controller and the engines that did start running:
        # stop them, or the next start finds a node already busy with them.
        try:
            cluster.stop_cluster_sync()
        except Exception:
            pass
        if isinstance(error, TimeoutError):
            raise LaunchError(f"{how.world_size} ranks did not all start within {timeout_s:g} s ({command}): "
                              "run engines.start again (a busy node), or check the launcher with "
                              "`scaledl doctor`") from None
        raise
    # Stopping MPI engines ends mpiexec with status 1, which ipyparallel reports with every
    # engine's whole log: from here on only errors.
    cluster.log.setLevel(logging.ERROR)
    _stop_gently(cluster, client)
    view = client[:]
    view.block = True  # each %%px cell waits for every rank and shows what each printed
    view.activate()  # %%px now runs on these engines
    _no_progress_bar()
    print(f"{how.world_size} ranks up ({how.system}: {command})" + (f", {how.note}" if how.note else ""))
    return cluster, view


def _no_progress_bar() -> None:
    """Keep `%%px` from drawing its progress bar under a cell that runs over 2 s: the rungs print
    their own progress, and a saved notebook keeps only the bar's first frame ("%px: 0/2 tasks").
    `%%px --progress-after 2` brings it back for one cell."""
    from IPython import get_ipython

    shell = get_ipython()
    magics = shell.magics_manager.registry.get("ParallelMagics") if shell is not None else None
    if magics is not None:
        # ipyparallel/client/magics.py draws the bar only after this many seconds: never, in a lesson. Below 0 it
        # would also skip its wait for the ranks' output, and a cell would lose what some ranks printed.
        magics.progress_after_seconds = 10**6


def _stop_gently(cluster, client, gentle_s: float = 10) -> None:
    """Make `cluster.stop_cluster_sync()` ask the engines to exit before it signals them.

    ipyparallel stops MPI engines with SIGTERM to mpiexec, and an engine that gets it while its
    event loop is busy dies with a traceback ("Event loop stopped before Future completed") that
    lands in the learner's notebook, about one stop in four.  Engines asked to shut down exit on
    their own; the signal then finds nothing left.  The lessons keep calling the method they know.
    The wait for them is bounded: `client.shutdown(block=True)` waits for every engine's reply with
    no time limit (ipyparallel 9.2, client/client.py: `f.wait()`), so one engine that cannot answer
    (stopped, or its reply lost) would hang the cell for good.  After `gentle_s` the signal ends
    whatever is left, as it would without this.

    Each engine starts a "nanny" (ipyparallel/engine/nanny.py) in a session of its own, which no
    signal to mpiexec reaches; it exits after its engine, but can hang for good in zmq's
    `Context.term()` once the controller has gone.  The ones this machine started are ended after
    the stop: their engines and controller are gone by then.
    """
    import time

    import psutil

    try:
        nannies = [p for p in psutil.Process().children(recursive=True) if "ipyparallel.engine.nanny" in p.cmdline()]
    except psutil.Error:  # a rank that exited while it was listed
        nannies = []
    stop = cluster.stop_cluster_sync

    def stop_cluster_sync(*args, **kwargs):
        try:
            client.shutdown(targets="all", hub=False, block=False)
        except Exception:  # engines already gone: the signal below ends what is left
            pass
        deadline = time.monotonic() + gentle_s
        # The hub tells the client each engine that leaves; `client.ids` is those still registered.
        while client.ids and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            return stop(*args, **kwargs)
        finally:
            for nanny in nannies:
                try:
                    nanny.terminate()
                except psutil.NoSuchProcess:
                    pass

    cluster.stop_cluster_sync = stop_cluster_sync
