"""Lesson 12's checks: what sequence parallelism leaves on a rank, and ring attention on live ranks."""
from __future__ import annotations

from scaledl import activations
from scaledl.workshop.checks.common import _FAILED, _number, _unfinished, _verdict

# seq_len, batch, width, heads, tp: sizes the prediction must hold for (each divides as the rung requires)
SP_CASES = [(32, 8, 64, 4, 2), (1024, 4, 768, 12, 4), (2048, 1, 4096, 32, 8), (96, 3, 96, 6, 3)]


def check_sp_block_bytes(sp_block_bytes) -> bool:
    """`sp_block_bytes(seq_len, batch, width, heads, tp)`: the fp32 bytes one block leaves for its
    backward on one of tp ranks under sequence parallelism, as DTensor's plan keeps them
    (scaledl.activations): 4 * s*b * (2h + (14h + 4 + a)/tp)."""
    if sp_block_bytes is None:
        return _unfinished("sp_block_bytes")
    for seq_len, batch, width, heads, tp in SP_CASES:
        case = f"seq_len={seq_len}, batch={batch}, width={width}, heads={heads}, tp={tp}"
        found = _number("sp_block_bytes", case, lambda: sp_block_bytes(seq_len, batch, width, heads, tp))
        if found is _FAILED:
            return False
        expected = activations.block_bytes(seq_len, batch, width, heads, tp=tp, sequence_parallel=True)
        if abs(found - expected) <= 0.02 * expected:  # the small terms (statistics, log-sum-exp) may go
            continue
        wrong = {
            activations.block_bytes(seq_len, batch, width, heads, tp=tp):
                "that is tensor parallelism alone: sequence parallelism also cuts the block's input, the sum after "
                "attention and the norms' statistics by tokens (2h + 4 values a token, over tp)",
            activations.block_bytes(seq_len, batch, width, heads) / tp:
                "that is every tensor over tp, Megatron-LM's count, which all-gathers the norms' outputs again in "
                "backward; DTensor's column-wise layers keep the gathered, whole-sequence copies (2h a token)",
            activations.block_bytes(seq_len, batch, width, heads):
                "that is the whole block on one rank: split q, k, v, attention's output and the MLP's tensors over "
                "the tp ranks",
            activations.block_bytes(seq_len, batch, width, heads, tp=tp, sequence_parallel=True) / 4:
                "that counts values: fp32 takes 4 bytes a value",
        }
        hint = next((why for value, why in wrong.items() if abs(found - value) <= 0.02 * value),
                    "walk the block: what is whole on each rank, what is split by heads, what by tokens")
        return _verdict(False, f"{case}: got {found:.0f}, expected {expected:.0f} bytes: {hint}")
    return _verdict(True, "sequence parallelism's bytes per rank (within 2%): the norm regions cut by tokens, the "
                          "gathered inputs of the column-wise layers whole, the rest cut by heads")


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
        return _verdict(False, f"`{name}` is not set on every rank: finish the exercise cell and run it")
    p, n = len(qs), qs[0].shape[-2]
    q, k, v = (torch.cat(blocks, -2) for blocks in (qs, ks, vs))
    mask = torch.ones(p * n, p * n, dtype=torch.bool).tril() if causal else None
    expected = _attention(q, k, v, mask)
    for rank, out in enumerate(outputs):
        if tuple(out.shape) != tuple(qs[rank].shape):
            return _verdict(False, f"rank {rank}'s `{name}` has shape {tuple(out.shape)}: it must match its "
                                   f"queries, {tuple(qs[rank].shape)} (one output row per query)")
    errors = [(out.double() - expected[..., r * n:(r + 1) * n, :]).abs().max().item() for r, out in enumerate(outputs)]
    mode = "causal" if causal else "without a mask"
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


LAYOUT_KEYS = ("dp", "tp", "pp", "zero", "recompute", "micro_batch_size")


def check_layout(layout, preset: str = "gpt3-2.7b", system: str = "polaris", nodes: int = 4,
                 global_batch_size: int = 512, within: float = 0.05) -> bool:
    """The capstone: `layout`, a dict of LAYOUT_KEYS for the language model at `preset`'s size on `nodes`
    of `system` at `global_batch_size` sequences a step, must be one the machine and DeepSpeed allow,
    fit in a device (scaledl.perf.choose's memory per rank) and be predicted within `within` of the
    fastest layout that fits."""
    from scaledl import models
    from scaledl.perf import choose, predict

    if layout is None:
        return _unfinished("layout")
    if not isinstance(layout, dict) or set(LAYOUT_KEYS) - set(layout):
        return _verdict(False, f"`layout` must be a dict with the keys {', '.join(LAYOUT_KEYS)}")
    dp, tp, pp, zero, recompute, micro = (layout[key] for key in LAYOUT_KEYS)
    sizes, machine, device = models.GPT_PRESETS[preset], predict.SYSTEMS[system], choose.DEVICES[system]
    if not all(isinstance(v, int) and v >= 1 for v in (dp, tp, pp, micro)) or zero not in (0, 1, 2, 3):
        return _verdict(False, "dp, tp, pp and micro_batch_size are whole numbers of at least 1, zero a stage 0-3")
    refused = choose.refusal(sizes, machine, nodes, global_batch_size, dp, tp, pp, zero, recompute, micro)
    if refused:
        return _verdict(False, refused)
    row = choose.evaluate(sizes, machine, device, nodes, global_batch_size, dp, tp, pp, zero, recompute, micro)
    limit = 0.9 * device.memory_bytes / 2**30
    if not row["fits"]:
        return _verdict(False, f"it needs {row['memory_gib']:.1f} GiB a rank, more than {limit:.0f} GiB (90% of the "
                               f"{device.name}'s): shard the state (a higher ZeRO stage), recompute, split the layers "
                               "or use smaller micro batches")
    best = choose.layouts(sizes, machine, device, nodes, global_batch_size)[0]
    named = ", ".join(f"{key} {best[key]}" for key in LAYOUT_KEYS)
    if row["step_s"] > (1 + within) * best["step_s"]:
        slow = max(("the pipeline's bubble", row["bubble"] * row["step_s"]), ("tensor parallelism's all-reduces",
                   row["tp_s"]), ("data parallelism's communication", row["dp_s"]), key=lambda part: part[1])
        extra = ("recomputing every block adds a third to the compute; " if recompute == "full" else "") + \
            f"its largest overhead is {slow[0]}, {slow[1]:.2f} s"
        return _verdict(False, f"it fits ({row['memory_gib']:.1f} GiB a rank) but is predicted at {row['step_s']:.2f} "
                               f"s a step, more than {within:.0%} slower than the fastest that fits, "
                               f"{best['step_s']:.2f} s ({named}): {extra}")
    return _verdict(True, f"{row['memory_gib']:.1f} GiB a rank, {row['step_s']:.2f} s a step predicted, within "
                          f"{within:.0%} of the fastest that fits ({best['step_s']:.2f} s: {named})")


_KINDS = {"dp": "data parallelism", "tp": "tensor parallelism", "pp": "a pipeline"}


def _kind(row: dict) -> str:
    return "tp" if row["tp"] > 1 else "pp" if row["pp"] > 1 else "dp"


def check_fastest_here(fastest_here, rows: list[dict]) -> bool:
    """`fastest_here` ("dp", "tp" or "pp"): the layout of the 2-rank runs (`scaledl.perf.bench.layouts.compare`'s
    rows, one of each kind) that measured the fastest step; a wrong one is told what its predicted parts cost."""
    if fastest_here is None:
        return _unfinished("fastest_here")
    if fastest_here not in _KINDS:
        return _verdict(False, f"`fastest_here` is one of \"dp\", \"tp\", \"pp\", got {fastest_here!r}")
    by_kind = {_kind(row): row for row in rows}
    fastest = min(rows, key=lambda row: row["measured_ms"])
    best = _kind(fastest)
    if fastest_here == best:
        return _verdict(True, f"{_KINDS[best]} ran the fastest step here; the cell above shows where the chooser's "
                              "parts put the other two")
    mine = by_kind[fastest_here]
    why = {"dp": f"one all-reduce of the gradients a step, {mine['dp_ms']:.3g} ms predicted",
           "tp": f"4 all-reduces a block and micro batch, {mine['tp_ms']:.3g} ms predicted, none hidden",
           "pp": f"a bubble of {mine['bubble']:.0%} and {mine['pp_ms']:.3g} ms of sends predicted"}[fastest_here]
    return _verdict(False, f"{_KINDS[fastest_here]} measured {mine['measured_ms']:.3g} ms a step, {_KINDS[best]} "
                           f"{fastest['measured_ms']:.3g} ms: {fastest_here} costs {why}, against the "
                           f"{fastest['predicted_ms'] - fastest['compute_ms']:.3g} ms {best} adds to its compute")
