"""Lesson 4's checks (Horovod's sync and fusion): each passes the solution, FAILs on what an untouched exercise
leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one line."""

import pytest

from conftest import fails, verdict
from scaledl.workshop import checks


def test_horovod_sync_check_names_the_missing_part(capsys):
    for framework in ("tf", "torch"):
        assert checks.check_horovod_sync([["w", "o", "e"], ["w", "o", "e"]], framework)
        verdict(capsys)
    # No broadcast at all: the weights differ from the start.
    fails(capsys, checks.check_horovod_sync([["w", "o", "e"], ["v", "p", "f"]], "tf"),
          "different weights after the first step", "hvd.broadcast_variables")
    fails(capsys, checks.check_horovod_sync([["w", "o", "e"], ["v", "p", "f"]], "torch"),
          "different weights before the first step", "hvd.broadcast_parameters")
    # The weights broadcast, the optimizer state forgotten (rank 0 had resumed with momentum).
    fails(capsys, checks.check_horovod_sync([["w", "o", "e"], ["w", "p", "f"]], "tf"),
          "optimizer state", "optimizer.variables")
    fails(capsys, checks.check_horovod_sync([["w", "o", "e"], ["w", "p", "f"]], "torch"),
          "optimizer state", "hvd.broadcast_optimizer_state")
    # Broadcasts right, gradients never averaged.
    fails(capsys, checks.check_horovod_sync([["w", "o", "e"], ["w", "o", "f"]], "tf"), "hvd.DistributedGradientTape")
    fails(capsys, checks.check_horovod_sync([["w", "o", "e"], ["w", "o", "f"]], "torch"), "hvd.DistributedOptimizer")
    # The exercise raised before the first step ended.
    fails(capsys, checks.check_horovod_sync([[], []], "tf"), "did not finish on every rank")
    assert not checks.check_horovod_sync(None, "torch")
    fails(capsys, checks.check_horovod_sync([["w", "o", "e"]], "torch"), "start 2 or more")


SAME = [["w", "o", "e"], ["w", "o", "e"]]


@pytest.mark.parametrize("framework", ["tf", "torch"])
def test_horovod_sync_check_compares_with_one_process_on_the_global_batch(framework, capsys):
    """Ranks that agree can still be wrong together: the trained weights must be those of one
    process that took the same steps on every rank's micro batches at once."""
    right = {"average": 3e-8, "sum": 4e-3}
    assert checks.check_horovod_sync(SAME, framework, [right, right])
    assert "end where one process on the global batch does" in verdict(capsys)
    # Unusual but right: 4 ranks, float rounding of a GPU reduction, still inside the tolerance.
    close = {"average": 2e-6, "sum": 1e-2}
    assert checks.check_horovod_sync(SAME * 2, framework, [close] * 4)
    verdict(capsys)
    # op=hvd.Sum: the ranks agree, and match the process whose gradients are world_size times larger.
    summed = {"average": 4e-3, "sum": 1e-8}
    fails(capsys, checks.check_horovod_sync(SAME, framework, [summed, summed]), "summed over ranks",
          "2x its gradients")
    # The gradients averaged twice (the loss divided by world_size too), or an lr scaled by hand: agreed, but off.
    off = {"average": 2e-3, "sum": 6e-3}
    fails(capsys, checks.check_horovod_sync(SAME, framework, [off, off]), "differ from one process's steps",
          "by 0.002")
    # One rank's error is enough.
    fails(capsys, checks.check_horovod_sync(SAME, framework, [right, summed]), "summed over ranks")
    fails(capsys, checks.check_horovod_sync(SAME, framework, [right, None]), "reference cell did not finish")
    # Equal fingerprints are checked first: a missing broadcast is named as such, whatever the errors.
    fails(capsys, checks.check_horovod_sync([["w", "o", "e"], ["w", "p", "e"]], framework, [right, right]),
          "optimizer state")


def test_horovod_sync_check_wants_the_gradients_named_after_the_model(capsys):
    right = {"average": 3e-8, "sum": 4e-3}
    named = [["fc.weight", "fc.bias"], ["fc.weight", "fc.bias"]]
    assert checks.check_horovod_sync(SAME, "torch", [right, right], named)
    verdict(capsys)
    # Without named_parameters Horovod trains just as well, under names it makes up.
    unnamed = [["allreduce.noname.0.0", "allreduce.noname.0.1"]] * 2
    fails(capsys, checks.check_horovod_sync(SAME, "torch", [right, right], unnamed), "allreduce.noname.0.0",
          "named_parameters=model.named_parameters()")
    fails(capsys, checks.check_horovod_sync(SAME, "torch", [right, right], [named[0], None]), "did not finish")
    # With the names right, a wrong average is still named.
    summed = {"average": 4e-3, "sum": 1e-8}
    fails(capsys, checks.check_horovod_sync(SAME, "torch", [summed, summed], named), "summed over ranks")


def fuse_right(tensors, threshold):
    buffers, used = [], 0
    for name, nbytes in tensors:
        if buffers and used + nbytes <= threshold:
            buffers[-1].append(name)
            used += nbytes
        else:
            buffers.append([name])
            used = nbytes
    return buffers


def fuse_with(strict=False, overfill=False, sort=False):
    """Horovod's packing with one slip: a buffer must stay below the threshold, the tensor that
    passes it still joins, or the tensors sorted by size first (bin packing)."""
    def fuse(tensors, threshold):
        tensors = sorted(tensors, key=lambda t: -t[1]) if sort else tensors
        buffers, used = [], 0
        for name, nbytes in tensors:
            fits = used + nbytes < threshold if strict else used + nbytes <= threshold
            if buffers and (fits or (overfill and used < threshold)):
                buffers[-1].append(name)
                used += nbytes
            else:
                buffers.append([name])
                used = nbytes
        return buffers
    return fuse


def test_fusion_check(capsys):
    assert checks.check_fusion(fuse_right)
    assert "PASS: all 5 cases" in verdict(capsys)
    fails(capsys, checks.check_fusion(None), "`fuse` is not set")
    fails(capsys, checks.check_fusion(lambda tensors, threshold: [[name for name, _ in tensors]]),
          "at most the threshold")  # one buffer, whatever the threshold
    fails(capsys, checks.check_fusion(lambda tensors, threshold: [[name] for name, _ in tensors]),
          "share one buffer")  # fusion off
    fails(capsys, checks.check_fusion(fuse_with(strict=True)), "at most, not below")
    fails(capsys, checks.check_fusion(fuse_with(overfill=True)), "starts the next buffer")
    fails(capsys, checks.check_fusion(fuse_with(sort=True)), "does not sort")
    # Unusual but right: a generator of tuples, built from running totals.
    def fuse_totals(tensors, threshold):
        start, total = 0, 0
        for i, (_, nbytes) in enumerate(tensors):
            if i > start and total + nbytes > threshold:
                yield tuple(name for name, _ in tensors[start:i])
                start, total = i, 0
            total += nbytes
        yield tuple(name for name, _ in tensors[start:])
    assert checks.check_fusion(fuse_totals)
    verdict(capsys)
