"""Lesson 13's checks (sequence parallelism's bytes, ring attention): each passes the solution, FAILs on what an
untouched exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one line.

The ring runs here as the ranks run it, one rank after another in one process: each rank's loop sees the key and
value blocks in the order the ring brings them (its own first, then rank - 1's, ...).
"""
import math

import pytest
import torch

from conftest import fails, unattempted, untouched, verdict
from scaledl import context_parallel
from scaledl.workshop import checks


def sp_block_bytes(seq_len, batch, width, heads, tp, sequence_parallel=True):
    per_token = (2 * width + (14 * width + 4 + heads) / tp if sequence_parallel
                 else 4 * width + 4 + (12 * width + heads) / tp)
    return 4 * seq_len * batch * per_token


LIMIT = 1 - 2 * 64 / (4 * 64 + 4)  # the exercise's answer for width 64: 0.508


def test_sp_block_bytes(capsys):
    from scaledl import activations

    # The limit is what the bytes approach as tp grows.
    far = 1 - (activations.block_bytes(1, 1, 64, 4, tp=10**6, sequence_parallel=True)
               / activations.block_bytes(1, 1, 64, 4, tp=10**6))
    assert far == pytest.approx(LIMIT, abs=1e-4)
    assert checks.check_sp_block_bytes(sp_block_bytes, LIMIT)
    assert "toward 50.8%" in verdict(capsys)
    assert checks.check_sp_block_bytes(sp_block_bytes, 1 - 2 * 768 / (4 * 768 + 4), width=768, heads=12)  # GPT-2 small
    verdict(capsys)
    assert checks.check_sp_block_bytes(sp_block_bytes, 0.5)  # the small terms left out: 1 - 2h/4h
    verdict(capsys)
    small_terms_out = lambda s, b, h, a, t, sp: 4 * s * b * (2 * h + 14 * h / t if sp else 4 * h + 12 * h / t)  # noqa: E731
    assert checks.check_sp_block_bytes(small_terms_out, LIMIT)
    verdict(capsys)
    fails(capsys, checks.check_sp_block_bytes(None), "not set")
    fails(capsys, checks.check_sp_block_bytes(untouched), "NotImplementedError")
    fails(capsys, checks.check_sp_block_bytes(lambda s, b, h, a, t, sp: sp_block_bytes(s, b, h, a, t, False)),
          "sequence_parallel=True", "tensor parallelism alone")
    fails(capsys, checks.check_sp_block_bytes(lambda s, b, h, a, t, sp: sp_block_bytes(s, b, h, a, t, True)),
          "sequence_parallel=False", "that is with sequence parallelism")
    fails(capsys, checks.check_sp_block_bytes(
        lambda s, b, h, a, t, sp: 4 * s * b * (16 * h + 4 + a) / t if sp else sp_block_bytes(s, b, h, a, t, False)),
        "Megatron-LM")
    fails(capsys, checks.check_sp_block_bytes(lambda s, b, h, a, t, sp: 4 * s * b * (16 * h + 4 + a)), "whole block")
    fails(capsys, checks.check_sp_block_bytes(lambda *size: sp_block_bytes(*size) / 4), "4 bytes a value")
    fails(capsys, checks.check_sp_block_bytes(lambda s, b, h, a, t, sp: s * b * h), "walk the block")
    fails(capsys, checks.check_sp_block_bytes(lambda *size: "lots"), "return a number of bytes")
    # The limit: unset, Megatron-LM's (everything over tp), the saving at one tp, a percent, not a number.
    fails(capsys, checks.check_sp_block_bytes(sp_block_bytes), "`saving_limit` is not set")
    fails(capsys, checks.check_sp_block_bytes(sp_block_bytes, 1.0), "Megatron-LM's limit")
    saving_at_4 = 1 - sp_block_bytes(1, 1, 64, 4, 4, True) / sp_block_bytes(1, 1, 64, 4, 4, False)
    fails(capsys, checks.check_sp_block_bytes(sp_block_bytes, saving_at_4), "the saving at one tp")
    fails(capsys, checks.check_sp_block_bytes(sp_block_bytes, 0.3), "let tp grow in both sums")
    fails(capsys, checks.check_sp_block_bytes(sp_block_bytes, 50.8), "a fraction between 0 and 1")
    fails(capsys, checks.check_sp_block_bytes(sp_block_bytes, "half"), "a fraction between 0 and 1")
    line = fails(capsys, checks.check_sp_block_bytes(sp_block_bytes, 0.3), "not the limit")
    assert "0.508" not in line and "50.8" not in line, line


def blocks(world_size, tokens=8, seed=0):
    """Each rank's q, k, v: (batch, heads, tokens, head_dim), scaled so that the blocks' maxima differ."""
    generator = torch.Generator().manual_seed(seed)
    return [[3 * torch.randn(2, 2, tokens, 4, generator=generator) for _ in range(world_size)] for _ in range(3)]


def ring(qs, ks, vs, causal, combine="online", offset="right", rescale=True):
    """The exercise's loop on every rank; `combine`, `offset` and `rescale` make the mistakes."""
    world_size, n = len(qs), qs[0].shape[-2]
    outputs = []
    for rank in range(world_size):
        q = qs[rank]
        out, total, top = torch.zeros_like(q), torch.zeros(*q.shape[:-1], 1), torch.full((*q.shape[:-1], 1), -math.inf)
        parts = []
        for step in range(world_size):
            source = (rank - step) % world_size
            k, v = ks[source], vs[source]
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            if causal:
                later, diagonal = source > rank, source == rank
                if offset == "triangle everywhere":
                    later, diagonal = False, True
                elif offset == "triangle on earlier" and source < rank:
                    diagonal = True
                if later:
                    continue
                if diagonal:
                    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
            if combine == "own" and source != rank:
                continue
            if combine in ("summed", "averaged"):
                parts.append(torch.softmax(scores, -1) @ v)
                continue
            new_top = torch.maximum(top, scores.amax(-1, keepdim=True))
            weights = torch.exp(scores - new_top)
            correction = torch.exp(top - new_top) if rescale else torch.ones_like(top)
            out = out * correction + weights @ v
            total = total * correction + weights.sum(-1, keepdim=True)
            top = new_top
        if combine in ("summed", "averaged"):
            out, total = sum(parts), len(parts) if combine == "averaged" else 1
        outputs.append(out / total)
    return outputs


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_attention(capsys, world_size, causal):
    qs, ks, vs = blocks(world_size)
    assert checks.check_ring_attention(ring(qs, ks, vs, causal), qs, ks, vs, causal)
    assert "equals full attention" in verdict(capsys)
    unattempted(capsys, checks.check_ring_attention(None, qs, ks, vs, causal), "not set on every rank")
    fails(capsys, checks.check_ring_attention([None] * world_size, qs, ks, vs, causal), "not set on every rank")
    fails(capsys, checks.check_ring_attention(ring(qs, ks, vs, causal, combine="summed"), qs, ks, vs, causal),
          "normalized on its own")
    fails(capsys, checks.check_ring_attention(ring(qs, ks, vs, causal, combine="averaged"), qs, ks, vs, causal),
          "averaged")
    fails(capsys, checks.check_ring_attention(ring(qs, ks, vs, causal, rescale=False), qs, ks, vs, causal),
          "not rescaled")
    fails(capsys, checks.check_ring_attention(ring(qs, ks, vs, causal, combine="own"), qs, ks, vs, causal),
          "travel around the ring")
    fails(capsys, checks.check_ring_attention([o[..., :-1, :] for o in ring(qs, ks, vs, causal)], qs, ks, vs, causal),
          "one output row per query")
    with_nan = ring(qs, ks, vs, causal)
    with_nan[-1][0, 0, 0, 0] = float("nan")
    fails(capsys, checks.check_ring_attention(with_nan, qs, ks, vs, causal), "holds NaN")
    noisy = [o + 1e-3 for o in ring(qs, ks, vs, causal)]
    fails(capsys, checks.check_ring_attention(noisy, qs, ks, vs, causal), "differs from full attention")
    if causal:
        fails(capsys, checks.check_ring_attention(ring(qs, ks, vs, causal, offset="triangle everywhere"), qs, ks, vs,
                                                  causal), "ignores where a block sits")
        fails(capsys, checks.check_ring_attention(ring(qs, ks, vs, causal, offset="triangle on earlier"), qs, ks, vs,
                                                  causal), "earlier rank's block is masked")


def test_the_ring_schedule_and_its_arithmetic():
    steps = context_parallel.ring_schedule(4, causal=True)
    assert [source for source, _ in steps[1]] == [3, 0, 1, 2]  # each block moved one rank on
    assert [use for _, use in steps[0]] == ["diagonal"] * 4
    assert sum(use == "full" for row in steps for _, use in row) == 6  # the 4 x 3 / 2 pairs of earlier blocks
    assert all(use == "full" for row in context_parallel.ring_schedule(3, causal=False) for _, use in row)
    balanced = context_parallel.ring_schedule(4, causal=True, order="head-tail")  # every rank: half of each block
    assert [use for _, use in balanced[0]] == ["diagonal"] * 4
    assert all(use == "half" for row in balanced[1:] for _, use in row)
    n, batch, width = 1024, 2, 512
    # At n = tokens_to_hide the step's compute at the peak takes as long as its send.
    peak, bandwidth = 312e12, 100e9
    hide = context_parallel.tokens_to_hide(peak, bandwidth)
    assert context_parallel.ring_step_flops(hide, batch, width) / peak == pytest.approx(
        context_parallel.ring_step_bytes(hide, batch, width) / bandwidth)
    assert context_parallel.ring_step_bytes(n, batch, width) == 2 * n * batch * width * 2
