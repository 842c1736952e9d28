"""Tensor and 2D parallelism's helpers: the checks a split must pass, what each rank holds, the mesh figure.

The tensor-parallel rungs (`ladder/tensor_parallel.py`, `ladder/fsdp_tp.py`) split the transformer
of `scaledl.models` Megatron-LM's way (Shoeybi et al. 2019, arXiv:1909.08053, section 3): each of
the tp ranks of a group holds 1/tp of every block's linear layers, and the 2D rung's FSDP2 shards
everything once more across the dp groups.  `param_bytes_per_rank` is that arithmetic, which the
tests compare with the bytes the ranks hold; `mesh_figure` draws the dp x tp grid.
"""
from __future__ import annotations

import math

from scaledl.config import ConfigError
from scaledl.models import VOCAB_SIZE, transformer_num_params, transformer_sharded_params


def check_split(config, tp: int, world_size: int) -> None:
    """The ranks can split the model: a transformer, tp dividing the ranks and the heads (each rank
    computes whole heads; ColwiseParallel cuts q, k and v into tp equal slices of width/tp)."""
    if config.model != "transformer":
        raise ConfigError("tensor parallelism splits the transformer's layers: leave out --model cnn")
    if tp < 1 or world_size % tp:
        raise ConfigError(f"--tp must divide the {world_size} ranks into equal groups, got {tp}")
    if config.heads % tp:
        raise ConfigError(f"--heads {config.heads} must be a multiple of the {tp} tensor-parallel ranks (each "
                          "rank computes whole heads)")


def tp_in_node(heads: int, ranks_per_node: int) -> int:
    """The default tensor-parallel group: ranks of one node (on Polaris its 4 GPUs, linked by NVLink),
    as many as divide the heads (4 of Aurora's 12 tiles for 16 heads).  Tensor parallelism all-reduces
    activations twice per block forward and twice backward (Shoeybi et al. 2019, section 3), too often
    for the network between nodes; data parallelism crosses it once per step."""
    return math.gcd(heads, ranks_per_node)


def param_bytes_per_rank(width: int, depth: int, seq_len: int, tp: int, dp: int = 1, num_classes: int = 10,
                         vocab_size: int = VOCAB_SIZE, bytes_per_param: int = 4) -> float:
    """Bytes of parameters one rank holds: 1/(tp*dp) of the layers tensor parallelism splits, 1/dp of
    the rest (embeddings, LayerNorms, the row-wise layers' biases, the classifier), which every tp rank
    keeps whole.  Exact where each sharded dimension divides evenly (FSDP2 pads uneven ones)."""
    sharded = transformer_sharded_params(width, depth)
    whole = transformer_num_params(width, depth, seq_len, vocab_size, num_classes) - sharded
    return bytes_per_param * (sharded / (tp * dp) + whole / dp)


def local_param_bytes(model) -> int:
    """Bytes of parameters this rank holds: a DTensor's local shard, a plain tensor whole."""
    local = (p.to_local() if hasattr(p, "to_local") else p for p in model.parameters())
    return sum(t.numel() * t.element_size() for t in local)


def mesh_figure(dp: int = 2, tp: int = 2, ranks_per_node: int | None = None):
    """The dp x tp grid of ranks: each row a tensor-parallel group (splits every layer; all-reduces
    activations twice per block, forward and backward: kept inside a node), each column a
    data-parallel group (FSDP2 shards across it; all-gathers and reduce-scatters once per layer)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch

    ranks_per_node = ranks_per_node or tp
    fig = Figure(figsize=(1.9 * tp + 3.2, 1.25 * dp + 1.4), layout="constrained")
    ax = fig.subplots()
    for row in range(dp):
        y = dp - 1 - row
        for col in range(tp):
            rank = row * tp + col
            ax.add_patch(FancyBboxPatch((col * 1.6, y * 1.1), 1.2, 0.75, boxstyle="round,pad=0.03",
                                        facecolor="#4C72B055", edgecolor="black", linewidth=0.8))
            ax.text(col * 1.6 + 0.6, y * 1.1 + 0.5, f"rank {rank}", ha="center", va="center", fontsize=9)
            ax.text(col * 1.6 + 0.6, y * 1.1 + 0.22, f"node {rank // ranks_per_node}", ha="center", va="center",
                    fontsize=7, color="#444444")
        ax.plot([0.1, (tp - 1) * 1.6 + 1.1], [y * 1.1 - 0.08] * 2, color="#C44E52", linewidth=3)
        ax.text((tp - 1) * 1.6 + 1.35, y * 1.1 + 0.37, f"tp group {row}:\nsplits each layer\n(all-reduce)",
                va="center", fontsize=7.5, color="#C44E52")
    for col in range(tp):
        ax.plot([col * 1.6 - 0.12] * 2, [0.05, (dp - 1) * 1.1 + 0.7], color="#55A868", linewidth=3)
    ax.text(-0.3, (dp - 1) * 1.1 / 2 + 0.37, "dp groups:\nFSDP2 shards\n(all-gather,\nreduce-scatter)",
            ha="right", va="center", fontsize=7.5, color="#55A868")
    ax.set_xlim(-1.6, tp * 1.6 + 1.2)
    ax.set_ylim(-0.3, dp * 1.1 + 0.1)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f'init_device_mesh(..., ({dp}, {tp}), mesh_dim_names=("dp", "tp"))', fontsize=9)
    return fig
