"""Context parallelism: attention over a sequence cut into one block of tokens per rank.

Tensor and sequence parallelism still give every rank the whole sequence somewhere in a block (the
attention's q, k and v of its heads; the all-gathered input of the column-wise layers).  At long
context that alone does not fit, and the sequence itself is cut: rank r of p holds the queries,
keys and values of tokens r*s/p to (r+1)*s/p - 1, for every layer.  Everything but attention works
token by token, so it runs on each rank's block alone; attention needs every key for every query.

Ring attention (Liu, Zaharia and Abbeel 2023, arXiv:2310.01889, section 3) passes the key and value
blocks around a ring of the ranks: at step t rank r holds the block of rank (r - t) mod p, computes
its queries' scores against it, and sends it on while the next one arrives.  The softmax over keys
it never holds at once is combined online (Milakov and Gimelshein 2018, arXiv:1805.02867), as
FlashAttention combines its tiles: keep, per query, the running maximum m, the running sum of
exp(score - m) and the running output; when a block's maximum is larger, rescale the two running
sums by exp(m_old - m_new) before adding the block's.  Under a causal mask rank r skips the blocks
of later ranks, masks the diagonal within its own block, and uses every key of earlier ranks' blocks
(the block offset); so the ranks' work differs (Brandon et al. 2023, arXiv:2311.09431, balance it).

`ring_schedule` says which block each rank holds and uses at each step (the lesson's figure),
`ring_step_bytes` and `ring_step_flops` what a step sends and computes, and `tokens_to_hide` how
many tokens a rank needs before the step's compute hides its send.  `torch_attention` is PyTorch's
own context parallelism (`torch.distributed.tensor.experimental.context_parallel`), where the device has it: by
default it all-gathers K and V once per attention call and passes only dK and dV round the ring (its
`set_rotate_method("alltoall")` passes K and V too).
"""
from __future__ import annotations

from scaledl.errors import UserError


class ContextParallelUnavailable(UserError):
    """PyTorch's context-parallel attention has no kernel for this device; the message says why, in one line."""


def ring_schedule(world_size: int, causal: bool, order: str = "contiguous") -> list[list[tuple[int, str]]]:
    """[step][rank] -> (the rank whose key/value block it holds, "full", "half", "diagonal" or "skipped").
    `order` is how the tokens are dealt out: "contiguous" (rank r holds the r-th of p chunks) or "head-tail"
    (rank r holds chunks r and 2p - 1 - r of 2p, PyTorch's `_HeadTailLoadBalancer`).  Under a causal mask
    head-tail gives every rank half of every other rank's block: its late chunk sees the other's early chunk,
    and one of its chunks sees the other's other chunk; its own block, "diagonal", is half too."""
    if order not in ("contiguous", "head-tail"):
        raise ValueError(f"order is 'contiguous' or 'head-tail', not {order!r}")
    steps = []
    for step in range(world_size):
        row = []
        for rank in range(world_size):
            source = (rank - step) % world_size
            if not causal:
                use = "full"
            elif source == rank:
                use = "diagonal"
            elif order == "head-tail":
                use = "half"
            else:
                use = "full" if source < rank else "skipped"
            row.append((source, use))
        steps.append(row)
    return steps


def ring_step_bytes(tokens_per_rank: int, batch: int, width: int, bytes_per_value: int = 2) -> int:
    """Bytes a rank sends in one ring step: its current key and value blocks (all heads: width values a token)."""
    return 2 * tokens_per_rank * batch * width * bytes_per_value


def ring_step_flops(tokens_per_rank: int, batch: int, width: int) -> int:
    """Forward flops of one ring step on one rank, without a mask: its queries' scores against one key
    block (2*n*n*width) and the weighted sum of one value block (2*n*n*width), n = tokens_per_rank."""
    return 4 * tokens_per_rank * tokens_per_rank * batch * width


def tokens_to_hide(peak_flops: float, bandwidth_Bps: float, bytes_per_value: int = 2) -> float:
    """Tokens per rank at which a step's compute takes as long as its send: above it, the next block
    arrives while this one is still being used.  From ring_step_flops / peak = ring_step_bytes /
    bandwidth: 4 n^2 b h / F = 2 n b h e / B, so n = F e / (2 B) (batch and width cancel)."""
    return peak_flops * bytes_per_value / (2 * bandwidth_Bps)


def torch_attention(q, k, v, mesh, causal: bool):
    """`F.scaled_dot_product_attention` over the whole sequence, computed by PyTorch's context-parallel
    ring on `mesh`: q, k and v are the whole tensors (batch, heads, tokens, head_dim), the same on every
    rank; inside the context each rank keeps its share of the tokens (PyTorch's load-balanced order
    under a causal mask) and gets back that share of the output, which this gathers back to the whole.
    Raises ContextParallelUnavailable (one line) where the torch or the device lacks it: at torch
    2.13 the ring replaces the flash, memory-efficient and cuDNN kernels, CUDA's
    (torch/distributed/tensor/experimental/_context_parallel/_attention.py); the CPU's flash kernel
    has no rule."""
    import torch.nn.functional as F

    try:
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import context_parallel_unshard
    except ImportError as error:
        raise ContextParallelUnavailable(f"this torch has no context-parallel attention ({error})") from None
    buffers = [t.clone() for t in (q, k, v)]
    try:
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2]):
            out = F.scaled_dot_product_attention(*buffers, is_causal=causal)
    except NotImplementedError as error:
        raise ContextParallelUnavailable(f"PyTorch's context-parallel attention does not run on "
                                         f"{q.device.type}: {str(error).splitlines()[0]}") from None
    return context_parallel_unshard(mesh, [out], [2])[0]


def ring_figure(world_size: int = 4, causal: bool = True, head_tail: bool = False):
    """Ranks down, ring steps across: the key/value block each rank holds at each step, and whether a
    causal mask lets it use all of it, half of it, its diagonal, or none.  With `head_tail`, a second
    panel below deals the tokens out in PyTorch's head-tail order (`ring_schedule`)."""
    from matplotlib.figure import Figure

    orders = ["contiguous", "head-tail"] if head_tail else ["contiguous"]
    fig = Figure(figsize=(1.5 * world_size + 2.6, (0.9 * world_size + 1.3) * len(orders)), layout="constrained")
    for ax, order in zip(fig.subplots(len(orders), 1, squeeze=False)[:, 0], orders):
        _ring_panel(ax, world_size, causal, order)
    return fig


def _ring_panel(ax, world_size: int, causal: bool, order: str) -> None:
    from matplotlib.patches import FancyArrowPatch, Rectangle

    colors = {"full": "#4C72B0AA", "half": "#4C72B055", "diagonal": "#DD8452AA", "skipped": "#DDDDDD"}
    labels = {"full": "all keys", "half": "half the work", "diagonal": "diagonal", "skipped": "skipped"}
    for step, row in enumerate(ring_schedule(world_size, causal, order)):
        for rank, (source, use) in enumerate(row):
            y = world_size - 1 - rank
            ax.add_patch(Rectangle((step * 1.5, y), 1.3, 0.8, facecolor=colors[use], edgecolor="black", linewidth=0.8))
            ax.text(step * 1.5 + 0.65, y + 0.52, f"K, V of {source}", ha="center", va="center", fontsize=8)
            ax.text(step * 1.5 + 0.65, y + 0.22, labels[use], ha="center", va="center", fontsize=7, color="#333333")
            if step < world_size - 1 and rank < world_size - 1:  # the block moves one rank down, one step on
                ax.add_patch(FancyArrowPatch((step * 1.5 + 1.3, y + 0.4), (step * 1.5 + 1.5, y - 0.4),
                                             arrowstyle="->", mutation_scale=8, linewidth=0.6, color="#555555"))
    for rank in range(world_size):
        queries = f"chunks {rank}, {2 * world_size - 1 - rank}" if order == "head-tail" else f"queries {rank}"
        ax.text(-0.15, world_size - 1 - rank + 0.4, f"rank {rank}\n({queries})", ha="right", va="center",
                fontsize=8)
    for step in range(world_size):
        ax.text(step * 1.5 + 0.65, world_size + 0.15, f"step {step}", ha="center", fontsize=8)
    ax.set_xlim(-1.6, world_size * 1.5)
    ax.set_ylim(-0.2, world_size + 0.5)
    ax.axis("off")
    if order == "head-tail":
        title = (f"Head-tail order: rank r holds chunks r and {2 * world_size - 1} - r of {2 * world_size}; "
                 "under the causal mask every rank uses half of each block")
    else:
        mask = "causal: later ranks' blocks skipped, the own block's diagonal masked" if causal else "no mask"
        title = (f"Ring attention on {world_size} ranks, {mask}\neach step every block moves to the next rank "
                 f"(rank {world_size - 1}'s to rank 0)")
    ax.set_title(title, fontsize=9)
