"""The machines a job can run on, how to tell which one this is, and what each one needs.

A system is where ranks start: this machine alone ("local", torchrun), ALCF's Polaris and
Aurora (PBS + PALS `mpiexec`), or any Slurm cluster (`srun`).  Each has a number of ranks per
node (one per GPU, or per tile on Aurora) and a recommended communication environment:
presets that `scaledl launch` exports unless the variable is already set, so a user sees them
(`scaledl launch --dry-run`) and overrides them (`export NAME=...` or `--env NAME=VALUE`).
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from typing import Mapping

from scaledl.launch_env import LaunchError, read_nodefile

POLARIS_NCCL_DOCS = ("ALCF user guide, Polaris > Applications and Libraries > Libraries > NCCL "
                     "(docs.alcf.anl.gov/polaris/applications-and-libraries/libraries/nccl/)")
AURORA_CCL_DOCS = ("ALCF user guide, Aurora > Data Science > Frameworks > oneCCL "
                   "(docs.alcf.anl.gov/aurora/data-science/frameworks/oneCCL/)")
AURORA_JOBS_DOCS = "https://docs.alcf.anl.gov/aurora/running-jobs-aurora"
AURORA_PYTORCH_DOCS = "https://docs.alcf.anl.gov/aurora/data-science/frameworks/pytorch"
# Not on ALCF's oneCCL page: set by common Aurora job scripts ("Required by Aurora mpich"); ALCF's PyTorch
# example passes `mpiexec --pmi=pmix` for the first instead.
AURORA_SCRIPTS = "not on ALCF's oneCCL page: common Aurora job scripts set it"
CUDA_ENV_DOCS = "CUDA Programming Guide, CUDA Environment Variables (docs.nvidia.com/cuda)"


@dataclass(frozen=True)
class Preset:
    """One recommended environment variable: its value, what it is for, where it is documented."""

    name: str
    value: str
    why: str
    docs: str
    prepend: bool = False  # a search path: the value goes in front of what the variable already holds


@dataclass(frozen=True)
class System:
    name: str
    launcher: str  # the command that starts the ranks
    ranks_per_node: int  # one rank per GPU (per tile on Aurora); 0: read from the allocation
    comm_env: tuple[Preset, ...] = ()


# Why each variable: the documentation of the library that reads it (NCCL's environment variables,
# libfabric's fi_cxi(7) and fi_mr(3) man pages); the values are ALCF's, from its NCCL page.
NCCL_ENV_DOCS = "NCCL's Environment Variables, docs.nvidia.com/deeplearning/nccl"
FI_CXI_DOCS = "libfabric's fi_cxi(7)"
FI_MR_DOCS = "libfabric's fi_mr(3), its memory registration cache"
# FI_MR_CACHE_MONITOR=userfaultfd on both systems: what it does, said once.
USERFAULTFD = ("how libfabric's registration cache learns that host memory was freed or remapped: the kernel's "
               "userfaultfd")
POLARIS_COMM_ENV = (
    Preset("CUDA_DEVICE_ORDER", "PCI_BUS_ID",
           "not ALCF's list but CUDA's own: CUDA numbers the GPUs in PCI order, as nvidia-smi and ALCF's affinity "
           "table do, so CUDA_VISIBLE_DEVICES=3 is the GPU next to cores 0-7", CUDA_ENV_DOCS),
    Preset("NCCL_NET", "AWS Libfabric",
           f"the network NCCL must use between nodes: the aws-ofi-nccl plugin (libfabric over Slingshot), not TCP "
           f"sockets; if it cannot load, NCCL fails rather than fall back ({NCCL_ENV_DOCS}, NCCL_NET)",
           POLARIS_NCCL_DOCS),
    Preset("NCCL_NET_GDR_LEVEL", "PHB",
           f"GPUDirect RDMA between a GPU and a NIC on the same NUMA node (path type PHB: through the CPU's PCIe "
           f"host bridge) ({NCCL_ENV_DOCS}, NCCL_NET_GDR_LEVEL)",
           POLARIS_NCCL_DOCS),
    Preset("NCCL_CROSS_NIC", "1", f"rings and trees may use a different NIC on each node ({NCCL_ENV_DOCS})",
           POLARIS_NCCL_DOCS),
    Preset("NCCL_COLLNET_ENABLE", "1", f"use the CollNet plugin (in-network reductions) where the network offers "
           f"it ({NCCL_ENV_DOCS})", POLARIS_NCCL_DOCS),
    Preset("FI_CXI_DISABLE_HOST_REGISTER", "1",
           f"the Slingshot provider does not register its own host buffers with the GPU: with many processes per "
           f"GPU that page-locks so much memory that it slows the node or limits the process count ({FI_CXI_DOCS})",
           POLARIS_NCCL_DOCS),
    Preset("FI_MR_CACHE_MONITOR", "userfaultfd",
           f"{USERFAULTFD} instead of intercepting the allocator's calls ({FI_MR_DOCS})", POLARIS_NCCL_DOCS),
    Preset("FI_CXI_DEFAULT_CQ_SIZE", "131072",
           f"a completion queue large enough that many operations in flight do not overrun it (the CXI provider's "
           f"default, CXIP_CQ_DEF_SZ in libfabric's prov/cxi/include/cxip.h, was 1024 up to 2.1, 131072 from 2.2) "
           f"({FI_CXI_DOCS})", POLARIS_NCCL_DOCS),
)


# ALCF's NCCL page exports NCCL_NET="AWS Libfabric" together with the plugin's folder and hwloc's on
# LD_LIBRARY_PATH (argonne-lcf/user-guides, docs/polaris/applications-and-libraries/libraries/nccl.md).
# NCCL_NET names a network that must load: with no libnccl-net.so to find, NCCL fails every
# communicator instead of falling back to sockets (ncclNetInit: "Failed to initialize any NET plugin",
# ncclInvalidUsage, src/plugin/net.cc from NCCL 2.27; "Error: network %s not found." before that, in
# src/net.cc up to 2.25 and src/plugin/net.cc in 2.26).  So where no LD_LIBRARY_PATH folder holds the
# plugin, these go first.
POLARIS_NCCL_PLUGIN_FOLDERS = ("/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib", "/soft/libraries/hwloc/lib")
NCCL_PLUGIN_FILE = "libnccl-net.so"


def nccl_plugin_folder(env: Mapping[str, str]) -> str | None:
    """The first LD_LIBRARY_PATH folder that holds NCCL's network plugin, if any does."""
    folders = [f for f in env.get("LD_LIBRARY_PATH", "").split(":") if f]
    return next((f for f in folders if os.path.exists(os.path.join(f, NCCL_PLUGIN_FILE))), None)


def polaris_plugin_path(env: Mapping[str, str]) -> Preset | None:
    """LD_LIBRARY_PATH with ALCF's plugin folders first, when NCCL_NET will ask for the plugin
    and no folder on the path has it; None when nothing needs adding."""
    if env.get("NCCL_NET", "AWS Libfabric") != "AWS Libfabric" or nccl_plugin_folder(env):
        return None
    return Preset("LD_LIBRARY_PATH", ":".join(POLARIS_NCCL_PLUGIN_FOLDERS),
                  "the aws-ofi-nccl plugin (and hwloc) that NCCL_NET='AWS Libfabric' loads; without it NCCL fails "
                  "instead of falling back", POLARIS_NCCL_DOCS, prepend=True)


def preset_value(preset: Preset, env: Mapping[str, str]) -> str:
    """What the variable is set to: the preset's value, in front of the current one for a search path."""
    current = env.get(preset.name, "") if preset.prepend else ""
    return f"{preset.value}:{current}" if current else preset.value


AURORA_COMM_ENV = (
    Preset("CCL_PROCESS_LAUNCHER", "pmix", "oneCCL learns ranks from PALS through PMIx", AURORA_CCL_DOCS),
    Preset("PALS_PMI", "pmix", "make PALS mpiexec serve PMIx, which CCL_PROCESS_LAUNCHER=pmix needs (ALCF's "
           "PyTorch page passes mpiexec --pmi=pmix instead)", AURORA_SCRIPTS),
    Preset("CCL_ATL_TRANSPORT", "mpi", "oneCCL moves data between nodes over Aurora's MPICH", AURORA_CCL_DOCS),
    Preset("CCL_KVS_MODE", "mpi",
           "oneCCL exchanges addresses over MPI instead of a TCP key-value store; MPI must be initialized "
           "first (scaledl.setup does, through mpi4py)", AURORA_CCL_DOCS),
    Preset("CCL_KVS_USE_MPI_RANKS", "1", "oneCCL ranks are the MPI ranks", AURORA_CCL_DOCS),
    Preset("CCL_CONFIGURATION", "cpu_gpu_dpcpp", "oneCCL's build with GPU (SYCL) buffers", AURORA_CCL_DOCS),
    Preset("CCL_KVS_CONNECTION_TIMEOUT", "600", "seconds to wait for all ranks at start-up on many nodes",
           AURORA_CCL_DOCS),
    Preset("ZE_FLAT_DEVICE_HIERARCHY", "FLAT",
           "each of the 12 GPU tiles is one device, so local rank r takes xpu:<r>, a tile of its own socket "
           "(the frameworks module's default; the Aurora PE's is COMPOSITE: 6 devices)", AURORA_PYTORCH_DOCS),
    Preset("ZE_ENABLE_PCI_ID_DEVICE_ORDER", "1",
           "number GPUs in PCI order, so xpu:<r> is the same tile on every node, next to the cores its "
           "--cpu-bind list gives", AURORA_JOBS_DOCS),
    Preset("FI_PROVIDER", "cxi", "libfabric's Slingshot provider (fi_cxi(7))", AURORA_SCRIPTS),
    Preset("FI_CXI_DEFAULT_CQ_SIZE", "1048576", "a larger completion queue (in ALCF's optional, application-"
           "dependent list; the CXI provider's default is 131072 from libfabric 2.2)", AURORA_CCL_DOCS),
    Preset("FI_CXI_RX_MATCH_MODE", "hybrid", "when the NIC's matching resources run out, move to hardware and "
           "software matching instead of entering flow control, which can cycle and look like a hang (fi_cxi(7))",
           AURORA_CCL_DOCS),
    Preset("FI_MR_CACHE_MONITOR", "userfaultfd",
           f"{USERFAULTFD} ({FI_MR_DOCS}); in ALCF's minimal set, 'essential for functionality' (its optional list "
           f"tries 'disabled', no cache at all)", AURORA_CCL_DOCS),
)

SYSTEMS = {
    "local": System("local", "torchrun", 0),
    "polaris": System("polaris", "mpiexec", 4, POLARIS_COMM_ENV),
    "aurora": System("aurora", "mpiexec", 12, AURORA_COMM_ENV),
    "slurm": System("slurm", "srun", 0),
}

POLARIS_AFFINITY_DOCS = ("ALCF user guide, Polaris > Machine Overview > Device Affinity, and Running Jobs > "
                         "Using GPUs > Binding MPI ranks to GPUs (docs.alcf.anl.gov/polaris)")
# Polaris: one 32-core EPYC in 4 NUMA nodes of 8 cores, and the 4 A100s attached in reverse order:
# GPU 0 is next to cores 24-31, GPU 3 next to cores 0-7 (ALCF's Device Affinity table, from
# `nvidia-smi topo -m`).  `--depth 8 --cpu-bind depth` gives local rank r cores 8r..8r+7, NUMA
# node r, whatever --ppn is, so rank r must use GPU 3 - r.  ALCF documents exactly this pair for one
# GPU per rank: depth binding plus set_affinity_gpu_polaris.sh, which exports
# CUDA_VISIBLE_DEVICES=$((3 - PMI_LOCAL_RANK % 4)) before the program starts.  This is that
# wrapper inline (a file written at launch would sit in one node's /tmp and be missing on the
# others); each rank then sees one GPU, cuda:0, its own.  A `--cpu-bind list:24-31:16-23:...`
# with all GPUs visible would pair them as well, but needs the list rewritten for every --ppn.
POLARIS_CORES_PER_GPU = 8
POLARIS_GPU_BIND = ('r=${PALS_LOCAL_RANKID:?not started by PALS mpiexec}; '
                    'export CUDA_VISIBLE_DEVICES=$((3 - r % 4)); exec "$@"')

# Aurora: 2 sockets of 52 cores; cores 0 and 52 (and their second threads, 104 and 156) are kept
# for the system, and GPUs 0-2 sit on socket 0, 3-5 on socket 1.  ALCF's list for 12 ranks a node
# gives ranks 0-5 8 cores each of socket 0 and ranks 6-11 8 cores each of socket 1
# (docs/aurora/running-jobs-aurora.md, "Binding MPI ranks and threads to cores", Example 4:
# `--cpu-bind=depth` instead would split rank 6 across the sockets).  The GPU side: the frameworks
# module sets ZE_FLAT_DEVICE_HIERARCHY=FLAT, so each of the 12 tiles is one device and, with
# ZE_ENABLE_PCI_ID_DEVICE_ORDER=1, device k is tile k % 2 of GPU k // 2: local rank r takes
# xpu:<r> (scaledl.devices.pick_device), on its own socket, with no mask; ALCF recommends no
# gpu_tile_compact.sh under that module, and its `GPU.tile` masks are not valid under FLAT (Level
# Zero specification, "Affinity Mask").
AURORA_CPU_LISTS = ("1-8", "9-16", "17-24", "25-32", "33-40", "41-48",
                    "53-60", "61-68", "69-76", "77-84", "85-92", "93-100")
AURORA_RESERVED_CPUS = (0, 52, 104, 156)
RESERVED_CPUS = {"aurora": AURORA_RESERVED_CPUS}


def detect_system(env: Mapping[str, str], hostname: str | None = None) -> tuple[str, str]:
    """(system name, the reason) from the batch environment and host names."""
    if "SLURM_JOB_ID" in env:
        return "slurm", f"SLURM_JOB_ID={env['SLURM_JOB_ID']}"
    hostname = hostname if hostname is not None else socket.gethostname()
    nodes = node_list(env)
    clues = [("PBS_JOBID", env.get("PBS_JOBID", "")), ("host", hostname),
             ("PBS_NODEFILE", nodes[0] if nodes else "")]
    for label, text in clues:
        for name, pattern in (("polaris", r"polaris|^x3\d{3}c"), ("aurora", r"aurora|^x4\d{3}c")):
            if text and re.search(pattern, text):
                return name, f"{label} {text}"
    if "PBS_JOBID" in env or "PBS_NODEFILE" in env:
        raise LaunchError(f"a PBS job on a system not known here (PBS_JOBID={env.get('PBS_JOBID', '')!r}): "
                          "name it with --system polaris or --system aurora")
    return "local", "no PBS or Slurm job here"


def node_list(env: Mapping[str, str]) -> list[str]:
    """Host names of the PBS job (one per node), [] outside a job; a bad node file is a LaunchError."""
    nodefile = env.get("PBS_NODEFILE")
    if not nodefile:
        return []
    return list(dict.fromkeys(read_nodefile(nodefile)))


def slurm_nodes(env: Mapping[str, str]) -> int | None:
    return int(env["SLURM_JOB_NUM_NODES"]) if env.get("SLURM_JOB_NUM_NODES", "").isdigit() else None


def slurm_gpus_per_node(env: Mapping[str, str]) -> int:
    """GPUs Slurm gave this job on each node (0 when it gave none)."""
    for name in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        match = re.search(r"(\d+)$", env.get(name, ""))  # "4" or "a100:4"
        if match:
            return int(match.group(1))
    return 0


def slurm_binds_cpus(env: Mapping[str, str]) -> bool | None:
    """Whether this Slurm cluster can bind tasks to CPUs (`srun --cpu-bind`), None when unknown.

    srun's --cpu-bind needs the task/affinity plugin; without it srun prints "cluster
    configuration lacks support for cpu binding" (srun(1), --cpu-bind).  Asked of the
    controller (`scontrol show config`, TaskPlugin) only inside a job, where it answers."""
    if "SLURM_JOB_ID" not in env:
        return None
    scontrol = shutil.which("scontrol", path=env.get("PATH"))
    if scontrol is None:
        return None
    try:
        result = subprocess.run([scontrol, "show", "config"], capture_output=True, text=True, timeout=10,
                                env=dict(env))
    except (OSError, subprocess.TimeoutExpired):
        return None
    return task_plugin_binds_cpus(result.stdout) if result.returncode == 0 else None


def task_plugin_binds_cpus(config: str) -> bool | None:
    """From `scontrol show config`'s text: is task/affinity among the TaskPlugin list?"""
    match = re.search(r"^TaskPlugin\s*=\s*(\S+)", config, re.MULTILINE)
    return "task/affinity" in match.group(1).split(",") if match else None
