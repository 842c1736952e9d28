"""One call to join a distributed job under any launcher, and one to leave it.

    dist = scaledl.setup()          # rank, device, backend, process group, seeds
    ...
    scaledl.teardown()

The launcher is found by `scaledl.launch_env`; this module adds the PyTorch part: the device
for this rank, the backend for that device, the rendezvous when the launcher gave none, and
the process group with a timeout so that a dead peer fails the job instead of hanging it.
"""
from __future__ import annotations

import datetime
import os
import random
import socket
import sys
import time
from dataclasses import dataclass

import numpy as np

from scaledl import errors
from scaledl.devices import BACKENDS, pick_backend, pick_device  # noqa: F401  (re-exported)
from scaledl.launch_env import LaunchEnv, LaunchError, detect, free_port, host_name_problem, job_port

MPI_LAUNCHERS = ("openmpi", "mpich", "pals", "slurm")
# The name torch gives gloo's collective worker threads (ProcessGroupGloo::runLoop, torch 2.x).
_GLOO_WORKER = "pt_gloo_runloop"


@dataclass(frozen=True)
class Distributed:
    """What a training script needs to know about its place in the job."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: "torch.device"  # noqa: F821 (torch is imported lazily)
    backend: str
    launcher: str
    master_addr: str
    master_port: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch the same way on every rank.

    The same seed everywhere makes every rank build the same initial model, which is what
    data parallelism assumes (DDP and Horovod also broadcast rank 0's weights, but not every
    framework does); data order differs per rank through the sampler, not through the seed.
    """
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _mpi4py_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None


# The MPI each launcher's ranks can initialize: its own family.  An MPI of the other family
# does not see the launcher's ranks (Open MPI under hydra starts as a singleton of 1 rank, so a
# broadcast never reaches the others) or aborts in MPI_Init (Open MPI under srun without PMI).
_LAUNCHER_MPI = {"openmpi": "Open MPI", "mpich": "MPICH", "pals": "MPICH"}


def _mpi_family(version: str) -> str:
    """'Open MPI', or 'MPICH' for its family (MPICH, Cray MPICH, Intel MPI, MVAPICH), from
    MPI_Get_library_version's text."""
    return "Open MPI" if "Open MPI" in version else "MPICH"


def _mpi_library() -> str:
    """mpi4py's MPI library (MPI_Get_library_version's first line), without initializing MPI.

    mpi4py initializes MPI when `mpi4py.MPI` is imported unless `mpi4py.rc.initialize` is
    False (mpi4py docs, "mpi4py.rc"); MPI_Get_library_version may be called before MPI_Init
    (MPI 3.1, section 8.1.1), so the library can be checked before it can abort the process."""
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        initialize, mpi4py.rc.initialize = mpi4py.rc.initialize, False
        try:
            from mpi4py import MPI  # noqa: F401
        finally:
            mpi4py.rc.initialize = initialize
    text = sys.modules["mpi4py.MPI"].Get_library_version().replace("\x00", "").strip()
    return text.splitlines()[0].split(",")[0]  # "Open MPI v4.1.4", "MPICH Version:      4.0.2"


def _usable_mpi(job: LaunchEnv) -> tuple[bool, str]:
    """(whether mpi4py can reach this job's ranks, why not)."""
    wanted = _LAUNCHER_MPI.get(job.launcher)
    if wanted is None:
        return False, f"{job.launcher} is not an MPI launcher"
    if not _mpi4py_available():
        return False, "mpi4py is not installed"
    try:
        library = _mpi_library()
    except Exception as error:  # noqa: BLE001  no MPI library at all, or one mpi4py cannot load
        return False, f"mpi4py cannot load an MPI library ({str(error).splitlines()[0][:80]})"
    if _mpi_family(library) != wanted:
        return False, (f"mpi4py loads {' '.join(library.split())}, which cannot see ranks that {wanted}'s launcher "
                       f"started; an mpi4py built for {wanted} could")
    return True, ""


def _mpi_rendezvous(info: LaunchEnv) -> tuple[str, int]:
    """Rank 0's host name and a free port on it, broadcast over MPI (initialized here if needed)."""
    import atexit

    from mpi4py import MPI

    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
        atexit.register(lambda: MPI.Is_finalized() or MPI.Finalize())
    mine = (info.master_addr or socket.getfqdn(), free_port()) if info.rank == 0 else None
    return MPI.COMM_WORLD.bcast(mine, root=0)


def find_job(env=None) -> LaunchEnv:
    """This process's rank, local rank, world size and rank 0's address, from whichever launcher
    started it (torchrun, mpiexec, srun, horovodrun, deepspeed, or none)."""
    job = detect(env)
    problem = gloo_host_problem(os.environ if env is None else env)
    if problem:
        raise LaunchError(problem)
    return job


def check_horovod_size(job: LaunchEnv, size: int) -> None:
    """After `hvd.init()`: Horovod must see the ranks the launcher started.  torchrun (or a bare
    `srun` without Horovod's MPI) starts N processes that Horovod cannot join: each `hvd.init()`
    makes a job of one, and N copies train alone into the same directory."""
    if size != job.world_size:
        raise LaunchError(f"Horovod sees {size} rank{'s' * (size != 1)} but {job.launcher} started "
                          f"{job.world_size}: start the Horovod rungs with horovodrun or mpiexec (or srun with "
                          "Horovod's MPI), not torchrun")


def gloo_host_problem(env, hostname: str | None = None) -> str | None:
    """Why Horovod's Gloo cannot start on this host, or None.

    Horovod 0.28.1 makes a Gloo device for each process set from this host's name: the global
    one's interface (HOROVOD_GLOO_IFACE) is not passed on (GlooContext::InitializeForProcessSet
    reads its own, empty gloo_iface_).  Its vendored Gloo checks getaddrinfo for -1 only
    (gloo/transport/tcp/device.cc, lookupAddrForHostname), so a name that does not resolve
    (EAI_NONAME is -2) is a segmentation fault in every rank's hvd.init()."""
    if "horovod" not in sys.modules or "HOROVOD_GLOO_RENDEZVOUS_ADDR" not in env:
        return None  # not Horovod's Gloo
    problem = host_name_problem(hostname)
    return problem and (f"{problem}; Horovod's Gloo crashes without it, or use Horovod's MPI controller "
                        "(horovodrun --mpi, or mpirun)")


def rendezvous(job: LaunchEnv, timeout_s: float = 600, env=None) -> dict:
    """The keyword arguments that let `torch.distributed.init_process_group` find rank 0, and
    its `timeout` (a collective waits at most `timeout_s` for a peer, then fails the job).

    Fills in what the launcher left out.  Where the launcher's own variables name rank 0's
    host (srun's node list and job/step ids, PBS's node file, all ranks on this node) no MPI is
    needed (`scaledl.launch_env.rendezvous`).  Otherwise, under an MPI launcher whose MPI mpi4py
    uses, rank 0 names its host and a port it found free (broadcast over mpi4py); the port is
    else derived from the launch (`job_port`), and a multi-node job that nothing names rank 0 of
    is one line.  Exports MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK and WORLD_SIZE, which later
    libraries (DeepSpeed, user code) read.  Also records `timeout_s` so that a collective that
    times out can be named in the error.
    """
    addr, port = job.master_addr, job.master_port
    if job.world_size == 1:
        addr, port = addr or "127.0.0.1", port or free_port()
    elif port is None or addr is None:
        usable, why_not = _usable_mpi(job)
        if usable:
            addr, port = _mpi_rendezvous(job)
        elif addr is None:
            raise LaunchError(
                f"{job.launcher} started {job.world_size} ranks on several nodes and nothing names rank 0's host "
                f"({why_not}): export MASTER_ADDR=<rank 0 host> MASTER_PORT=<port>")
        else:
            # An MPI launcher's ranks on one node are children of one process (mpirun, orted,
            # hydra_pmi_proxy); horovodrun's are not.
            shared_parent = job.world_size == job.local_world_size and job.launcher in _LAUNCHER_MPI
            port = job_port(env if env is not None else os.environ, os.getppid() if shared_parent else None)
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(job.rank),
                      LOCAL_RANK=str(job.local_rank), WORLD_SIZE=str(job.world_size),
                      LOCAL_WORLD_SIZE=str(job.local_world_size))
    errors.collective_timeout_s = timeout_s
    timeout = datetime.timedelta(seconds=timeout_s)
    store = _restart_store(addr, port, job.world_size, timeout)
    return {"timeout": timeout, **({"store": store} if store else {"init_method": f"tcp://{addr}:{port}"})}


def setup(device: str | None = None, backend: str | None = None, timeout_s: float = 600,
          seed: int | None = 0, init_process_group: bool = True, env=None) -> Distributed:
    """Find this process's place in the job, pick its device and backend, and join the group.

    The rungs write these steps out one by one (find_job, pick_device, pin the device,
    init_process_group); this is the same in one call for your own scripts and the notebooks.
    `init_process_group=False` only finds rank and device (Horovod and TensorFlow, which have
    their own communicators).  `timeout_s` bounds every collective: a rank that dies or hangs
    makes the others fail after that long instead of waiting forever.
    """
    import torch
    import torch.distributed as dist

    job = find_job(env)
    torch_device = pick_device(device, job.local_rank)
    torch_backend = pick_backend(torch_device, backend)
    if torch_device.index is not None:
        getattr(torch, torch_device.type).set_device(torch_device)
    if seed is not None:
        seed_everything(seed)
    errors.collective_timeout_s = timeout_s
    joining = init_process_group and not dist.is_initialized()
    # Also without a group: it checks the launcher gave enough to find rank 0, and exports it.
    init = rendezvous(job, timeout_s, env) if not dist.is_initialized() else {}
    addr, port = os.environ.get("MASTER_ADDR", job.master_addr), int(os.environ.get("MASTER_PORT", 0)) or None
    if joining:
        dist.init_process_group(
            backend=torch_backend, rank=job.rank, world_size=job.world_size, **init,
            **({"device_id": torch_device} if torch_device.type == "cuda" else {}))
        _wait_for_gloo_workers_at_exit()
    return Distributed(job.rank, job.local_rank, job.world_size, job.local_world_size,
                       torch_device, torch_backend, job.launcher, addr, port)


def _restart_store(addr: str, port: int, world_size: int, timeout: datetime.timedelta):
    """Under torchrun, its agent's store with keys of this attempt's own; else None.

    torchrun's agent keeps one store for the whole job, so ranks it restarts (`--max-restarts`)
    would find the addresses their dead predecessors published there and fail to connect.
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    import torch.distributed as dist

    agent_store = dist.TCPStore(addr, port, world_size, is_master=False, timeout=timeout)
    return dist.PrefixStore(f"attempt{attempt}", agent_store)


def deepspeed_sees(device, env=None) -> None:
    """Call on every rank before `deepspeed.initialize`, with the rank's device.

    DeepSpeed takes the LOCAL_RANK variable as the index of the rank's GPU: the engine calls
    `set_device(LOCAL_RANK)` unless told otherwise (`_set_distributed_vars` in
    deepspeed/runtime/engine.py), and ZeRO-3 builds `cuda:<LOCAL_RANK>` (`Init` in
    runtime/zero/partition_parameters.py, the rank checks in runtime/zero/utils.py; 0.17.6 to 0.19.8).
    That holds where every rank sees all of the node's GPUs (torchrun, the deepspeed launcher).  Where
    the launcher shows each rank only its own GPU (Polaris' affinity wrapper, `srun --gpus-per-task=1`),
    local rank 3's one GPU is `cuda:0` and `cuda:3` does not exist: LOCAL_RANK then becomes the
    device's index, in this process only (and from then on for whatever reads it in this process:
    call `find_job()` before, as the rungs do, for the rank's place on the node).  The engine also
    insists that LOCAL_RANK equals Open MPI's OMPI_COMM_WORLD_LOCAL_RANK where that is set
    (`_configure_with_arguments`), so that one follows.
    A CPU rank has no index and nothing changes.
    """
    env = os.environ if env is None else env
    index = getattr(device, "index", None)
    if index is None or env.get("LOCAL_RANK") == str(index):
        return
    env["LOCAL_RANK"] = str(index)
    if "OMPI_COMM_WORLD_LOCAL_RANK" in env:
        env["OMPI_COMM_WORLD_LOCAL_RANK"] = str(index)


def release_deepspeed_shared_memory() -> None:
    """Call on every rank right after `deepspeed.initialize`.

    DeepSpeed's CPU all-reduce (its shm_comm op, used when every rank is on one node) puts a
    69 MB buffer per rank in /dev/shm, named after MASTER_ADDR and MASTER_PORT, and never
    removes it: every job leaks its buffers until /dev/shm, which is RAM, runs out.  Once all
    ranks have opened each other's buffers (the barrier), the names can go; the mappings stay
    valid for the rest of the job, and a rank that is killed leaves nothing behind.
    """
    import torch.distributed as dist

    if "deepspeed" in sys.modules and dist.is_available() and dist.is_initialized():
        dist.barrier()
        _unlink_deepspeed_buffer(dist.get_rank())


def _unlink_deepspeed_buffer(rank: int) -> None:
    name = (f"deepspeed_allreduce_buffer_{os.getuid()}_{os.environ.get('MASTER_ADDR', '')}_"
            f"{os.environ.get('MASTER_PORT', '')}_{rank}")
    try:
        os.unlink(os.path.join("/dev/shm", name))
    except OSError:
        pass  # not created (torchrun, several nodes, no shm_comm) or already removed


def teardown() -> None:
    """Leave the process group (safe to call when none was joined)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if "deepspeed" in sys.modules:
            _unlink_deepspeed_buffer(dist.get_rank())
        # All ranks leave together: a rank that destroys its group while a peer is still
        # in the last collective can abort the peer's communication threads (seen with gloo).
        # Not when leaving because of an error: a peer may be dead, and the barrier would
        # wait out the whole timeout a second time.
        if sys.exc_info()[0] is None:
            _finish_all_collectives(dist)
        dist.destroy_process_group()
        wait_for_gloo_workers()


def _finish_all_collectives(dist) -> None:
    """A barrier on every group this rank is in, oldest first (the same order on every rank).

    Gloo's barrier completes only after every collective that was running or queued on its
    group when it was called (ProcessGroupGloo::barrier).  The default group's barrier says
    nothing about the others, each of which has its own worker threads: DeepSpeed's collectives
    run on a clone of the world group (deepspeed.utils.groups._clone_world_group), FSDP's and
    tensor parallelism's on their meshes' groups."""
    groups = list(getattr(getattr(dist.distributed_c10d, "_world", None), "pg_map", {}) or [None])
    for group in groups:
        dist.barrier(group=group)


def wait_for_gloo_workers(timeout_s: float = 5.0) -> bool:
    """Wait until no gloo worker thread of this process has anything left to do; False if
    one still had after `timeout_s` (or where threads cannot be seen: not Linux).

    A gloo worker marks a collective complete (the caller's wait returns), then drops its own
    references to the collective's tensors (ProcessGroupGloo::runLoop).  Since torch 2.10 a
    tensor that has a Python object takes the GIL on that drop (intrusive_ptr's PyObject
    preservation: TensorImpl::decref_pyobject).  A worker that the scheduler holds back until
    the interpreter is finalizing is then ended inside C++ by Python 3.11's take_gil
    (PyThread_exit_thread), and the unwinding through torch's noexcept destructors calls
    std::terminate: the process aborts, "terminate called without an active exception",
    after a successful run.  So wait, with the GIL free, until every worker sleeps: a worker
    that is running or ready to run (its drop pending) keeps the wait going, and one blocked
    on the GIL takes it while this thread sleeps."""
    workers = _threads_named(_GLOO_WORKER)
    if workers is None:  # no /proc: the threads cannot be seen; give them the GIL for a moment
        time.sleep(0.2)
        return False
    deadline = time.monotonic() + timeout_s
    quiet = 0
    # Three looks in a row: a worker may come to wait for the GIL just as this thread takes it
    # back to look; this thread's next sleep hands the GIL on (CPython's drop_gil wakes a waiter).
    while quiet < 3:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
        quiet = 0 if any(_thread_state(stat) in ("R", "D") for stat in workers) else quiet + 1
    return True


def _threads_named(name: str) -> list[str] | None:
    """The /proc stat files of this process's threads called `name`; None without /proc."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    found = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                if comm.read().strip() == name:
                    found.append(f"/proc/self/task/{tid}/stat")
        except OSError:
            pass  # the thread ended
    return found


def _thread_state(stat: str) -> str | None:
    """A thread's scheduler state (R running or ready, S sleeping, D in the kernel, ...); None once gone."""
    try:
        with open(stat) as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2]  # the field after the (name), which may hold spaces


_at_exit_registered = False


def _wait_for_gloo_workers_at_exit() -> None:
    """Also wait for the gloo workers when a script that joined a group ends without teardown():
    atexit functions run before the interpreter starts finalizing.  Only local waiting here, no
    collective: the script may be leaving because of an error, with its peers dead or elsewhere."""
    global _at_exit_registered
    if not _at_exit_registered:
        import atexit

        atexit.register(wait_for_gloo_workers, 2.0)
        _at_exit_registered = True


def params_fingerprint(model) -> str:
    """A hash of a model's (or a state dict's) tensors: equal <=> bit-identical values."""
    import torch

    from scaledl.report import fingerprint

    state = model.state_dict() if hasattr(model, "state_dict") else model
    # Raw bytes, since bf16 has no NumPy type.
    return fingerprint(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                       for tensor in state.values())


def params_in_sync(model, all_gather_object=None) -> bool:  # a model or a state dict
    """True when every rank holds bit-identical parameters (data parallelism's invariant).

    Each rank hashes its parameters and the hashes are all-gathered (torch.distributed's
    default group, or `all_gather_object(obj) -> list` such as Horovod's): cheap enough to
    run at the end of every training run, and a failed gradient average shows up at once.
    """
    import torch.distributed as dist

    mine = params_fingerprint(model)
    if all_gather_object is not None:
        return len(set(all_gather_object(mine))) == 1
    if not (dist.is_available() and dist.is_initialized()):
        return True
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, mine)
    return len(set(digests)) == 1


def exit_process(code: int) -> None:
    """End a training process with `code` without running interpreter finalization.

    After `teardown()` there is nothing left to do, but communication threads that outlive it
    (gloo's, while a DDP model still holds the group: see `wait_for_gloo_workers`) can abort
    the process at interpreter shutdown ("terminate called without an active exception")
    after a successful run.  So the rungs shut Horovod down and finalize MPI themselves,
    flush their output, and leave (after a successful run only: see below).
    """
    from scaledl import signals

    signals.leave()  # a signal from here on (the launcher ending the job) must not raise in the sleep below
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # the reader is gone (a launcher that exited, a closed pipe): nothing left to say
    if "torch.distributed" in sys.modules:
        wait_for_gloo_workers()  # no worker still holding a collective's tensors (see there)
    if code != 0:
        # Leaving on an error: shutting Horovod down and MPI_Finalize wait for every rank (a
        # fence), and a peer may be dead, or stuck in a collective waiting for this one, until
        # the --timeout.  Exiting closes this rank's connections, which ends the peer's wait now.
        os._exit(code)
    try:
        for name in ("horovod.torch", "horovod.tensorflow"):
            if name in sys.modules and sys.modules[name].is_initialized():
                sys.modules[name].shutdown()
        if "mpi4py.MPI" in sys.modules:
            mpi = sys.modules["mpi4py.MPI"]
            if mpi.Is_initialized() and not mpi.Is_finalized():
                mpi.Finalize()
    except Exception:  # noqa: BLE001  a peer already gone can fail the shutdown; the status is decided
        pass
    os._exit(code)
