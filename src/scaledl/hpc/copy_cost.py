"""How long a batch takes to reach the device from each NUMA node's cores: what a far rank costs.

    from scaledl.hpc import copy_cost
    rows = copy_cost.measure(torch.device("cuda", 0))   # one row per NUMA node and batch size
    print(copy_cost.table(rows))

    python -m scaledl.hpc.copy_cost --device cuda           # the same, on a GPU node (exit 2 on bad input)

A rank's data loader puts each batch in host memory and copies it to the GPU. For each NUMA node
of this machine, the calling thread moves onto that node's CPUs and allocates the batch there:
Linux's default policy places a page on the NUMA node of the CPU that first touches it
(set_mempolicy(2), MPOL_DEFAULT: "local allocation", "allocate memory on the node of the CPU
that triggered the allocation"), and a pinned buffer's pages are touched when it is locked. Then it
times host-to-device copies of that buffer. A row whose node is the GPU's own is what a local
rank pays; the other rows are what a far rank pays. On a machine with one NUMA node every row
is local; on the CPU the "copy" is a host memcpy into memory allocated before the first move.

The buffers stay allocated until the end: PyTorch's caching host allocator would otherwise hand
the first node's freed pinned block to the next node (c10/cuda/CachingHostAllocator).
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass

from scaledl.hpc import binding

MB = 1e6
# These lessons' batch (64 MNIST images, 28x28 fp32) and an ImageNet one (256 x 3x224x224 fp32).
SIZES = {"MNIST batch 64": 64 * 28 * 28 * 4, "ImageNet batch 256": 256 * 3 * 224 * 224 * 4}


@dataclass(frozen=True)
class Row:
    node: int              # the NUMA node whose CPUs allocated and copied the batch
    device_node: int | None  # the device's NUMA node (None: unknown, a one-node machine, or the CPU)
    name: str
    nbytes: int
    pinned: bool
    seconds: float         # median of the timed copies

    @property
    def gb_per_s(self) -> float:
        return self.nbytes / self.seconds / 1e9

    @property
    def where(self) -> str:
        if self.device_node is None:
            return "local" if self.node == 0 else "?"
        return "local" if self.node == self.device_node else "far"


def _sync(device) -> None:
    if device.type != "cpu":
        getattr(__import__("torch"), device.type).synchronize(device)


def _time_copies(src, dst, device, repeats: int) -> float:
    times = []
    for _ in range(repeats + 2):  # the first two warm up (driver staging buffers, page tables)
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src, non_blocking=False)
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def measure(device, sizes: dict[str, int] | None = None, pinned: bool = True, repeats: int = 20,
            nodes: dict[int, frozenset[int]] | None = None) -> list[Row]:
    """Time host-to-`device` copies of each size from memory on each NUMA node (its median copy)."""
    import torch

    device = torch.device(device)
    sizes = SIZES if sizes is None else sizes
    nodes = {k: v for k, v in (binding.numa_nodes() if nodes is None else nodes).items() if v}
    if not nodes:  # no sysfs NUMA tree (a container without /sys/devices/system/node): one node
        nodes = {0: frozenset(os.sched_getaffinity(0))}
    if pinned and device.type == "cpu":
        pinned = False  # pinning only matters to a device's DMA engine
    device_node = None
    if device.type != "cpu":
        address, _ = binding.device_address(device)
        device_node = binding.gpu_numa_node(address) if address else None
    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    # One thread: torch's intra-op pool would otherwise touch the pages from its own threads,
    # whose CPUs a move of this thread does not change.
    torch.set_num_threads(1)
    rows, keep = [], []
    try:
        targets = {name: torch.empty(n, dtype=torch.uint8, device=device) for name, n in sizes.items()}
        for node, cpus in sorted(nodes.items()):
            os.sched_setaffinity(0, cpus)
            for name, n in sizes.items():
                src = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
                src.fill_(1)
                keep.append(src)
                rows.append(Row(node, device_node, name, n, pinned,
                                _time_copies(src, targets[name], device, repeats)))
    finally:
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)
    return rows


def table(rows: list[Row]) -> str:
    lines = [f"{'NUMA node':>9} {'':5} {'batch':<20} {'MB':>7} {'memory':<8} {'ms':>8} {'GB/s':>6}"]
    for r in rows:
        lines.append(f"{r.node:>9} {r.where:5} {r.name:<20} {r.nbytes / MB:>7.1f} "
                     f"{'pinned' if r.pinned else 'pageable':<8} {r.seconds * 1e3:>8.3f} {r.gb_per_s:>6.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    from scaledl.config import OneLineParser

    parser = OneLineParser(prog="python -m scaledl.hpc.copy_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, xpu, xpu:N, mps or cpu (default cuda)")
    parser.add_argument("--repeats", type=int, default=20, help="timed copies per row (default 20)")
    parser.add_argument("--pageable", action="store_true", help="also time pageable (not pinned) memory")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        print(f"error: --repeats {args.repeats} must be at least 1", file=sys.stderr)
        return 2
    from scaledl.devices import pick_device
    from scaledl.launch_env import LaunchError

    try:
        device = pick_device(args.device)  # the rungs' own check of --device
    except LaunchError as error:
        print(f"error: --device: {error}", file=sys.stderr)
        return 2
    rows = measure(device, repeats=args.repeats)
    if args.pageable and device.type != "cpu":
        rows += measure(device, pinned=False, repeats=args.repeats)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
