"""Which accelerator this process uses, decided in one place.

    device = devices.pick_device()                     # cuda:0, xpu:0, mps or cpu
    device = devices.pick_device(local_rank=3)         # the rank's own GPU (or tile) on its node
    backend = devices.pick_backend(device)             # nccl, xccl, or gloo

Every part of the package that needs to know the accelerator (the rungs, the benchmarks, the
demo, memory and timing) asks here, so a machine with CUDA, with Intel XPUs, or with neither
gets the same answer everywhere.  torch is imported inside the functions: `import scaledl`
stays light.
"""
from __future__ import annotations

import os
import socket

from scaledl.launch_env import LaunchError

BACKENDS = ("nccl", "xccl", "ccl", "gloo", "mpi")
ACCELERATORS = ("cuda", "xpu")


def accelerator() -> str | None:
    """"cuda" or "xpu" when such devices are visible to this process, else None."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    return None


def device_count() -> int:
    """How many accelerators this process sees (0 on a CPU-only machine)."""
    import torch

    kind = accelerator()
    return getattr(torch, kind).device_count() if kind else 0


def pick_device(name: str | None = None, local_rank: int = 0):
    """CUDA or XPU device by local rank, else MPS, else CPU; `name` ("cuda", "cpu", "xpu:1") overrides.

    When a launcher binds one device per rank (CUDA_VISIBLE_DEVICES, ZE_AFFINITY_MASK), each
    rank sees a single device, index 0, whatever its local rank: hence the modulo.
    """
    import torch

    if name:
        try:
            device = torch.device(name)
        except RuntimeError:
            raise LaunchError(f"unknown device {name!r}: use cuda, xpu, mps or cpu") from None
        available = {"cpu": True, "cuda": torch.cuda.is_available(),
                     "xpu": hasattr(torch, "xpu") and torch.xpu.is_available(),
                     "mps": torch.backends.mps.is_available()}
        if not available.get(device.type, False):
            raise LaunchError(f"device {name!r} is not available on {socket.gethostname()}")
        if device.index is None and device.type in ACCELERATORS:
            device = torch.device(device.type, local_rank % getattr(torch, device.type).device_count())
        return device
    kind = accelerator()
    if kind and os.environ.get("DS_ACCELERATOR") == "cpu":
        # DeepSpeed told to run on the CPU puts the model there, yet its launcher shows each rank
        # the GPUs again: its CPU accelerator names CUDA_VISIBLE_DEVICES as its own and sets it to
        # the local slots (visible_devices_envs in accelerator/cpu_accelerator.py, used by
        # launcher/launch.py; DeepSpeed 0.19.8).  Follow DeepSpeed, not the mask.
        kind = None
    if kind:
        return torch.device(kind, local_rank % getattr(torch, kind).device_count())
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_backend(device, name: str | None = None) -> str:
    """nccl for CUDA, xccl for XPU (oneCCL's `ccl` on PyTorch before 2.8), gloo otherwise."""
    import torch.distributed as dist

    if name:
        if name not in BACKENDS:
            raise LaunchError(f"unknown backend {name!r}: use one of {', '.join(BACKENDS)}")
        return name
    if device.type == "cuda":
        return "nccl"
    if device.type == "xpu":
        if getattr(dist, "is_xccl_available", lambda: False)():
            return "xccl"
        import oneccl_bindings_for_pytorch  # noqa: F401  registers the "ccl" backend

        return "ccl"
    return "gloo"


def synchronize(device) -> None:
    """Wait for all work queued on `device` (a torch.device or its type name); no-op on CPU."""
    kind = getattr(device, "type", device)
    if kind in ("cuda", "xpu", "mps"):
        import torch

        getattr(torch, kind).synchronize()


def current_device():
    """The accelerator this process was pinned to (for collectives that need it), else CPU."""
    import torch

    kind = accelerator()
    return torch.device(kind, getattr(torch, kind).current_device()) if kind else torch.device("cpu")


def max_memory_allocated(device) -> int | None:
    """Peak bytes allocated on an accelerator by this process; None on CPU and MPS."""
    kind = getattr(device, "type", device)
    if kind in ACCELERATORS:
        import torch

        return int(getattr(torch, kind).max_memory_allocated(device))
    return None


def node_accelerators() -> tuple[str | None, int]:
    """This node's accelerator kind and count: ("cuda", 4), ("xpu", 12) on Aurora (each tile is one
    device), (None, 0) without any or without torch."""
    try:
        kind = accelerator()
    except ImportError:  # no torch
        return None, 0
    return kind, device_count() if kind else 0


def accelerator_count() -> int:
    """GPUs on this node (XPU devices on Aurora: each tile is one), 0 without any or without torch."""
    return node_accelerators()[1]
