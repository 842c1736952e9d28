"""Checks for the exercises: each says in one line what is right or what is wrong and why.

A check returns True/False and prints its verdict, so a notebook cell can call it after the
learner's code and the tests can call it on wrong and right answers alike.
"""
from __future__ import annotations


def _verdict(ok: bool, message: str) -> bool:
    print(("PASS: " if ok else "FAIL: ") + message)
    return ok


def from_ranks(view, name: str) -> list | None:
    """`name` as every rank of an ipyparallel view holds it, or None (with a FAIL line) when
    the exercise cell that sets it has not run to the end on every rank."""
    try:
        return view.pull(name, block=True)
    except Exception:  # ipyparallel wraps the engines' NameError in a CompositeError
        _verdict(False, f"`{name}` is not set on every rank: finish the exercise cell above and run it")
        return None


def check_all_reduce(values_by_rank: list, world_size: int) -> bool:
    """After all_reduce(SUM) of rank + 1 every rank holds 1 + 2 + ... + world_size."""
    if values_by_rank is None:
        return False
    expected = world_size * (world_size + 1) / 2
    values = [float(v) for v in values_by_rank]
    wrong = [(rank, v) for rank, v in enumerate(values) if v != expected]
    if not wrong:
        return _verdict(True, f"every rank holds {expected:g}, the sum over all ranks")
    rank, value = wrong[0]
    hint = ("it still holds its own value: call all_reduce on every rank" if value == rank + 1
            else "check the reduce op (SUM) and that every rank takes part")
    return _verdict(False, f"rank {rank} holds {value:g}, expected {expected:g}: {hint}")


def check_shards(indices_by_rank: list, num_samples: int, ranks_per_node: int | None = None) -> bool:
    """Every sample index exactly once across ranks, no rank sharing an index with another."""
    if indices_by_rank is None:
        return False
    seen = {}
    for rank, indices in enumerate(indices_by_rank):
        for index in indices:
            if index in seen:
                same_local = ranks_per_node and seen[index] % ranks_per_node == rank % ranks_per_node
                hint = "shard by global rank, not local rank" if same_local else "give each rank its own rank number"
                first = sorted(indices_by_rank[rank])
                return _verdict(False, f"rank {rank} saw samples {first[0]}-{first[-1]}, as rank {seen[index]} did: {hint}")
            seen[index] = rank
    missing = sorted(set(range(num_samples)) - set(seen))
    if missing:
        return _verdict(False, f"{len(missing)} samples are never seen (first: {missing[0]}): "
                               "num_replicas must be the world size")
    return _verdict(True, f"{num_samples} samples, each seen by exactly one of {len(indices_by_rank)} ranks")


def check_in_sync(fingerprints_by_rank: list) -> bool:
    """After a data-parallel step every rank must hold bit-identical parameters."""
    if fingerprints_by_rank is None:
        return False
    if len(set(fingerprints_by_rank)) == 1:
        return _verdict(True, f"all {len(fingerprints_by_rank)} ranks hold identical parameters")
    differing = [rank for rank, f in enumerate(fingerprints_by_rank) if f != fingerprints_by_rank[0]]
    return _verdict(False, f"rank {differing[0]} holds different parameters than rank 0: wrap the model in DDP "
                           "before the first step (it broadcasts rank 0's weights and averages gradients)")


# Where Horovod's broadcast belongs and what averages the gradients, per framework: TensorFlow
# broadcasts after the first step (the optimizer makes its variables then), PyTorch before it.
_HOROVOD_FIXES = {
    "tf": ("after the first step", "broadcast rank 0's variables after the first step "
           "(hvd.broadcast_variables on model.variables and optimizer.variables())",
           "average the gradients: wrap the tape in hvd.DistributedGradientTape"),
    "torch": ("before the first step", "broadcast rank 0's parameters and optimizer state before training "
              "(hvd.broadcast_parameters, hvd.broadcast_optimizer_state)",
              "average the gradients: wrap the optimizer in hvd.DistributedOptimizer"),
}


def check_horovod_sync(fingerprints_by_rank: list, framework: str) -> bool:
    """Horovod's two duties, checked apart. Each rank gives [fingerprint at the start, fingerprint
    after the last step]: equal starts need the broadcast, equal ends the averaged gradients."""
    if fingerprints_by_rank is None:
        return False
    if any(len(f) < 2 for f in fingerprints_by_rank):
        return _verdict(False, "the training cell did not finish on every rank: finish the exercise above and run both cells")
    start, broadcast_hint, average_hint = _HOROVOD_FIXES[framework]
    for index, when, hint in ((0, start, broadcast_hint), (-1, "after the last step", average_hint)):
        differing = [rank for rank, f in enumerate(fingerprints_by_rank) if f[index] != fingerprints_by_rank[0][index]]
        if differing:
            return _verdict(False, f"rank {differing[0]} holds different weights than rank 0 {when}: {hint}")
    return _verdict(True, f"all {len(fingerprints_by_rank)} ranks start from rank 0's weights and stay identical "
                          "after every step")


def check_horovod_allreduce(results_by_rank: list, world_size: int) -> bool:
    """Each rank all-reduces rank + 1 twice: (total with op=hvd.Sum, average with the default)."""
    if results_by_rank is None:
        return False
    want_total, want_average = world_size * (world_size + 1) / 2, (world_size + 1) / 2
    for rank, (total, average) in enumerate(results_by_rank):
        total, average = float(total), float(average)
        if total != want_total:
            hint = ("hvd.allreduce averages unless told otherwise: pass op=hvd.Sum" if total == want_average
                    else "it still holds its own value: all-reduce it, on every rank" if total == rank + 1
                    else "sum with op=hvd.Sum, on every rank")
            return _verdict(False, f"rank {rank}: total is {total:g}, expected {want_total:g}: {hint}")
        if average != want_average:
            hint = ("that is the sum: leave op at its default, hvd.Average" if average == want_total
                    else "it still holds its own value: all-reduce it, on every rank" if average == rank + 1
                    else "average with op=hvd.Average (the default), on every rank")
            return _verdict(False, f"rank {rank}: average is {average:g}, expected {want_average:g}: {hint}")
    return _verdict(True, f"every rank holds the sum {want_total:g} and the average {want_average:g}")


def check_deepspeed_config(configs_by_rank: list, world_size: int) -> bool:
    """DeepSpeed's three batch numbers must agree: global = micro x accumulation x world_size."""
    if configs_by_rank is None:
        return False
    config = configs_by_rank[0]
    micro = config.get("train_micro_batch_size_per_gpu")
    accumulation = config.get("gradient_accumulation_steps", 1)
    total = config.get("train_batch_size")
    if None in (micro, total):
        return _verdict(False, "set both train_micro_batch_size_per_gpu and train_batch_size")
    if total != micro * accumulation * world_size:
        return _verdict(False, f"train_batch_size {total} != micro batch {micro} x accumulation {accumulation} "
                               f"x world_size {world_size}: the global batch counts every rank's micro batches")
    if config.get("gradient_clipping", 1.0) != 0:
        return _verdict(False, "DeepSpeed clips the gradient norm to 1.0 unless \"gradient_clipping\" is 0: "
                               "the other rungs do not clip, so this run would train differently")
    return _verdict(True, "the global batch is micro batch x accumulation x world_size, and nothing is clipped")


def check_zero_formula(bytes_per_rank, world_size: int = 8) -> bool:
    """`bytes_per_rank(num_params, world_size, stage)` for mixed-precision Adam (2 + 2 + 12 bytes)."""
    from scaledl import zero_memory

    num_params = 7_500_000_000  # the paper's 7.5B-parameter example
    for stage, partitioned in enumerate(["nothing", "optimizer states", "and gradients", "and parameters"]):
        try:
            got = bytes_per_rank(num_params, world_size, stage)
        except NotImplementedError:
            return _verdict(False, "bytes_per_rank still raises NotImplementedError: finish the exercise cell")
        want = zero_memory.predict(num_params, world_size, stage, 2, 2, 12)["total"]
        if got != want:
            return _verdict(False, f"stage {stage} gives {got / 1e9:g} GB, expected {want / 1e9:g} GB: "
                                   f"stage {stage} partitions {partitioned} over the ranks (divide by world_size)")
    return _verdict(True, "all four stages match the paper's 16 bytes per parameter, partitioned stage by stage")


def check_pipeline(errors_by_rank: list) -> bool:
    """The last stage's logits must equal the whole model's on the same batch."""
    if errors_by_rank is None:
        return False
    error = errors_by_rank[-1]
    if error is None or error != error or error > 1e-5:
        return _verdict(False, f"the last rank's logits differ from the whole model's (max error {error}): "
                               "send the first stage's output, and run the second stage on what arrives")
    return _verdict(True, "the two stages together compute exactly what the whole model computes")
