"""Lesson 3's checks: an all-reduce on live ranks, sharding by global rank, the ring's cost."""
from __future__ import annotations

import math
import numbers

from scaledl.workshop.checks.common import _attempt, _FAILED, _unfinished, _verdict


def check_all_reduce(values_by_rank: list, world_size: int) -> bool:
    """After an all_reduce (a sum) of rank + 1 and a division by world_size, every rank holds the
    average, (1 + 2 + ... + world_size) / world_size = (world_size + 1) / 2."""
    if values_by_rank is None:
        return False
    if world_size < 2:
        return _verdict(False, "one rank cannot tell an average from its own value: start 2 or more (WORLD_SIZE = 2)")
    expected = (world_size + 1) / 2
    total = world_size * expected
    values = [float(v) for v in values_by_rank]
    wrong = [(rank, v) for rank, v in enumerate(values) if not math.isclose(v, expected)]
    if not wrong:
        return _verdict(True, f"every rank holds {expected:g}, the average over all ranks")
    rank, value = wrong[0]
    own = rank + 1
    others = list(enumerate(values))[1:]  # a reduce to rank 0 leaves the others with their own value
    if math.isclose(values[0], expected) and all(math.isclose(v, (r + 1) / world_size) for r, v in others):
        hint = "only rank 0 holds the average: a reduce delivers to one rank, and every rank needs it"
    elif math.isclose(values[0], total) and all(math.isclose(v, r + 1) for r, v in others):
        hint = "only rank 0 holds the sum: a reduce delivers to one rank, and every rank needs it"
    elif math.isclose(value, total):
        hint = "that is the sum: divide it by world_size for the average"
    elif math.isclose(value, own):
        hint = "it still holds its own value: every rank must take part in the collective"
    elif math.isclose(value, own / world_size):
        hint = "it divided its own value but took part in no sum: every rank must call the collective"
    elif math.isclose(value, expected / world_size):
        hint = "that is the average divided by world_size again: divide once"
    elif math.isclose(value, world_size):
        hint = "that comes from the largest value: the reduce op must be a sum"
    else:
        hint = "sum with the collective (every rank), then divide by world_size"
    return _verdict(False, f"rank {rank} holds {value:g}, expected {expected:g}: {hint}")


def check_sharding(shard, num_samples: int = 20, nodes: int = 2, ranks_per_node: int = 3) -> bool:
    """`shard(num_samples, rank, local_rank, world_size) -> indices`, run for every rank of a
    simulated job of `nodes` nodes, on a number of samples the world size does not divide:
    every rank gets as many samples (a rank with a step more would wait alone in that step's
    all-reduce), and every sample goes to exactly one rank, except what evens the shares out:
    fewer than world_size samples repeated (DistributedSampler's padding) or left out (its
    drop_last)."""
    if shard is None:
        return _unfinished("shard")
    world_size = nodes * ranks_per_node
    by_rank = []
    for rank in range(world_size):
        local_rank = rank % ranks_per_node
        indices = _attempt("shard", f"shard(num_samples={num_samples}, rank={rank}, local_rank={local_rank}, "
                                    f"world_size={world_size})",
                           lambda: [int(i) for i in shard(num_samples, rank, local_rank, world_size)])
        if indices is _FAILED:
            return False
        by_rank.append(indices)
    where = f"on {nodes} nodes x {ranks_per_node} ranks, {num_samples} samples"
    owners: dict[int, list[int]] = {}
    for rank, indices in enumerate(by_rank):
        for index in indices:
            owners.setdefault(index, []).append(rank)
    strays = sorted(set(owners) - set(range(num_samples)))
    if strays:
        return _verdict(False, f"{where}: index {strays[0]} is not a sample (0 to {num_samples - 1})")
    sizes = {len(indices) for indices in by_rank}
    repeats = sum(len(ranks) - 1 for ranks in owners.values())
    missing = sorted(set(range(num_samples)) - set(owners))
    padded = repeats < world_size and len(sizes) == 1  # DistributedSampler evens out the ranks
    if repeats and not padded:
        pairs = [(index, a, b) for index, ranks in sorted(owners.items()) for a in ranks for b in ranks if a < b]
        # Name a pair of ranks with the same local rank when there is one: that is the usual mistake.
        index, first, second = next((pair for pair in pairs if pair[1] % ranks_per_node == pair[2] % ranks_per_node),
                                    pairs[0])
        if first % ranks_per_node == second % ranks_per_node:  # the symptom only: the learner finds the cause
            shared = sorted(set(by_rank[first]) & set(by_rank[second]))
            return _verdict(False, f"{where}: ranks {first} and {second}, on nodes {first // ranks_per_node} and "
                                   f"{second // ranks_per_node}, trained on the same samples ({len(shared)} of them, "
                                   f"first: {shared[0]}): every sample must go to one rank of the whole job")
        hint = "each rank needs its own place: the global rank among world_size ranks"
        return _verdict(False, f"{where}: ranks {first} and {second} both get sample {index}: {hint}")
    if len(sizes) > 1 and not missing:
        counts = [len(indices) for indices in by_rank]
        small = counts.index(min(counts))
        return _verdict(False, f"{where}: rank {counts.index(max(counts))} gets {max(counts)} samples, rank {small} "
                               f"{min(counts)}: with uneven shares a rank can run a step more than the others and wait "
                               "alone in its all-reduce: give every rank as many (repeat a few samples, or drop a few)")
    if missing and not (not repeats and len(missing) < world_size and len(sizes) == 1):
        return _verdict(False, f"{where}: {len(missing)} samples are never seen (first: {missing[0]}): together "
                               "the shards must cover the data: one shard per rank of the whole job (world_size)")
    if repeats:
        said = (f"every sample goes to one rank, {repeats} also to a second so that every rank gets {sizes.pop()} "
                "(padding, as DistributedSampler does)")
    elif missing:
        said = f"no sample goes to two ranks; {len(missing)} are left out of the epoch so that every rank gets " \
               f"{sizes.pop()} (as DistributedSampler's drop_last does)"
    else:
        said = "each sample goes to exactly one rank"
    return _verdict(True, f"{where}: {said}")



def ring_allreduce_s(nbytes: float, world_size: int, alpha: float, beta: float) -> float:
    """The ring all-reduce's time: 2(p-1) messages of latency alpha, and 2(p-1)/p of the n bytes
    through each rank's link at beta bytes/s (Patarasuk and Yuan, 2009; Thakur et al., 2005)."""
    p = world_size
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / beta


# (bytes, ranks, alpha s, beta bytes/s): 8 and 3 ranks so that 2(p-1)/p is neither 1 nor 2, a latency
# large enough to see, a bandwidth that is not 1.
_RING_CASES = [(100e6, 8, 50e-6, 10e9), (1e3, 8, 50e-6, 10e9), (64e6, 3, 5e-6, 200e9), (1e9, 64, 10e-6, 25e9)]


def check_ring_prediction(predict) -> bool:
    """`predict(nbytes, world_size, alpha, beta) -> seconds`, the ring all-reduce's cost model,
    against the formula on cases where a half-ring (p-1 steps), a missing 2(p-1)/p, or beta used
    as seconds per byte differ.  (The lesson puts the prediction beside a measured time itself:
    a verdict holds no number that changes from run to run.)"""
    if predict is None:
        return _unfinished("predict")
    for nbytes, p, alpha, beta in _RING_CASES:
        case = f"{nbytes:,.0f} bytes on {p} ranks, alpha {alpha * 1e6:g} us, beta {beta / 1e9:g} GB/s"
        got = _attempt("predict", case, lambda: float(predict(nbytes, p, alpha, beta)))
        if got is _FAILED:
            return False
        want = ring_allreduce_s(nbytes, p, alpha, beta)
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        latency, bandwidth = 2 * (p - 1) * alpha, 2 * (p - 1) / p * nbytes / beta
        slips = [(latency / 2 + bandwidth / 2, "that is half the ring: a reduce-scatter and an all-gather, "
                                               "p-1 steps each"),
                 (latency / 2 + bandwidth, "the latency counts p-1 messages: each half of the ring sends p-1"),
                 (latency + nbytes / beta, "each rank sends 2(p-1)/p of the bytes, not the buffer once"),
                 (latency + 2 * nbytes / beta, "each rank sends 2(p-1)/p of the bytes: a chunk of n/p per step"),
                 (latency + 2 * (p - 1) * nbytes / beta, "a step sends one chunk, n/p bytes, not the whole buffer"),
                 (latency + 2 * (p - 1) / p * nbytes * beta, "beta is bytes per second: divide the bytes by it"),
                 (bandwidth, "the latency term is missing: 2(p-1) messages, alpha each"),
                 (latency, "the bandwidth term is missing: 2(p-1)/p n bytes at beta bytes/s"),
                 (2 * p * alpha + 2 * nbytes / beta, "count p-1 steps per half, not p")]
        hint = next((message for value, message in slips if math.isclose(got, value, rel_tol=1e-6)),
                    "t = 2(p-1) alpha + 2(p-1)/p n / beta")
        return _verdict(False, f"{case}: {got * 1e3:.4g} ms, expected {want * 1e3:.4g} ms: {hint}")
    return _verdict(True, "the ring's cost model on 3, 8 and 64 ranks: 2(p-1) latencies and 2(p-1)/p of the bytes "
                          "through each rank's link")


def check_ring_steps(chunk_bytes, steps_per_phase, nbytes: float = 1e6, world_size: int = 8) -> bool:
    """The two numbers the ring's figure shows, for `world_size` ranks and a buffer of `nbytes`: one chunk
    is n/p bytes, and each phase (reduce-scatter, then all-gather) takes p-1 steps.  The figure draws 4 ranks;
    the question asks for another p, so that reading the figure's own count off gives a wrong number."""
    if chunk_bytes is None:
        return _unfinished("chunk_bytes")
    if steps_per_phase is None:
        return _unfinished("steps_per_phase")
    p, where = world_size, f"{world_size} ranks, a buffer of {nbytes:,.0f} bytes"
    values = []
    for name, value in (("chunk_bytes", chunk_bytes), ("steps_per_phase", steps_per_phase)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            return _verdict(False, f"{where}: {name} is {value!r}: set it to a number")
        values.append(float(value))
    chunk, steps = values
    want_chunk = nbytes / p
    if not math.isclose(chunk, want_chunk, rel_tol=1e-6):
        slips = [(nbytes, "that is the whole buffer: the ring cuts it into one chunk per rank"),
                 (nbytes / (p - 1), "one chunk per rank: divide by p, not p-1"),
                 (nbytes / 4, "that is the figure's 4 ranks: cut the buffer into one chunk per rank of these"),
                 (2 * (p - 1) / p * nbytes, "that is what each rank sends in all: one chunk is a single step's"),
                 (nbytes / p / 2, "one chunk per rank: n/p, not halved")]
        hint = next((message for value, message in slips if math.isclose(chunk, value, rel_tol=1e-6)),
                    "the ring cuts the buffer into one chunk per rank")
        return _verdict(False, f"{where}: chunk_bytes {chunk:,.6g}, expected {want_chunk:,.6g}: {hint}")
    if steps != p - 1:
        slips = [(p, "a chunk starts on one rank and needs one step for each of the other p-1"),
                 (2 * (p - 1), "that counts both phases: each phase takes half of them"),
                 (3, "that is the figure's 4 ranks: count the steps for these ranks"),
                 (1, "a step moves a chunk one rank along the ring, not across it")]
        hint = next((message for value, message in slips if steps == value),
                    "count the steps until each chunk has passed every rank once")
        return _verdict(False, f"{where}: steps_per_phase {steps:g}, expected {p - 1}: {hint}")
    return _verdict(True, f"{where}: one chunk is n/p = {want_chunk:,.0f} bytes, and each phase takes p-1 = {p - 1} "
                          "steps")
