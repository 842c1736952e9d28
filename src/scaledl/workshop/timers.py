"""Timers for lesson 12's live ranks: the wall time a step spends in the collectives that DTensor issues.

`AllReduceTimer` is a `TorchDispatchMode`: while it is active it sees every operation on plain tensors.  DTensor
turns an operation on its tensors into plain operations and functional collectives (`_c10d_functional.*`, the
operations `torch.distributed.tensor.debug.CommDebugMode` counts), so the timer returns `NotImplemented` for
DTensors and times only what they become.  On a GPU, NCCL runs the collectives on a stream of their own and the
wait only makes the compute stream wait for them (torch's `wait_tensor`), so the timer sees the host's launch cost,
not the collectives' time: time them with CUDA events or torch.profiler there.
"""
from __future__ import annotations

import time


def _dispatch_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


class AllReduceTimer(_dispatch_mode()):
    """Adds up the wall time of the collectives DTensor issues while a step runs: each all-reduce and the wait
    for its result.  `seconds`: their total; `all_reduces`: how many all-reduces it saw."""

    def __init__(self):
        super().__init__()
        self.seconds, self.all_reduces = 0.0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import torch
        from torch.distributed._functional_collectives import AsyncCollectiveTensor
        from torch.distributed.tensor import DTensor

        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **(kwargs or {}))  # not an operation on tensors: run it as it is
        if any(issubclass(kind, (DTensor, AsyncCollectiveTensor)) for kind in types):
            return NotImplemented  # let DTensor turn the operation into plain ones and collectives first
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        if str(func).startswith("_c10d_functional."):  # a collective, or the wait for its result
            self.seconds += time.perf_counter() - start
            self.all_reduces += str(func).startswith("_c10d_functional.all_reduce")
        return out


def median_run(step, repeats: int = 20, device=None) -> tuple[float, AllReduceTimer]:
    """`step()` run `repeats` times, the ranks starting each run together (a barrier when a process group is up):
    the run of median wall time, as (seconds, that run's AllReduceTimer).  On a CUDA `device` the clock is read
    after the GPU's work has finished."""
    import torch
    import torch.distributed as tdist

    runs = []
    for _ in range(repeats):
        if tdist.is_available() and tdist.is_initialized():
            tdist.barrier()
        timer = AllReduceTimer()
        start = time.perf_counter()
        with timer:
            step()
        if device is not None and torch.device(device).type == "cuda":
            torch.cuda.synchronize()  # GPU kernels run asynchronously: wait for them before reading the clock
        runs.append((time.perf_counter() - start, timer))
    return sorted(runs, key=lambda run: run[0])[repeats // 2]
