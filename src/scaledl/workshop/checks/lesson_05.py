"""Lesson 5's checks: what a summed gradient does to SGD's step, and Horovod's sync in PyTorch."""
from __future__ import annotations

from scaledl.workshop.checks.common import _verdict, gather
from scaledl.workshop.checks.lesson_04 import check_horovod_sync  # noqa: F401  (lesson 5 checks the same sync)


def _close(a: list, b: list, tolerance: float) -> bool:
    return len(a) == len(b) and all(abs(float(x) - float(y)) <= tolerance * max(1.0, abs(float(y)))
                                    for x, y in zip(a, b))


def check_summed_step(results_by_rank: list, references_by_rank: list, world_size: int,
                      tolerance: float = 1e-5) -> bool:
    """Each rank gives {"summed": its gradient g summed over ranks, "stepped": the weights after one plain
    SGD step from w with it}; its reference {"w", "lr", "own": its own g, "global_gradient": the gradient
    of the mean over every rank's samples, "one_process": w - lr * global_gradient} says what one
    process on all the samples does.  With micro batches of one size the global gradient is the
    average of the ranks' g, so the sum is world_size times it and the step needs lr / world_size."""
    if results_by_rank is None:
        return False
    if len(results_by_rank) < 2:
        return _verdict(False, "one rank has nobody to sum with: start 2 or more (WORLD_SIZE = 2)")
    if references_by_rank is None or any(r is None for r in references_by_rank):
        return _verdict(False, "the reference cell did not finish on every rank: run the cells above in order")
    if any(r is None or r.get("summed") is None or r.get("stepped") is None for r in results_by_rank):
        return _verdict(False, "the exercise cell did not finish on every rank: set summed and stepped, and run it")
    for rank, (result, reference) in enumerate(zip(results_by_rank, references_by_rank)):
        w, lr, own = reference["w"], float(reference["lr"]), reference["own"]
        mean, right = reference["global_gradient"], reference["one_process"]
        summed, stepped = list(result["summed"]), list(result["stepped"])

        def step(scale, gradient=mean):
            return [wi - lr * scale * gi for wi, gi in zip(w, gradient)]

        if not _close(summed, [world_size * g for g in mean], tolerance):
            hint = ("that is the average: Horovod averages unless told otherwise: ask for the sum (op=hvd.Sum)"
                    if _close(summed, mean, tolerance) else
                    "that is this rank's own gradient: all-reduce it over the ranks" if _close(summed, own, tolerance)
                    else "sum g over every rank with Horovod's all-reduce")
            return _verdict(False, f"rank {rank}: summed is not the sum of the ranks' gradients: {hint}")
        if _close(stepped, right, tolerance):
            continue
        if _close(stepped, step(world_size), tolerance):
            hint = (f"the step is {world_size}x too large: the sum is {world_size}x the average, so plain SGD at the "
                    f"same lr steps {world_size}x as far: divide lr (or the sum) by world_size")
        elif _close(stepped, step(1 / world_size), tolerance):
            hint = (f"the step is {world_size}x too small: the sum divided by world_size is already the average, "
                    "which takes lr as it is")
        elif _close(stepped, step(-world_size), tolerance) or _close(stepped, step(-1), tolerance):
            hint = "the step goes uphill: subtract lr times the gradient from w"
        elif _close(stepped, step(1, own), tolerance) or _close(stepped, step(world_size, own), tolerance):
            hint = "the step uses this rank's own gradient: use summed, the ranks' sum"
        else:
            hint = "one plain SGD step from w: w - lr * gradient, with the gradient of the mean over all the samples"
        return _verdict(False, f"rank {rank}: stepped is not one process's step on all {world_size} ranks' "
                               f"samples: {hint}")
    return _verdict(True, f"every rank holds the sum, {world_size}x the average, and steps as one process on all "
                          f"{world_size} ranks' samples: a summed gradient takes lr / {world_size}")


def check_resumed_start(starts_by_rank: list) -> bool:
    """Exercise 2, the order of a resumed start.  Each rank gives {"optimizer": the fingerprint of its
    optimizer's state when the loop starts, "resumed": the fingerprint of its own checkpoint, taken before
    the exercise's block}.  Every rank must start from rank 0's checkpoint: wrap (the wrapper is a new
    optimizer with an empty state), load the checkpoint into the wrapped optimizer, then broadcast.  A rank
    that starts from its own checkpoint loaded after the broadcast (or had none); ranks that agree on a
    state that is not rank 0's checkpoint lost it in the wrap."""
    if starts_by_rank is None or any(s is None for s in starts_by_rank):
        return _verdict(False, "the exercise cell did not finish on every rank: write the four calls and run it")
    if len(starts_by_rank) < 2:
        return _verdict(False, "one rank has nobody to take rank 0's state from: start 2 or more (WORLD_SIZE = 2)")
    want = starts_by_rank[0]["resumed"]
    for rank, start in enumerate(starts_by_rank):
        if start["optimizer"] == want:
            continue
        if rank > 0 and start["optimizer"] == start["resumed"]:
            return _verdict(False, f"rank {rank} starts from its own checkpoint's optimizer state, not rank 0's: "
                                   "broadcast rank 0's optimizer state after loading the checkpoint; a load after the "
                                   "broadcast puts each rank's own momentum back")
        return _verdict(False, f"rank {rank} starts from an optimizer state that is not rank 0's checkpoint: the "
                               "wrapper is a new optimizer with an empty state, so wrap first, then load the "
                               "checkpoint into the wrapped optimizer, then broadcast")
    return _verdict(True, f"all {len(starts_by_rank)} ranks start from rank 0's checkpointed momentum: wrapped, "
                          "loaded, then broadcast")


def horovod_gradient_names(view) -> list:
    """Per live rank, the sorted names that the rank's `optimizer`, a Horovod DistributedOptimizer, gives the
    gradients' all-reduces; None on a rank where they cannot be read (no wrapped optimizer there).  Horovod
    keeps them in `_parameter_names`, a private attribute (horovod/torch/optimizer.py, 0.28.1): the check reads
    it so that the lesson's cells need not.  In a script of your own, Horovod's timeline
    (`horovodrun --timeline-filename FILE`, docs/timeline.rst) shows each all-reduce under its name."""
    return gather(view, "sorted(optimizer._parameter_names.values())")
