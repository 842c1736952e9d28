"""Lesson 13's checks: what sequence parallelism leaves on a rank, and ring attention on live ranks."""
from __future__ import annotations

from scaledl import activations
from scaledl.workshop.checks.common import _FAILED, _number, _unfinished, _verdict

# seq_len, batch, width, heads, tp: sizes the prediction must hold for (each divides as the rung requires)
SP_CASES = [(32, 8, 64, 4, 2), (1024, 4, 768, 12, 4), (2048, 1, 4096, 32, 8), (96, 3, 96, 6, 3)]


def _saving(width: int, heads: int, tp: int) -> float:
    """The fraction of a block's bytes that sequence parallelism saves over tensor parallelism alone on tp ranks
    (PyTorch's plan; the tokens cancel)."""
    return 1 - (activations.block_bytes(1, 1, width, heads, tp=tp, sequence_parallel=True)
                / activations.block_bytes(1, 1, width, heads, tp=tp))


def _saving_limit(width: int) -> float:
    """What sequence parallelism saves against tensor parallelism alone as tp grows without bound, PyTorch's plan:
    1 - 2h / (4h + 4), the gathered inputs of the column-wise layers (2h a token) against what tensor parallelism
    leaves whole (4h + 4)."""
    return 1 - 2 * width / (4 * width + 4)


def _block_hint(found: float, seq_len: int, batch: int, width: int, heads: int, tp: int, sequence_parallel: bool):
    """The usual slip a wrong byte count comes from, or None."""
    other = activations.block_bytes(seq_len, batch, width, heads, tp=tp, sequence_parallel=not sequence_parallel)
    whole = activations.block_bytes(seq_len, batch, width, heads)
    right = activations.block_bytes(seq_len, batch, width, heads, tp=tp, sequence_parallel=sequence_parallel)
    wrong = {
        other: ("that is tensor parallelism alone: sequence parallelism also cuts the block's input, the sum after "
                "attention and the norms' statistics by tokens (2h + 4 values a token, over tp)") if sequence_parallel
        else ("that is with sequence parallelism: tensor parallelism alone keeps the block's input, the sum after "
              "attention and the norms' statistics whole on every rank"),
        whole / tp: ("that is every tensor over tp, Megatron-LM's count, which all-gathers the norms' outputs again "
                     "in backward; DTensor's column-wise layers keep the gathered, whole-sequence copies (2h a token)")
        if sequence_parallel else "that is every tensor over tp: the norms and the residual stream stay whole",
        whole: "that is the whole block on one rank: split q, k, v, attention's output and the MLP's tensors over "
               "the tp ranks",
        right / 4: "that counts values: fp32 takes 4 bytes a value",
    }
    return next((why for value, why in wrong.items() if abs(found - value) <= 0.02 * value), None)


def check_sp_block_bytes(sp_block_bytes, saving_limit=None, width: int = 64, heads: int = 4) -> bool:
    """`sp_block_bytes(seq_len, batch, width, heads, tp, sequence_parallel)`: the fp32 bytes one block leaves for
    its backward on one of tp ranks, under sequence parallelism as DTensor's plan keeps them,
    4 * s*b * (2h + (14h + 4 + a)/tp), or under tensor parallelism alone, 4 * s*b * (4h + 4 + (12h + a)/tp)
    (scaledl.activations); and `saving_limit`, the fraction sequence parallelism saves against tensor parallelism
    alone as tp grows without bound, for a block of `width` (within 0.01 of 1 - 2h/(4h + 4): the small terms may
    go).  `heads` is the lesson's, for the PASS line's saving at tp = heads."""
    if sp_block_bytes is None:
        return _unfinished("sp_block_bytes")
    for seq_len, batch, size, size_heads, tp in SP_CASES:
        for sequence_parallel in (True, False):
            case = (f"seq_len={seq_len}, batch={batch}, width={size}, heads={size_heads}, tp={tp}, "
                    f"sequence_parallel={sequence_parallel}")
            found = _number("sp_block_bytes", case,
                            lambda: sp_block_bytes(seq_len, batch, size, size_heads, tp, sequence_parallel))
            if found is _FAILED:
                return False
            expected = activations.block_bytes(seq_len, batch, size, size_heads, tp=tp,
                                               sequence_parallel=sequence_parallel)
            if abs(found - expected) <= 0.02 * expected:  # the small terms (statistics, log-sum-exp) may go
                continue
            hint = (_block_hint(found, seq_len, batch, size, size_heads, tp, sequence_parallel)
                    or "walk the block: what is whole on each rank, what is split by heads, what by tokens")
            return _verdict(False, f"{case}: got {found:.0f}, expected {expected:.0f} bytes: {hint}")
    if saving_limit is None:
        return _unfinished("saving_limit")
    if isinstance(saving_limit, bool) or not isinstance(saving_limit, (int, float)) or not 0 <= saving_limit <= 1:
        return _verdict(False, f"`saving_limit` is {saving_limit!r}: give a fraction between 0 and 1 (0.25 for 25%)")
    want = _saving_limit(width)
    if abs(saving_limit - want) > 0.01:
        if saving_limit > 0.9:
            why = ("that is Megatron-LM's limit, where every tensor is cut over tp; in PyTorch's plan one kind of "
                   "tensor stays whole however large tp grows")
        elif any(abs(saving_limit - _saving(width, heads, tp)) < 0.005 for tp in (2, 4, 8)):
            why = "that is the saving at one tp; let tp grow: which terms vanish, and which stay?"
        else:
            why = "let tp grow in both sums: only what is whole on every rank is left, in each plan"
        return _verdict(False, f"`saving_limit` is {saving_limit:.3f}, not the limit: {why}")
    return _verdict(True, f"both plans' bytes per rank (within 2%), and the saving grows from "
                          f"{_saving(width, heads, heads):.0%} at tp={heads} toward {want:.1%}: what stays whole under "
                          "sequence parallelism is the gathered inputs of the column-wise layers, 2h a token, against "
                          "4h + 4 under tensor parallelism alone")


def _attention(q, k, v, mask=None):
    """softmax(q k^T / sqrt(d)) v, float64, `mask` True where a key may be used."""
    import torch

    scores = q.double() @ k.double().transpose(-2, -1) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v.double()


def _wrong_answers(qs, ks, vs, causal: bool) -> dict[str, list]:
    """Each plausible mistake's outputs, per rank, from the ranks' blocks (float64)."""
    import torch

    p, n = len(qs), qs[0].shape[-2]

    def visible(rank, source, skip_later=True, full_earlier=True):
        """The mask of rank's queries on source's keys (None: all), or False (the block is not used)."""
        if not causal:
            return None
        diagonal = torch.ones(n, n, dtype=torch.bool).tril()
        if source > rank:
            return False if skip_later else diagonal
        return None if source < rank and full_earlier else diagonal

    def ring_order(rank, **mistakes):
        """The blocks rank uses, in the order the ring brings them (its own first), with their masks."""
        for step in range(p):
            source = (rank - step) % p
            mask = visible(rank, source, **mistakes)
            if mask is not False:
                yield source, mask

    def attention_over(rank, used):
        keys, values = torch.cat([ks[s] for s, _ in used], -2), torch.cat([vs[s] for s, _ in used], -2)
        masks = [torch.ones(n, n, dtype=torch.bool) if m is None else m for _, m in used]
        return _attention(qs[rank], keys, values, torch.cat(masks, -1))

    found = {"summed": [], "averaged": [], "unscaled": [], "offset": [], "offset_earlier": [], "own": []}
    for rank in range(p):
        used = list(ring_order(rank))
        found["summed"].append(sum(_attention(qs[rank], ks[s], vs[s], m) for s, m in used))
        found["averaged"].append(found["summed"][-1] / len(used))
        # The running maximum kept, but the sums so far never rescaled when it grows.
        out = total = top = None
        for source, mask in used:
            block = qs[rank].double() @ ks[source].double().transpose(-2, -1) * qs[rank].shape[-1] ** -0.5
            block = block if mask is None else block.masked_fill(~mask, float("-inf"))
            top = block.amax(-1, keepdim=True) if top is None else torch.maximum(top, block.amax(-1, keepdim=True))
            weights = torch.exp(block - top)
            out = weights @ vs[source].double() if out is None else out + weights @ vs[source].double()
            total = weights.sum(-1, keepdim=True) if total is None else total + weights.sum(-1, keepdim=True)
        found["unscaled"].append(out / total)
        # Causal masks that ignore the block's place: the triangle on every block, later ones kept; or on earlier ones.
        found["offset"].append(attention_over(rank, list(ring_order(rank, skip_later=False, full_earlier=False))))
        found["offset_earlier"].append(attention_over(rank, list(ring_order(rank, full_earlier=False))))
        found["own"].append(attention_over(rank, [(rank, visible(rank, rank))]))
    return found


WRONG = {
    "summed": "each block's softmax is normalized on its own and the outputs added up: a softmax over all the keys "
              "divides by one sum over all of them; keep the unnormalized sums (exp(score - max) @ v and its row "
              "sum) across the blocks and divide once at the end",
    "averaged": "the blocks' normalized outputs are averaged: that weighs every block the same, whatever its "
                "scores; keep the unnormalized sums across the blocks and divide by the total once at the end",
    "unscaled": "when a block raises the running maximum, the sums so far are not rescaled: multiply the running "
                "output and the running total by exp(old max - new max) before adding the block's",
    "offset": "the causal mask ignores where a block sits in the sequence: a block from an earlier rank is all "
              "visible, a later rank's block not at all; only the own block needs the triangle",
    "offset_earlier": "an earlier rank's block is masked with the triangle: all of its tokens come before this "
                      "rank's queries, so every key in it is visible; only the own block needs the triangle",
    "own": "only the rank's own keys were used: the key and value blocks must travel around the ring (world_size "
           "- 1 passes) so every query meets every key",
}


def check_ring_attention(outputs, qs, ks, vs, causal: bool, tolerance: float = 1e-5) -> bool:
    """Each rank's `outputs[r]`, its queries' attention over the whole sequence, computed by passing the
    key/value blocks around the ring, must equal full attention of the concatenated blocks (with a
    causal mask over the whole sequence when `causal`).  `qs`, `ks`, `vs` are the ranks' blocks
    (batch, heads, tokens, head_dim), in rank order, on the CPU."""
    import torch

    name = "causal_out" if causal else "out"
    if outputs is None or any(o is None for o in outputs):
        return _unfinished(name, " on every rank")
    p, n = len(qs), qs[0].shape[-2]
    q, k, v = (torch.cat(blocks, -2) for blocks in (qs, ks, vs))
    mask = torch.ones(p * n, p * n, dtype=torch.bool).tril() if causal else None
    expected = _attention(q, k, v, mask)
    for rank, out in enumerate(outputs):
        if tuple(out.shape) != tuple(qs[rank].shape):
            return _verdict(False, f"rank {rank}'s `{name}` has shape {tuple(out.shape)}: it must match its "
                                   f"queries, {tuple(qs[rank].shape)} (one output row per query)")
    mode = "causal" if causal else "without a mask"
    for rank, out in enumerate(outputs):
        if torch.isnan(out).any():
            return _verdict(False, f"{mode}: rank {rank}'s `{name}` holds NaN: exp(-inf - (-inf)) is NaN, so a query "
                                   "must not fold in a block while its running maximum and all the block's scores are "
                                   "-inf; leave out the keys it may not see")
    errors = [(out.double() - expected[..., r * n:(r + 1) * n, :]).abs().max().item() for r, out in enumerate(outputs)]
    if max(errors) <= tolerance:
        return _verdict(True, f"ring attention {mode} on {p} ranks equals full attention (max error "
                              f"{max(errors):.1e}): every query met every key it may see, with one softmax")
    for mistake, wrong in _wrong_answers(qs, ks, vs, causal).items():
        if all((out.double() - w).abs().max().item() <= tolerance for out, w in zip(outputs, wrong)):
            if mistake.startswith("offset") and not causal:
                continue
            return _verdict(False, f"{mode}: {WRONG[mistake]}")
    worst = errors.index(max(errors))
    return _verdict(False, f"{mode}: rank {worst}'s output differs from full attention by up to {max(errors):.2g}: "
                           "compare each step's block with the running maximum, total and output")
