"""Is each rank's CPU next to its GPU?  Read from the node's own sysfs, on any node.

    from scaledl.hpc import binding
    print(binding.this_rank(dist.device).line())    # inside a rank: its cores against its GPU's NUMA node

A GPU sits on one PCI root; Linux records which NUMA node that is in
`/sys/bus/pci/devices/<address>/numa_node`, and which CPUs each NUMA node has in
`/sys/devices/system/node/node<N>/cpulist`.  A rank whose CPU affinity (`os.sched_getaffinity`)
lies inside its GPU's NUMA node is `local`; one with none of its CPUs there is `far` (its data
loader and its copies to the GPU cross the link between NUMA nodes or sockets); one with some
is `split`.  PyTorch's own NUMA binding reads the same two files (torch/numa/binding.py,
`_get_numa_node_index_for_gpu_index`, torch 2.13).

The sysfs root is a parameter, so the same code reads a copy of another node's sysfs: the tests
use recorded trees of a Polaris and an Aurora node (tests/data/sysfs/), and `plan()` works out
where each local rank of a PALS launch lands on such a node, from the launch command itself.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

SYSFS = "/"  # the root under which sys/ is read
GPU_VENDORS = {"0x10de": "cuda", "0x8086": "xpu"}  # NVIDIA, Intel
GPU_CLASSES = ("0x0300", "0x0302", "0x0380")  # VGA, 3D controller, display controller (A100: 0302, PVC: 0380)
TILES_PER_GPU = 2  # Aurora's GPUs (Data Center GPU Max 1550): 2 tiles each, 12 a node (ALCF's Aurora guide)


def parse_cpulist(text: str) -> frozenset[int]:
    """'0-7,32-39' -> {0..7, 32..39}; '' -> {} (a memory-only NUMA node, such as Aurora's HBM)."""
    cpus = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def cpu_runs(cpus) -> list[tuple[int, int]]:
    """{0, 1, 2, 7, 8} -> [(0, 2), (7, 8)]: the contiguous runs of a set of CPUs, in order."""
    runs = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return [(first, last) for first, last in runs]


def format_cpulist(cpus) -> str:
    """{0..7, 32..39} -> '0-7,32-39', the form sysfs and `--cpu-bind list:` use."""
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in cpu_runs(cpus))


def _read(root: str | Path, *parts: str) -> str | None:
    try:
        return Path(root, "sys", *parts).read_text().strip()
    except OSError:
        return None


def numa_nodes(root: str | Path = SYSFS) -> dict[int, frozenset[int]]:
    """NUMA node -> its CPUs, from sys/devices/system/node/node*/cpulist."""
    folder = Path(root, "sys", "devices", "system", "node")
    nodes = {}
    for path in sorted(folder.glob("node[0-9]*")):
        text = _read(root, "devices", "system", "node", path.name, "cpulist")
        if text is not None:
            nodes[int(path.name[4:])] = parse_cpulist(text)
    return nodes


def online_cpus(root: str | Path = SYSFS) -> frozenset[int]:
    text = _read(root, "devices", "system", "cpu", "online")
    return parse_cpulist(text) if text else frozenset()


def gpus(root: str | Path = SYSFS, kind: str | None = None) -> list[str]:
    """PCI addresses of the node's NVIDIA ("cuda") or Intel ("xpu") GPUs, in PCI order.

    PCI order is the order CUDA numbers GPUs with CUDA_DEVICE_ORDER=PCI_BUS_ID, and Level Zero
    with ZE_ENABLE_PCI_ID_DEVICE_ORDER=1 (both are presets of `scaledl launch` on Polaris/Aurora).
    """
    found = []
    for path in Path(root, "sys", "bus", "pci", "devices").glob("*"):
        vendor, klass = _read(root, "bus", "pci", "devices", path.name, "vendor"), \
            _read(root, "bus", "pci", "devices", path.name, "class")
        if vendor in GPU_VENDORS and klass and klass.startswith(GPU_CLASSES):
            if kind is None or GPU_VENDORS[vendor] == kind:
                found.append(path.name.lower())
    return sorted(found)


def gpu_numa_node(address: str, root: str | Path = SYSFS) -> int | None:
    """The NUMA node of a PCI device; None when the kernel does not know it (-1: a one-node machine)."""
    text = _read(root, "bus", "pci", "devices", address.lower(), "numa_node")
    if text is None:
        raise FileNotFoundError(f"no PCI device {address} under {Path(root, 'sys', 'bus', 'pci', 'devices')}")
    node = int(text)
    return node if node >= 0 else None


def gpu_numa_nodes(root: str | Path = SYSFS, kind: str | None = None) -> dict[str, int | None]:
    """Each GPU's PCI address -> its NUMA node, in PCI order (GPU k is the k-th): what
    `scaledl.workshop.plots.node_binding` draws and the lessons' binding check compares against."""
    return {address: gpu_numa_node(address, root) for address in gpus(root, kind)}


@dataclass(frozen=True)
class Placement:
    """Where one rank runs: its CPUs against the NUMA node of its GPU."""

    local_rank: int
    cpus: frozenset[int]
    gpu: str | None  # PCI address of the rank's GPU; None: it has none (the reason says why)
    gpu_node: int | None = None
    node_cpus: frozenset[int] = frozenset()
    cpu_nodes: tuple[int, ...] = ()  # the NUMA nodes the rank's CPUs are on
    reason: str = ""

    @property
    def verdict(self) -> str:
        """local, split or far; "no GPU"; "unknown" on a machine whose kernel knows no NUMA nodes."""
        if self.gpu is None:
            return "no GPU"
        if self.gpu_node is None:
            return "unknown"
        inside = self.cpus & self.node_cpus
        if inside == self.cpus:
            return "local"
        return "split" if inside else "far"

    def line(self) -> str:
        cores = f"CPUs {format_cpulist(self.cpus)} (NUMA {','.join(map(str, self.cpu_nodes)) or '?'})"
        if self.gpu is None:
            return f"local rank {self.local_rank}: {cores}: no GPU ({self.reason})"
        where = f"NUMA {self.gpu_node}, CPUs {format_cpulist(self.node_cpus)}" if self.gpu_node is not None \
            else "NUMA node not known"
        return f"local rank {self.local_rank}: {cores}, GPU {self.gpu} ({where}): {self.verdict}"


def place(local_rank: int, cpus, gpu: str | None, root: str | Path = SYSFS, reason: str = "") -> Placement:
    cpus = frozenset(cpus)
    nodes = numa_nodes(root)
    cpu_nodes = tuple(sorted(node for node, members in nodes.items() if members & cpus))
    if gpu is None:
        return Placement(local_rank, cpus, None, cpu_nodes=cpu_nodes, reason=reason)
    node = gpu_numa_node(gpu, root)
    return Placement(local_rank, cpus, gpu.lower(), node, nodes.get(node, frozenset()) if node is not None
                     else frozenset(), cpu_nodes, reason)


# ---------------------------------------------------------------------------------------------
# Which GPU a rank uses, from what it sees (CUDA_VISIBLE_DEVICES, ZE_AFFINITY_MASK) and its index.

def visible_gpu(kind: str, index: int, env: Mapping[str, str], root: str | Path = SYSFS,
                tiles_per_gpu: int = TILES_PER_GPU) -> tuple[str | None, str]:
    """(PCI address, "") of the device `index` of what this environment makes visible; (None, why).

    CUDA: CUDA_VISIBLE_DEVICES lists physical GPUs (numbered in PCI order). XPU: with
    ZE_FLAT_DEVICE_HIERARCHY=FLAT each tile is a device (GPU g's tiles are g*tiles .. g*tiles+tiles-1)
    and ZE_AFFINITY_MASK lists those flat numbers; `g.t` is only valid under COMPOSITE, where a
    device is a whole GPU (Level Zero specification, "Affinity Mask").
    """
    addresses = gpus(root, kind)
    if not addresses:
        return None, f"no {kind} GPU on this node's PCI bus"
    try:
        return _visible_gpu(kind, index, env, addresses, tiles_per_gpu)
    except ValueError:  # a mask by UUID or another form this model does not read
        mask = env.get("CUDA_VISIBLE_DEVICES" if kind == "cuda" else "ZE_AFFINITY_MASK")
        return None, f"cannot tell which GPU {mask!r} selects"


def _visible_gpu(kind: str, index: int, env: Mapping[str, str], addresses: list[str],
                 tiles_per_gpu: int) -> tuple[str | None, str]:
    if kind == "cuda":
        mask = env.get("CUDA_VISIBLE_DEVICES")
        physical = [int(x) for x in mask.split(",") if x.strip()] if mask is not None else list(range(len(addresses)))
        # CUDA stops at the first index the node does not have: "-1" (or 4 on a node of 4 GPUs) hides every GPU
        # from there on (CUDA Programming Guide, CUDA Environment Variables).
        valid = next((i for i, gpu in enumerate(physical) if not 0 <= gpu < len(addresses)), len(physical))
        physical = physical[:valid]
        if not physical or index >= len(physical):
            return None, f"CUDA_VISIBLE_DEVICES={mask!r} leaves no device {index}"
        return addresses[physical[index]], ""
    tiles = tiles_per_gpu
    flat = env.get("ZE_FLAT_DEVICE_HIERARCHY", "COMPOSITE").upper() == "FLAT"
    units = len(addresses) * (tiles if flat else 1)  # devices before any mask
    mask = env.get("ZE_AFFINITY_MASK")
    entries = [e.strip() for e in mask.split(",") if e.strip()] if mask else [str(u) for u in range(units)]
    if flat and any("." in e for e in entries):
        return None, f"ZE_AFFINITY_MASK={mask} names GPU.tile, which is not valid with ZE_FLAT_DEVICE_HIERARCHY=FLAT"
    if index >= len(entries):
        return None, f"ZE_AFFINITY_MASK={mask!r} leaves no device {index}"
    unit = int(entries[index].split(".")[0])
    gpu = unit // tiles if flat else unit
    return (addresses[gpu], "") if gpu < len(addresses) else (None, f"device {entries[index]} is not on this node")


# ---------------------------------------------------------------------------------------------
# Where the ranks of a PALS `mpiexec` land: a model of its --cpu-bind, checked against ALCF's outputs.

def pals_cpus(cpu_bind: str, depth: int, local_rank: int, available: Sequence[int]) -> frozenset[int]:
    """The CPUs PALS binds local rank `local_rank` to.

    `depth`: the next `depth` CPUs the job may use, in order (ALCF's hello_affinity outputs: on
    Polaris `--depth 8` gives ranks 0-7, 8-15, ...; on Aurora, whose cores 0 and 52 are reserved,
    rank 6 of 12 gets 49-51,53-57). `list:A:B:...`: the rank's own entry. `none`: everything.
    """
    if cpu_bind == "depth":
        return frozenset(available[local_rank * depth:(local_rank + 1) * depth])
    if cpu_bind.startswith("list:"):
        entries = cpu_bind[len("list:"):].split(":")
        return parse_cpulist(entries[local_rank % len(entries)])
    return frozenset(available)


def _option(command: Sequence[str], name: str) -> str | None:
    for i, word in enumerate(command):
        if word == name and i + 1 < len(command):
            return command[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def wrapper_env(command: Sequence[str], local_rank: int, env: Mapping[str, str]) -> dict[str, str]:
    """The environment a rank has after the launch command's inline `bash -c WRAPPER` ran (if any)."""
    rank_env = {**env, "PALS_LOCAL_RANKID": str(local_rank), "PMI_LOCAL_RANK": str(local_rank)}
    if "bash" in command and command[command.index("bash") + 1] == "-c":
        at = command.index("bash")
        script, name = command[at + 2], command[at + 3]
        printed = subprocess.run(["bash", "-c", script, name, "env", "-0"], env={"PATH": os.defpath, **rank_env},
                                 capture_output=True, text=True, check=True).stdout
        rank_env = dict(item.split("=", 1) for item in printed.split("\0") if "=" in item)
    return rank_env


def plan(command: Sequence[str], env: Mapping[str, str], kind: str, ranks: int, root: str | Path = SYSFS,
         reserved: Sequence[int] = ()) -> list[Placement]:
    """Where each of `ranks` local ranks of a PALS mpiexec `command` runs on the node under `root`.

    Each rank's CPUs come from the command's --cpu-bind/--depth, its environment from running the
    command's inline wrapper, and its device from `scaledl.devices.pick_device`'s rule: device
    local_rank modulo what the rank sees.
    """
    available = sorted(online_cpus(root) - set(reserved))
    cpu_bind, depth = _option(command, "--cpu-bind") or "none", int(_option(command, "--depth") or 1)
    placements = []
    for local_rank in range(ranks):
        cpus = pals_cpus(cpu_bind, depth, local_rank, available)
        try:
            rank_env = wrapper_env(command, local_rank, env)
        except subprocess.CalledProcessError as error:  # bash refused the wrapper: the rank never starts
            lines = error.stderr.strip().splitlines() or [f"exit status {error.returncode}"]
            placements.append(place(local_rank, cpus, None, root, f"its wrapper failed: {lines[-1]}"))
            continue
        seen = visible_count(kind, rank_env, root)
        gpu, why = visible_gpu(kind, local_rank % seen if seen else 0, rank_env, root)
        placements.append(place(local_rank, cpus, gpu, root, why))
    return placements


def visible_count(kind: str, env: Mapping[str, str], root: str | Path = SYSFS) -> int:
    """How many devices a process with this environment sees (what torch's device_count() would say)."""
    count = 0
    while visible_gpu(kind, count, env, root)[0] is not None:
        count += 1
    return count


# ---------------------------------------------------------------------------------------------
# Inside a running rank.

def device_address(device, env: Mapping[str, str] | None = None, root: str | Path = SYSFS) -> tuple[str | None, str]:
    """PCI address of a torch device (CUDA: from its properties; XPU: from its index and the mask)."""
    import torch

    env = dict(os.environ if env is None else env)
    kind = getattr(device, "type", str(device))
    if kind not in GPU_VENDORS.values():
        return None, f"the rank runs on {kind}"
    index = device.index if getattr(device, "index", None) is not None else getattr(torch, kind).current_device()
    props = getattr(torch, kind).get_device_properties(index)
    if all(hasattr(props, name) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        return f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0", ""
    return visible_gpu(kind, index, env, root)


def visible_unit(kind: str, index: int, env: Mapping[str, str]) -> str:
    """Which device of the node `index` is, as the mask names it: the physical GPU's number for CUDA,
    the flat tile number (or COMPOSITE's GPU) for XPU.  Unique on a node, where a PCI address is not:
    under FLAT both tiles of an Aurora GPU are devices of their own and report the GPU's one address."""
    name = "CUDA_VISIBLE_DEVICES" if kind == "cuda" else "ZE_AFFINITY_MASK"
    entries = [e.strip() for e in env[name].split(",") if e.strip()] if env.get(name) else []
    return entries[index] if index < len(entries) else str(index)


def identity(kind: str, index: int, env: Mapping[str, str], root: str | Path = SYSFS, uuid: str | None = None) -> str:
    """`device_identity` from what a rank knows of its device: the UUID when there is one, else the PCI
    address of device `index` with the unit the mask selects."""
    if uuid:
        return str(uuid)
    address, why = visible_gpu(kind, index, env, root)
    return f"{address or why} unit {visible_unit(kind, index, env)}"


def device_identity(device, env: Mapping[str, str] | None = None, root: str | Path = SYSFS) -> str | None:
    """What tells this rank's device from every other on the node; None on the CPU.

    The device's UUID where torch reports one (`get_device_properties(i).uuid`: CUDA, and XPU since
    PyTorch 2.9, pytorch/pytorch#161392); else its PCI address with the unit the mask selects
    (`visible_unit`): two ranks on the two tiles of one Aurora GPU share the address, not the tile.
    Ranks masked to one device each all see device 0, so an index tells nothing either."""
    import torch

    env = dict(os.environ if env is None else env)
    kind = getattr(device, "type", str(device))
    if kind not in GPU_VENDORS.values():
        return None
    index = device.index if getattr(device, "index", None) is not None else getattr(torch, kind).current_device()
    return identity(kind, index, env, root, getattr(getattr(torch, kind).get_device_properties(index), "uuid", None))


def ranks_problems(devices: Sequence[str], identities: Sequence[str | None], verdicts: Sequence[str]) -> list[str]:
    """What is wrong with a node's ranks, from what each reported (its device name, `device_identity`,
    its placement's verdict): two ranks on one device, or a rank whose cores are split from or far
    from its GPU.  "unknown" (no NUMA node for the GPU in sysfs, as in many VMs) tells nothing either
    way, and ranks on the CPU have no GPU to share.  Empty: ready."""
    on_gpus = [(identity, verdict) for device, identity, verdict in zip(devices, identities, verdicts)
               if device != "cpu"]
    problems = []
    seen = [identity for identity, _ in on_gpus]
    shared = sorted({identity for identity in seen if seen.count(identity) > 1}, key=str)
    if shared:
        problems.append(f"two ranks share a device ({', '.join(map(str, shared))}): give each rank its own "
                        "(one rank per GPU, or per tile on Aurora)")
    away = [verdict for _, verdict in on_gpus if verdict not in ("local", "unknown")]
    if away:
        problems.append(f"not every rank runs next to its GPU ({', '.join(verdicts)}): see scaledl doctor")
    return problems


def this_rank(device, local_rank: int | None = None, root: str | Path = SYSFS) -> Placement:
    """This process's CPU affinity against the NUMA node of `device` (a torch device)."""
    if local_rank is None:
        from scaledl import distributed

        local_rank = distributed.find_job().local_rank
    gpu, why = device_address(device, root=root)
    return place(local_rank, os.sched_getaffinity(0), gpu, root, why)


def summary(placements: Sequence[Placement]) -> str:
    verdicts = [p.verdict for p in placements]
    counts = {v: verdicts.count(v) for v in ("local", "split", "far", "no GPU", "unknown") if v in verdicts}
    return ", ".join(f"{n} {v}" for v, n in counts.items())

