"""Lesson 12's checks (sequence parallelism's bytes, ring attention): each passes the solution, FAILs on what an
untouched exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one line.

The ring runs here as the ranks run it, one rank after another in one process: each rank's loop sees the key and
value blocks in the order the ring brings them (its own first, then rank - 1's, ...).
"""
import math

import pytest
import torch

from conftest import fails, untouched, verdict
from scaledl import context_parallel
from scaledl.workshop import checks


def sp_block_bytes(seq_len, batch, width, heads, tp, sequence_parallel=True):
    per_token = (2 * width + (14 * width + 4 + heads) / tp if sequence_parallel
                 else 4 * width + 4 + (12 * width + heads) / tp)
    return 4 * seq_len * batch * per_token


def test_sp_block_bytes(capsys):
    assert checks.check_sp_block_bytes(sp_block_bytes, 4)
    assert "from tp=4 on sequence parallelism keeps 22% less" in verdict(capsys)
    assert checks.check_sp_block_bytes(sp_block_bytes, 4, width=768, heads=12)  # GPT-2 small's block
    verdict(capsys)
    small_terms_out = lambda s, b, h, a, t, sp: 4 * s * b * (2 * h + 14 * h / t if sp else 4 * h + 12 * h / t)  # noqa: E731
    assert checks.check_sp_block_bytes(small_terms_out, 4)
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
    # The tp that saves a fifth: unset, Megatron-LM's, too few, one the heads do not allow, too many, not a number.
    fails(capsys, checks.check_sp_block_bytes(sp_block_bytes), "`tp_for_a_fifth` is not set")
    fails(capsys, checks.check_sp_block_bytes(sp_block_bytes, 2), "Megatron-LM's count")
    fails(capsys, checks.check_sp_block_bytes(sp_block_bytes, 1), "saves 0.0%, less than a fifth")
    # A tp the heads do not allow: 3 would save too little, 8 would save enough, but neither divides 4 heads.
    fails(capsys, checks.check_sp_block_bytes(sp_block_bytes, 3), "does not divide the 4 heads")
    fails(capsys, checks.check_sp_block_bytes(sp_block_bytes, 8), "does not divide the 4 heads")
    fails(capsys, checks.check_sp_block_bytes(sp_block_bytes, 12, width=768, heads=12),
          "a smaller tp already saves a fifth")
    fails(capsys, checks.check_sp_block_bytes(sp_block_bytes, 0.2), "a whole number of ranks")


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
    fails(capsys, checks.check_ring_attention(None, qs, ks, vs, causal), "not set on every rank")
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
    n, batch, width = 1024, 2, 512
    # At n = tokens_to_hide the step's compute at the peak takes as long as its send.
    peak, bandwidth = 312e12, 100e9
    hide = context_parallel.tokens_to_hide(peak, bandwidth)
    assert context_parallel.ring_step_flops(hide, batch, width) / peak == pytest.approx(
        context_parallel.ring_step_bytes(hide, batch, width) / bandwidth)
    assert context_parallel.ring_step_bytes(n, batch, width) == 2 * n * batch * width * 2
