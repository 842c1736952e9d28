"""Lesson 3's checks (all-reduce, sharding, the ring's cost): each passes the solution, FAILs on what an
untouched exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one
line."""

import numpy as np
from torch.utils.data import DistributedSampler

from conftest import fails, untouched, verdict
from scaledl.workshop import checks


# ---------------------------------------------------------------- lesson 3

def test_all_reduce_check(capsys):
    # Each rank holds rank + 1; the exercise leaves the average, (world_size + 1) / 2, on every rank.
    assert checks.check_all_reduce([1.5, 1.5], 2)
    assert verdict(capsys) == "PASS: every rank holds 1.5, the average over all ranks"
    assert checks.check_all_reduce([2.5, np.float32(2.5), 2.5, 2.5], 4)  # 4 ranks, any number type
    verdict(capsys)
    fails(capsys, checks.check_all_reduce([1.0, 2.0], 2), "it still holds its own value")  # untouched
    fails(capsys, checks.check_all_reduce([3.0, 3.0], 2), "that is the sum")  # not divided
    fails(capsys, checks.check_all_reduce([10.0] * 4, 4), "that is the sum")
    fails(capsys, checks.check_all_reduce([1.5, 1.0], 2), "only rank 0 holds the average")  # tdist.reduce(x, dst=0)
    fails(capsys, checks.check_all_reduce([3.0, 2.0], 2), "only rank 0 holds the sum")  # reduce, not divided
    fails(capsys, checks.check_all_reduce([0.5, 1.0], 2), "took part in no sum")  # divided, no collective
    fails(capsys, checks.check_all_reduce([0.75, 0.75], 2), "divide once")  # divided before and after the sum
    fails(capsys, checks.check_all_reduce([4.0] * 4, 4), "the largest value")  # ReduceOp.MAX
    fails(capsys, checks.check_all_reduce([6.0] * 4, 4), "rank 0 holds 6")  # ReduceOp.PRODUCT, then divided
    fails(capsys, checks.check_all_reduce([1.0], 1), "start 2 or more")  # one rank proves nothing


def ring(nbytes, p, alpha, beta):
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / beta


def test_ring_prediction_check(capsys):
    assert checks.check_ring_prediction(ring)
    assert "PASS: the ring's cost model" in verdict(capsys)
    fails(capsys, checks.check_ring_prediction(None), "`predict` is not set")
    fails(capsys, checks.check_ring_prediction(lambda n, p, a, b: (p - 1) * a + (p - 1) / p * n / b), "half the ring")
    fails(capsys, checks.check_ring_prediction(lambda n, p, a, b: 2 * (p - 1) * a + n / b), "2(p-1)/p of the bytes")
    fails(capsys, checks.check_ring_prediction(lambda n, p, a, b: 2 * (p - 1) * a + 2 * (p - 1) / p * n * b),
          "beta is bytes per second")
    fails(capsys, checks.check_ring_prediction(lambda n, p, a, b: (p - 1) * a + 2 * (p - 1) / p * n / b),
          "counts p-1 messages")
    fails(capsys, checks.check_ring_prediction(lambda n, p, a, b: 2 * (p - 1) / p * n / b), "latency term is missing")
    fails(capsys, checks.check_ring_prediction(lambda n, p, a, b: 2 * p * a + 2 * n / b), "not p")
    fails(capsys, checks.check_ring_prediction(lambda n, p, a, b: 2 * (p - 1) * (a + n / b)), "not the whole buffer")
    # Unusual but right: NumPy, the two halves written out, and a learner's own names.
    def halves(nbytes, world_size, alpha, beta):
        step = alpha + nbytes / world_size / beta
        return np.float32(2 * (world_size - 1)) * np.float64(step)
    assert checks.check_ring_prediction(halves)
    verdict(capsys)


def sampler_shard(use_local_rank=False, replicas=None):
    def shard(num_samples, rank, local_rank, world_size):
        return list(DistributedSampler(range(num_samples), num_replicas=replicas or world_size,
                                       rank=local_rank if use_local_rank else rank, shuffle=False))
    return shard


def padded_by_hand(num_samples, rank, local_rank, world_size):
    """The lesson's solution: pad with the first samples, then deal them out by global rank."""
    per_rank = -(-num_samples // world_size)
    indices = list(range(num_samples))
    indices += indices[:per_rank * world_size - num_samples]
    return indices[rank::world_size]


def test_sharding_check_simulates_two_nodes(capsys):
    # 20 samples on 2 nodes x 3 ranks: 6 does not divide 20, so padding repeats 4 samples.
    assert checks.check_sharding(padded_by_hand)
    assert verdict(capsys) == ("PASS: on 2 nodes x 3 ranks, 20 samples: every sample goes to one rank, 4 also to a "
                               "second so that every rank gets 4 (padding, as DistributedSampler does)")
    assert checks.check_sharding(padded_by_hand, 16, nodes=2, ranks_per_node=2)
    assert "each sample goes to exactly one rank" in verdict(capsys)
    for n in (20, 16, 7):  # the lesson's shards are DistributedSampler's, without shuffling
        for rank in range(6):
            assert padded_by_hand(n, rank, rank % 3, 6) == list(DistributedSampler(range(n), 6, rank, shuffle=False))
    # Unusual but right: DistributedSampler itself, drop_last, contiguous blocks padded to equal shares.
    assert checks.check_sharding(sampler_shard())
    verdict(capsys)
    assert checks.check_sharding(lambda n, r, lr, w: list(DistributedSampler(range(n), w, r, shuffle=False,
                                                                             drop_last=True)))
    assert "2 are left out of the epoch" in verdict(capsys)
    assert checks.check_sharding(lambda n, r, lr, w: np.resize(np.arange(n), -(-n // w) * w)[r * -(-n // w):
                                                                                                (r + 1) * -(-n // w)])
    verdict(capsys)
    # Uneven shares: a stride without padding (3 or 4 samples a rank), contiguous blocks of 3 or 4.
    fails(capsys, checks.check_sharding(lambda n, r, lr, w: list(range(r, n, w))), "rank 0 gets 4 samples, rank 2 3",
          "wait alone in its all-reduce")
    fails(capsys, checks.check_sharding(lambda n, r, lr, w: np.array_split(np.arange(n), w)[r]), "as many")
    # By local rank: on one node it looks right, on two nodes ranks 0 and 3 train on the same samples.
    assert checks.check_sharding(sampler_shard(use_local_rank=True), 16, nodes=1, ranks_per_node=2)
    verdict(capsys)
    # The FAIL names the symptom, not the fix: the learner works out why ranks 0 and 3 collide.
    assert not checks.check_sharding(sampler_shard(use_local_rank=True))
    said = verdict(capsys)
    assert said.startswith("FAIL: ") and "ranks 0 and 3, on nodes 0 and 1, trained on the same samples" in said
    assert "local" not in said and "global" not in said, said
    # One node's worth of shards, taken by local rank: every sample twice.
    fails(capsys, checks.check_sharding(sampler_shard(use_local_rank=True, replicas=3)),
          "ranks 0 and 3, on nodes 0 and 1, trained on the same samples (7 of them")
    # One node's worth of shards, taken by global rank: the sampler refuses rank 3 of 3.
    fails(capsys, checks.check_sharding(sampler_shard(replicas=3)), "rank=3", "raised ValueError")
    # Padded by a whole world_size: 6 repeats where 4 would do.
    fails(capsys, checks.check_sharding(lambda n, r, lr, w: (list(range(n)) + list(range(w)))[r::w]),
          "both get sample")
    fails(capsys, checks.check_sharding(lambda n, r, lr, w: list(range(r, n // 2, w))), "never seen", "world_size")
    fails(capsys, checks.check_sharding(lambda n, r, lr, w: list(range(r + 1, n, w))), "never seen (first: 0)")
    fails(capsys, checks.check_sharding(lambda n, r, lr, w: list(range(r, n + 1, w))), "index 20 is not a sample")
    fails(capsys, checks.check_sharding(untouched), "NotImplementedError")
    fails(capsys, checks.check_sharding(None), "`shard` is not set")


def test_ring_steps_check(capsys):
    # 8 ranks, 1 MB: one chunk is 125,000 bytes, and each phase takes 7 steps.
    assert checks.check_ring_steps(1e6 / 8, 8 - 1)
    assert verdict(capsys) == ("PASS: 8 ranks, a buffer of 1,000,000 bytes: one chunk is n/p = 125,000 bytes, and "
                               "each phase takes p-1 = 7 steps")
    assert checks.check_ring_steps(125_000, np.int64(7))  # ints and NumPy numbers alike
    verdict(capsys)
    assert checks.check_ring_steps(2**20 / 4, 3, nbytes=2**20, world_size=4)
    verdict(capsys)
    fails(capsys, checks.check_ring_steps(None, 7), "`chunk_bytes` is not set")
    fails(capsys, checks.check_ring_steps(125_000, None), "`steps_per_phase` is not set")
    fails(capsys, checks.check_ring_steps("125000", 7), "set it to a number")
    fails(capsys, checks.check_ring_steps(1e6, 7), "whole buffer")
    fails(capsys, checks.check_ring_steps(1e6 / 7, 7), "not p-1")
    fails(capsys, checks.check_ring_steps(1e6 / 4, 7), "the figure's 4 ranks")
    fails(capsys, checks.check_ring_steps(2 * 7 / 8 * 1e6, 7), "what each rank sends in all")
    fails(capsys, checks.check_ring_steps(125_001, 7), "expected 125,000")
    fails(capsys, checks.check_ring_steps(125_000, 8), "one step for each of the other p-1")
    fails(capsys, checks.check_ring_steps(125_000, 14), "counts both phases")
    fails(capsys, checks.check_ring_steps(125_000, 3), "the figure's 4 ranks")
    fails(capsys, checks.check_ring_steps(125_000, 6), "steps_per_phase 6, expected 7")
