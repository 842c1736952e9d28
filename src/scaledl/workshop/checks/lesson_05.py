"""Lesson 5's checks: Horovod's all-reduce and broadcast in PyTorch."""
from __future__ import annotations

from scaledl.workshop.checks.common import _verdict
from scaledl.workshop.checks.lesson_04 import check_horovod_sync  # noqa: F401  (lesson 5 checks the same sync)


def check_horovod_allreduce(results_by_rank: list, world_size: int) -> bool:
    """Each rank all-reduces rank + 1 twice: (total with op=hvd.Sum, average with the default)."""
    if results_by_rank is None:
        return False
    want_total, want_average = world_size * (world_size + 1) / 2, (world_size + 1) / 2
    for rank, (total, average) in enumerate(results_by_rank):
        total, average = float(total), float(average)
        if total != want_total:
            hint = ("Horovod averages unless told otherwise: ask for a sum" if total == want_average
                    else "it still holds its own value: all-reduce it, on every rank" if total == rank + 1
                    else "sum it, on every rank")
            return _verdict(False, f"rank {rank}: total is {total:g}, expected {want_total:g}: {hint}")
        if average != want_average:
            hint = ("that is the sum: leave the op at its default, the average" if average == want_total
                    else "it still holds its own value: all-reduce it, on every rank" if average == rank + 1
                    else "average it (the default op), on every rank")
            return _verdict(False, f"rank {rank}: average is {average:g}, expected {want_average:g}: {hint}")
    return _verdict(True, f"every rank holds the sum {want_total:g} and the average {want_average:g}")
