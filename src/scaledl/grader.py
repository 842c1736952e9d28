"""Checks for the exercises: each says in one line what is right or what is wrong and why.

A check returns True/False and prints its verdict, so a notebook cell can call it after the
learner's code and the tests can call it on wrong and right answers alike.
"""
from __future__ import annotations


def _verdict(ok: bool, message: str) -> bool:
    print(("PASS: " if ok else "FAIL: ") + message)
    return ok


def check_all_reduce(values_by_rank: list, world_size: int) -> bool:
    """After all_reduce(SUM) of rank + 1 every rank holds 1 + 2 + ... + world_size."""
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
    if len(set(fingerprints_by_rank)) == 1:
        return _verdict(True, f"all {len(fingerprints_by_rank)} ranks hold identical parameters")
    differing = [rank for rank, f in enumerate(fingerprints_by_rank) if f != fingerprints_by_rank[0]]
    return _verdict(False, f"rank {differing[0]} holds different parameters than rank 0: wrap the model in DDP "
                           "before the first step (it broadcasts rank 0's weights and averages gradients)")
