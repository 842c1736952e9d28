"""Lesson 4's checks: Horovod's broadcast and averaging (TensorFlow), and its tensor fusion."""
from __future__ import annotations

import math

from scaledl.workshop.checks.common import _attempt, _FAILED, _unfinished, _verdict

# Where Horovod's broadcast belongs and what averages the gradients, per framework: TensorFlow
# broadcasts after the first step (the optimizer makes its variables then), PyTorch before it.
_HOROVOD_FIXES = {
    "tf": ("after the first step",
           "broadcast rank 0's model variables after the first step (hvd.broadcast_variables)",
           "broadcast the optimizer's variables too (optimizer_variables, from optimizer.variables), not only "
           "the model's",
           "average the gradients: wrap the tape in hvd.DistributedGradientTape"),
    "torch": ("before the first step",
              "broadcast rank 0's parameters before training (hvd.broadcast_parameters)",
              "broadcast rank 0's optimizer state too (hvd.broadcast_optimizer_state)",
              "average the gradients: wrap the optimizer in hvd.DistributedOptimizer"),
}


def check_horovod_sync(fingerprints_by_rank: list, framework: str, errors_by_rank: list | None = None,
                       names_by_rank: list | None = None, tolerance: float = 1e-5) -> bool:
    """Horovod's duties, checked apart.  Each rank gives [weights at the start, optimizer state at
    the start, weights after the last step]: equal starts need the two broadcasts, equal ends the
    averaged gradients.  (Two entries, [start, end], check the weights alone.)

    Equal is not enough: summed gradients keep the ranks equal too.  `errors_by_rank` holds, per
    rank, {"average": largest difference of its trained weights from one process that took the
    same steps on the global batch (every rank's micro batches) from the same start, "sum": the
    same against that process with its gradients multiplied by world_size}: the weights must
    match the first within `tolerance`.

    `names_by_rank` (PyTorch): per rank, the names Horovod's DistributedOptimizer gives the gradients'
    all-reduces.  Without `named_parameters` it makes them up as `allreduce.noname.<group>.<index>`
    (horovod/torch/optimizer.py, 0.28.1): the job still trains, but the names come from the optimizer's
    parameter groups, not the model, so Horovod's timeline and its errors name no layer."""
    if fingerprints_by_rank is None:
        return False
    if len(fingerprints_by_rank) < 2:
        return _verdict(False, "one rank has nobody to agree with: start 2 or more (WORLD_SIZE = 2)")
    if any(len(f) < 2 or None in f for f in fingerprints_by_rank):
        return _verdict(False, "the training cell did not finish on every rank: finish the exercise above and "
                               "run both cells")
    when, weights_hint, optimizer_hint, average_hint = _HOROVOD_FIXES[framework]
    checks = [(0, f"weights {when}", weights_hint)]
    if len(fingerprints_by_rank[0]) > 2:
        checks.append((1, f"optimizer state (momentum) {when}", optimizer_hint))
    checks.append((-1, "weights after the last step", average_hint))
    for index, what, hint in checks:
        differing = [rank for rank, f in enumerate(fingerprints_by_rank) if f[index] != fingerprints_by_rank[0][index]]
        if differing:
            return _verdict(False, f"rank {differing[0]} holds different {what} than rank 0: {hint}")
    if errors_by_rank is None:
        return _verdict(True, f"all {len(fingerprints_by_rank)} ranks start from rank 0's weights and optimizer "
                              "state and stay identical after every step")
    if any(e is None for e in errors_by_rank):
        return _verdict(False, "the reference cell did not finish on every rank: run the cells above in order")
    world_size = len(fingerprints_by_rank)
    if names_by_rank is not None:
        if any(names is None for names in names_by_rank):
            return _verdict(False, "the training cell did not finish on every rank: finish the exercise above and "
                                   "run both cells")
        unnamed = sorted({name for names in names_by_rank for name in names if name.startswith("allreduce.noname")})
        if unnamed:
            return _verdict(False, f"Horovod calls the gradients {unnamed[0]}, ...: pass "
                                   "named_parameters=model.named_parameters() to DistributedOptimizer, so each "
                                   "all-reduce carries its layer's name (the timeline and Horovod's errors use it)")
    worst = max(errors_by_rank, key=lambda e: e["average"])
    if worst["average"] > tolerance:
        if worst.get("sum", math.inf) <= tolerance:
            return _verdict(False, f"the ranks agree, and end where one process with {world_size}x its gradients does: "
                                   "the gradients were summed over ranks: leave the reduction at Horovod's default")
        return _verdict(False, f"the ranks agree, but their weights differ from one process's steps on the global "
                               f"batch by {worst['average']:.2g}: average the gradients over ranks, nothing more")
    return _verdict(True, f"all {world_size} ranks start from rank 0's weights and optimizer state, stay identical, "
                          f"and from there end where one process on the global batch does (within {tolerance:g})")



def horovod_fuse(tensors: list, threshold: int) -> list[list[str]]:
    """Horovod's packing of one cycle's tensors (`[(name, bytes)]` in its order) into fusion
    buffers: greedily in order, the next tensor joins while the buffer stays within the threshold,
    else it starts the next buffer; a tensor larger than the threshold goes alone
    (`Controller::FuseResponses`, horovod/common/controller.cc, v0.28.1, for tensors of one type)."""
    buffers, used = [], 0
    for name, nbytes in tensors:
        if buffers and used + nbytes <= threshold:
            buffers[-1].append(name)
            used += nbytes
        else:
            buffers.append([name])
            used = nbytes
    return buffers


# (tensors in Horovod's order, threshold): a case where packing in order differs from sorting by size,
# one where a buffer fills exactly, one tensor larger than the threshold, fusion off, and all in one.
_FUSION_CASES = [
    ([("a", 40), ("b", 30), ("c", 50), ("d", 20)], 100),
    ([("a", 60), ("b", 40), ("c", 10)], 100),
    ([("a", 30), ("b", 200), ("c", 30), ("d", 30)], 100),
    ([("a", 10), ("b", 10), ("c", 10)], 0),
    ([("a", 10), ("b", 20), ("c", 30)], 2**27),
]


def check_fusion(fuse) -> bool:
    """`fuse(tensors, threshold) -> [[names of one buffer], ...]` against Horovod's own packing."""
    if fuse is None:
        return _unfinished("fuse")
    for tensors, threshold in _FUSION_CASES:
        case = f"{', '.join(f'{name} {nbytes} B' for name, nbytes in tensors)} with a threshold of {threshold} B"
        got = _attempt("fuse", case, lambda: [list(buffer) for buffer in fuse(list(tensors), threshold)])
        if got is _FAILED:
            return False
        want = horovod_fuse(tensors, threshold)
        if got == want:
            continue
        sizes = dict(tensors)
        flat = [name for buffer in got for name in buffer]
        if sorted(flat) != sorted(sizes):
            hint = "every tensor goes in exactly one buffer"
        elif flat != [name for name, _ in tensors]:
            hint = "Horovod keeps the tensors in its order: it packs them as they come, it does not sort or look back"
        elif any(sum(sizes[name] for name in buffer) > threshold and len(buffer) > 1 for buffer in got):
            hint = "a buffer holds at most the threshold: the tensor that would pass it starts the next buffer"
        elif len(got) == len(tensors):
            hint = "tensors that fit together within the threshold share one buffer: that is the point of fusion"
        else:
            hint = "a tensor joins the buffer while the total stays within the threshold (at most, not below)"
        return _verdict(False, f"{case}: you made {got}, Horovod makes {want}: {hint}")
    return _verdict(True, f"all {len(_FUSION_CASES)} cases packed as Horovod packs them: in order, each buffer at "
                          "most the threshold, a larger tensor alone")
