"""Who am I in this job?  Rank, local rank, world size and rendezvous address from any launcher.

Pure functions of an environment mapping (no framework import), so every launcher's
environment can be tested from a recording.  `scaledl.distributed` turns the result into an
initialized process group.
"""
from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping
from scaledl.errors import UserError

DEFAULT_PORT = 29500


class LaunchError(UserError, RuntimeError):
    """The launcher's environment is incomplete or contradicts itself."""


@dataclass(frozen=True)
class LaunchEnv:
    launcher: str
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str | None
    master_port: int | None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


# (launcher, rank, local_rank, world_size, local_world_size) variable names, most specific
# first.  horovodrun --gloo sets HOROVOD_*; mpirun sets OMPI_*; MPICH's hydra sets PMI_* and
# MPI_LOCAL*; PALS (HPE Cray, Polaris and Aurora) sets PALS_* and PMI_*; srun sets SLURM_*.
# torchrun and the deepspeed launcher set the torch.distributed names.
_SOURCES = [
    ("torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"),
    ("horovodrun", "HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_SIZE"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("pals", "PALS_RANKID", "PALS_LOCAL_RANKID", "PMI_SIZE", "PALS_LOCAL_SIZE"),
    ("mpich", "PMI_RANK", ("MPI_LOCALRANKID", "PMI_LOCAL_RANK"), "PMI_SIZE",
     ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE")),
    ("slurm", "SLURM_PROCID", "SLURM_LOCALID", ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), None),
]

# Slurm's batch step (the shell running an sbatch script) has SLURM_PROCID=0, SLURM_LOCALID=0 and
# the job's SLURM_NTASKS too, as if it were rank 0 of the job: it is not a rank.  Only srun sets
# the step's own variables for the tasks it starts (srun(1), OUTPUT ENVIRONMENT VARIABLES), and
# 4294967294 is the batch step's id (SLURM_BATCH_SCRIPT) where a site exports SLURM_STEP_ID there.
SRUN_TASK_MARK = "SLURM_STEP_NUM_TASKS"
SLURM_BATCH_STEP_ID = "4294967294"


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise LaunchError(f"{name}={env[name]!r} is not an integer: fix the launcher's environment") from None


def _first_set(env: Mapping[str, str], names) -> str | None:
    """The first of `names` (one name or a tuple of alternatives) that is set, else the first."""
    if names is None or isinstance(names, str):
        return names
    return next((n for n in names if n in env), names[0])


def is_srun_task(env: Mapping[str, str]) -> bool:
    """A task that srun started, as opposed to the batch step of an sbatch script."""
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    return SRUN_TASK_MARK in env and step != SLURM_BATCH_STEP_ID


def _from_source(env: Mapping[str, str], source) -> LaunchEnv | None:
    launcher, rank_var, local_var, size_var, local_size_var = (
        source[0], *(_first_set(env, names) for names in source[1:]))
    if launcher == "slurm" and not is_srun_task(env):
        return None  # the batch step: SLURM_PROCID and friends describe the job, not a rank
    names = [n for n in (rank_var, local_var, size_var, local_size_var) if n]
    present = [n for n in names if n in env]
    # LOCAL_WORLD_SIZE is optional for torchrun-style launchers (the deepspeed launcher omits it).
    required = [rank_var, size_var] + ([local_var] if launcher != "torchrun" else [])
    # A launcher is there when its rank or local-rank variable is: PMI_SIZE alone is shared
    # by MPICH and PALS, and WORLD_SIZE alone is set by some batch scripts for other reasons.
    if rank_var not in env and local_var not in env:
        return None
    missing = [n for n in required if n not in env]
    if missing:
        raise LaunchError(
            f"half-set {launcher} environment: {', '.join(present)} set but {', '.join(missing)} "
            f"missing; set all of them or none")
    rank, world_size = _int(env, rank_var), _int(env, size_var)
    local_rank = _int(env, local_var) if local_var in env else rank
    if local_size_var and local_size_var in env:
        local_world_size = _int(env, local_size_var)
    elif launcher == "slurm":
        local_world_size = _slurm_local_size(env, world_size)
    else:
        local_world_size = world_size if local_rank == rank else local_rank + 1
    if not (0 <= rank < world_size and 0 <= local_rank < local_world_size <= world_size):
        raise LaunchError(
            f"inconsistent {launcher} environment: rank={rank} local_rank={local_rank} "
            f"world_size={world_size} local_world_size={local_world_size}")
    return LaunchEnv(launcher, rank, local_rank, world_size, local_world_size, None, None)


def _slurm_local_size(env: Mapping[str, str], world_size: int) -> int:
    # SLURM_TASKS_PER_NODE looks like "4(x2)" or "2,1"; the first entry is this node's count
    # only on the first node, so prefer SLURM_NTASKS_PER_NODE when srun was given it.
    for name in ("SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if name in env:
            match = re.match(r"\d+", env[name])
            if match:
                return int(match.group())
    return world_size


def detect(env: Mapping[str, str] | None = None) -> LaunchEnv:
    """Rank and world from the launcher's environment; a single process when there is none.

    Every launcher that is present must agree on rank and world size: a torchrun started
    inside an mpirun, say, with different numbers is an error, not a silent guess.  Slurm is
    the exception: `srun ... torchrun ...` gives each torchrun one Slurm task per node, and the
    ranks are torchrun's, so a launcher inside a Slurm task wins over it.
    """
    env = os.environ if env is None else env
    found = [f for f in (_from_source(env, s) for s in _SOURCES) if f is not None]
    if len(found) > 1:
        found = [f for f in found if f.launcher != "slurm"]
    if not found:
        info = LaunchEnv("single", 0, 0, 1, 1, None, None)
    else:
        info = found[0]
        for other in found[1:]:
            if (other.rank, other.world_size) != (info.rank, info.world_size):
                raise LaunchError(
                    f"contradictory launcher environment: {info.launcher} says rank {info.rank} of "
                    f"{info.world_size}, {other.launcher} says rank {other.rank} of {other.world_size}")
    addr, port = rendezvous(env, info)
    return LaunchEnv(info.launcher, info.rank, info.local_rank, info.world_size,
                     info.local_world_size, addr, port)


def rendezvous(env: Mapping[str, str], info: LaunchEnv) -> tuple[str | None, int | None]:
    """MASTER_ADDR and MASTER_PORT as given, else what the launcher's own variables say.

    The address: the first host of the PBS node file or of the Slurm step's node list (where
    rank 0 runs), or this host when every rank is on it.  The port, inside a Slurm job: one
    derived from the job and step ids (`slurm_port`), so srun's tasks need no MPI to agree on
    it.  None means "not known here": `scaledl.distributed` then asks rank 0 over MPI, or
    derives one from the launch (`job_port`).
    """
    port = _int(env, "MASTER_PORT") if "MASTER_PORT" in env else None
    addr = env.get("MASTER_ADDR") or first_node(env)
    if addr is None and info.world_size == info.local_world_size:
        addr = "127.0.0.1"
    if port is None and addr is not None and info.world_size > 1:
        port = slurm_port(env)  # (one process picks a free port: two may run side by side in a job)
    return addr, port


SLURM_PORT_BASE = 20000  # derived ports stay below Linux's ephemeral range (32768 and up)


def slurm_port(env: Mapping[str, str]) -> int | None:
    """A port for the ranks of one Slurm job step, None outside a Slurm job.

    Every task of a step computes the same number from SLURM_JOB_ID and SLURM_STEP_ID; two
    steps of a job, or two jobs sharing a node, get different ones unless their ids agree in
    the last three digits (job) and the last digit (step).  (PyTorch Lightning derives its port
    from the job id alone, 15000 + its last four digits: `SLURMEnvironment.main_port` in
    lightning/fabric/plugins/environments/slurm.py.)"""
    job = re.match(r"\d+", env.get("SLURM_JOB_ID", ""))
    if not job:
        return None
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", "0"))
    step_id = int(step) if step.isdigit() else 0
    return SLURM_PORT_BASE + int(job.group()) % 1000 * 10 + step_id % 10


def job_port(env: Mapping[str, str], parent_pid: int | None = None) -> int:
    """A port every rank of this launch derives alike, where the launcher gave none.

    From the batch job's id (PBS, Slurm) so two jobs sharing a node do not collide; else from
    Open MPI's job id; else, for ranks that all run on this node, from their parent's pid (the
    launcher's per-node process: hydra_pmi_proxy, orted, mpirun), which every local rank shares."""
    job = env.get("PBS_JOBID") or env.get("SLURM_JOB_ID") or env.get("OMPI_MCA_ess_base_jobid") or ""
    digits = re.match(r"\d+", job)
    if digits:
        return DEFAULT_PORT + int(digits.group()) % 10000
    if parent_pid is not None:
        return SLURM_PORT_BASE + parent_pid % 10000
    return DEFAULT_PORT


HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,252})")


def read_nodefile(path: str) -> list[str]:
    """The host names in a PBS node file (one per line, repeated per rank slot), checked.

    A node file is written by PBS, but users point PBS_NODEFILE at their own to run on part of
    a job: an empty or binary file, a directory, or a line that is not a host name gets one
    line that names the file and the line."""
    where = f"PBS_NODEFILE={path}"
    file = Path(path)
    if not file.exists():
        raise LaunchError(f"{where} does not exist: run inside a PBS job, "
                          "or point PBS_NODEFILE at a file of host names")
    if not file.is_file():
        raise LaunchError(f"{where} is not a file: point PBS_NODEFILE at a file of host names, one per line")
    try:
        text = file.read_bytes().decode("ascii")
    except OSError as error:
        raise LaunchError(f"{where} cannot be read ({error.strerror})") from None
    except UnicodeDecodeError:
        raise LaunchError(f"{where} is not a text file of host names") from None
    hosts = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not HOST_NAME.fullmatch(line):
            raise LaunchError(f"{where} line {number}: {line[:60]!r} is not a host name (one host per line)")
        hosts.append(line)
    if not hosts:
        raise LaunchError(f"{where} names no host: point it at the job's node file")
    return hosts


def first_node(env: Mapping[str, str]) -> str | None:
    """The first host of a PBS or Slurm allocation (where rank 0 runs), or None."""
    nodefile = env.get("PBS_NODEFILE")
    if nodefile:
        return high_speed_name(read_nodefile(nodefile)[0])
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if nodelist:
        return expand_slurm_nodelist(nodelist)[0]
    return None


def high_speed_name(host: str) -> str:
    """ALCF host names resolve to the management network; NCCL/oneCCL rendezvous must use the
    Slingshot (hsn) interface: x3005c0s13b0n0.<anything>.polaris.alcf.anl.gov ->
    x3005c0s13b0n0.hsn.cm.polaris.alcf.anl.gov.  Other hosts are returned unchanged."""
    match = re.fullmatch(r"([^.]+)\.(?:[^.]+\.)*?([a-z]+)\.alcf\.anl\.gov", host)
    if not match or ".hsn." in host:
        return host
    short, system = match.groups()
    return f"{short}.hsn.cm.{system}.alcf.anl.gov"


_HOSTLIST_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def expand_slurm_nodelist(nodelist: str) -> list[str]:
    """Slurm's host list syntax, as `scontrol show hostnames` expands it.

    'nid[001-003,007],gpu01' -> ['nid001', 'nid002', 'nid003', 'nid007', 'gpu01']; a name may hold
    several bracketed lists ('r[1-2]n[01-02]' -> r1n01 r1n02 r2n01 r2n02); numbers keep the zero
    padding of the range's first number.  What scontrol calls an invalid host list (text after
    the last bracket, unbalanced brackets, a range that is not numbers) is a LaunchError."""
    hosts: list[str] = []
    for item in _split_top_level(nodelist):
        if "]" in item and not item.endswith("]"):
            raise LaunchError(f"Slurm node list {nodelist!r}: {item!r} has text after its last ']'")
        names = [""]
        for text, ranges in re.findall(r"([^\[\]]*)(?:\[([^\[\]]*)\])?", item):
            numbers = [text + n for n in _expand_ranges(ranges, nodelist)] if ranges else [text]
            names = [name + n for name in names for n in numbers]
        hosts.extend(name for name in names if name)
    if not hosts:
        raise LaunchError(f"Slurm node list {nodelist!r} names no host")
    return hosts


def _split_top_level(nodelist: str) -> list[str]:
    """Split at commas and blanks outside brackets (as Slurm does); unbalanced brackets are an error."""
    items, depth, current = [], 0, ""
    for char in nodelist:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise LaunchError(f"Slurm node list {nodelist!r} has unbalanced brackets")
        if (char == "," or char.isspace()) and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise LaunchError(f"Slurm node list {nodelist!r} has unbalanced brackets")
    return [*items, current]


def _expand_ranges(ranges: str, nodelist: str) -> list[str]:
    numbers = []
    for part in ranges.split(","):
        match = _HOSTLIST_RANGE.fullmatch(part.strip())
        if not match:
            raise LaunchError(f"Slurm node list {nodelist!r}: {part!r} is not a number or a range like 001-004")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise LaunchError(f"Slurm node list {nodelist!r}: range {part!r} runs backwards")
        numbers += [f"{n:0{len(low)}d}" for n in range(int(low), int(high) + 1)]
    return numbers


def host_name_problem(hostname: str | None = None) -> str | None:
    """Why this host's own name does not resolve, or None.  torchrun's rendezvous advertises it
    (its agent retries for minutes, silently, where it cannot) and Horovod's Gloo looks it up."""
    hostname = hostname or socket.gethostname()
    try:
        socket.getaddrinfo(hostname, None, type=socket.SOCK_STREAM)
    except OSError as error:
        return (f"this host's name {hostname!r} does not resolve ({error.strerror or error}): add it to /etc/hosts "
                f"(127.0.1.1 {hostname})")
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]
