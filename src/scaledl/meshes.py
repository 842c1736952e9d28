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


SEQUENCE_PARALLEL_HELP = ("also split the norms and the residual stream by tokens across the tp ranks (sequence "
                          "parallelism: --seq-len a multiple of them)")


def check_split(config, tp: int, world_size: int, sequence_parallel: bool = False) -> None:
    """The ranks can split the model: a transformer (the classifier or the language model), tp dividing
    the ranks and the heads (each rank computes whole heads; ColwiseParallel cuts q, k and v into tp
    equal slices of width/tp), and with sequence parallelism the tokens of a sample."""
    if config.model not in ("transformer", "gpt"):
        raise ConfigError("tensor parallelism splits a transformer's layers: use --model transformer (the default "
                          "here) or gpt, not cnn")
    if tp < 1 or world_size % tp:
        raise ConfigError(f"--tp must divide the {world_size} ranks into equal groups, got {tp}")
    if config.heads % tp:
        raise ConfigError(f"--heads {config.heads} must be a multiple of the {tp} tensor-parallel ranks (each "
                          "rank computes whole heads)")
    if sequence_parallel and config.seq_len % tp:
        raise ConfigError(f"--sequence-parallel: --seq-len {config.seq_len} must be a multiple of the {tp} "
                          "tensor-parallel ranks (each normalizes an equal share of the tokens)")


def tp_in_node(heads: int, ranks_per_node: int) -> int:
    """The default tensor-parallel group: ranks of one node (on Polaris its 4 GPUs, linked by NVLink),
    as many as divide the heads (4 of Aurora's 12 tiles for 16 heads).  Tensor parallelism all-reduces
    activations twice per block forward and twice backward (Shoeybi et al. 2019, section 3), too often
    for the network between nodes; the data-parallel collectives (DDP's all-reduce per step, FSDP2's
    per-layer all-gathers and reduce-scatters) overlap compute and may cross it."""
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
    data-parallel group (FSDP2 shards across it; all-gathers each layer in forward and in backward,
    reduce-scatters its gradients)."""
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
            label = {"ha": "center", "va": "center", "bbox": {"facecolor": "#C3D0E5", "edgecolor": "none", "pad": 1}}
            ax.text(col * 1.6 + 0.6, y * 1.1 + 0.5, f"rank {rank}", fontsize=9, **label)  # the box's colour, over
            ax.text(col * 1.6 + 0.6, y * 1.1 + 0.22, f"node {rank // ranks_per_node}", fontsize=7, color="#444444",
                    **label)  # the dp line behind it
        ax.plot([0.1, (tp - 1) * 1.6 + 1.1], [y * 1.1 - 0.08] * 2, color="#C44E52", linewidth=3)
        ax.text((tp - 1) * 1.6 + 1.35, y * 1.1 + 0.37, f"tp group {row}:\nsplits each layer\n(all-reduce)",
                va="center", fontsize=7.5, color="#C44E52")
    for col in range(tp):  # each dp group's line runs through its own column of rank boxes, behind them
        ax.plot([col * 1.6 + 0.6] * 2, [-0.05, (dp - 1) * 1.1 + 0.8], color="#55A868", linewidth=3, zorder=0)
    ax.text(-0.3, (dp - 1) * 1.1 / 2 + 0.37, "dp groups:\nFSDP2 shards\n(all-gather,\nreduce-scatter)",
            ha="right", va="center", fontsize=7.5, color="#55A868")
    ax.set_xlim(-1.6, tp * 1.6 + 1.2)
    ax.set_ylim(-0.3, dp * 1.1 + 0.1)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f'init_device_mesh(..., ({dp}, {tp}), mesh_dim_names=("dp", "tp"))', fontsize=9)
    return fig


def mlp_split_figure(tp: int = 2):
    """Megatron-LM's split of an MLP over `tp` ranks (Shoeybi et al. 2019, section 3, Figure 3a):
    the first layer's A by columns (no communication: GELU acts on each slice alone), the second
    layer's B by the matching rows, whose products are partial sums that one all-reduce adds up,
    before the bias goes on once."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    fig = Figure(figsize=(10, 1.3 * tp + 1.4), layout="constrained")
    ax = fig.subplots()
    colors = ["#4C72B0", "#DD8452", "#55A868", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974"]

    def box(x, y, w, text, color, h=0.8):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.03", facecolor=color,
                                    edgecolor="black", linewidth=0.8))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8)

    def arrow(x0, y0, x1, y1):
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="->", mutation_scale=10, linewidth=0.9))

    columns = [(0.0, 1.5), (2.0, 2.6), (5.1, 2.6), (8.2, 1.7)]  # x and width of each stage
    for r in range(tp):
        y = (tp - 1 - r) * 1.3
        color = colors[r % len(colors)] + "55"
        box(columns[0][0], y, columns[0][1], f"X\n(whole, rank {r})", "#FFFFFF")
        box(columns[1][0], y, columns[1][1], f"A_{r + 1}: columns of A\n(rows of up.weight)", color)
        box(columns[2][0], y, columns[2][1],
            f"Y_{r + 1} = GELU(X A_{r + 1})\ntimes B_{r + 1}: rows of B\n(columns of down.weight)", color)
        box(columns[3][0], y, columns[3][1], f"partial sum\nY_{r + 1} B_{r + 1}", color)
        for (x0, w0), (x1, _) in zip(columns, columns[1:]):
            arrow(x0 + w0 + 0.05, y + 0.4, x1 - 0.05, y + 0.4)
    top = (tp - 1) * 1.3 + 0.8
    ax.add_patch(FancyBboxPatch((10.3, 0), 1.2, top, boxstyle="round,pad=0.03", facecolor="#C44E5255",
                                edgecolor="#C44E52", linewidth=1.2))
    ax.text(10.9, top / 2, "all-reduce\n(sum)", ha="center", va="center", fontsize=8.5, color="#8B1E1E")
    for r in range(tp):
        y = (tp - 1 - r) * 1.3
        arrow(9.95, y + 0.4, 10.25, y + 0.4)
        box(11.9, y, 1.9, "Z = sum + bias\n(whole, every rank)", "#FFFFFF")
        arrow(11.55, y + 0.4, 11.85, y + 0.4)
    ax.text(3.3, top + 0.25, "column-parallel: no communication", ha="center", fontsize=8.5)
    ax.text(8.0, top + 0.25, "row-parallel: partial sums", ha="center", fontsize=8.5)
    ax.set_xlim(-0.2, 14.0)
    ax.set_ylim(-0.2, top + 0.6)
    ax.axis("off")
    ax.set_title(f"Y = GELU(X A), Z = Y B split over {tp} ranks (one rank a row)", fontsize=9)
    return fig


def sequence_parallel_figure(tp: int = 2):
    """One block on `tp` ranks with sequence parallelism (Korthikanti et al. 2022, section 4.2.2, Figure 5):
    the LayerNorms and the residual additions on each rank's share of the tokens, the attention and
    the MLP on each rank's share of the heads and hidden features; an all-gather of the tokens
    before each column-wise layer, a reduce-scatter of the partial sums after each row-wise one."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch

    stages = [("LayerNorm", "tokens"), ("all-gather", None), ("q, k, v, attention,\nout", "heads"),
              ("reduce-scatter", None), ("+ residual,\nLayerNorm", "tokens"), ("all-gather", None),
              ("MLP up, GELU,\ndown", "features"), ("reduce-scatter", None), ("+ residual", "tokens")]
    colors = {"tokens": "#55A86855", "heads": "#4C72B055", "features": "#4C72B055"}
    fig = Figure(figsize=(12, 1.0 * tp + 1.5), layout="constrained")
    ax = fig.subplots()
    x = 0.0
    for name, split in stages:
        width = 0.9 if split is None else 1.45
        if split is None:  # a collective spans the ranks
            ax.add_patch(FancyBboxPatch((x, 0), width, tp - 0.2, boxstyle="round,pad=0.02",
                                        facecolor="#C44E5233", edgecolor="#C44E52", linewidth=1))
            ax.text(x + width / 2, (tp - 0.2) / 2, name.replace("-", "-\n"), ha="center", va="center", fontsize=7.5,
                    color="#8B1E1E")
        else:
            for rank in range(tp):
                y = tp - 1 - rank
                share = {"tokens": f"tokens {rank + 1}/{tp}", "heads": f"heads {rank + 1}/{tp}",
                         "features": f"hidden {rank + 1}/{tp}"}[split]
                ax.add_patch(FancyBboxPatch((x, y), width, 0.8, boxstyle="round,pad=0.02", facecolor=colors[split],
                                            edgecolor="black", linewidth=0.8))
                ax.text(x + width / 2, y + 0.5, name, ha="center", va="center", fontsize=7.5)
                ax.text(x + width / 2, y + 0.13, share, ha="center", va="center", fontsize=6.5, color="#333333")
        x += width + 0.15
    for rank in range(tp):
        ax.text(-0.1, tp - 1 - rank + 0.4, f"rank {rank}", ha="right", va="center", fontsize=8)
    ax.set_xlim(-0.8, x)
    ax.set_ylim(-0.15, tp)
    ax.axis("off")
    ax.set_title("Sequence parallelism: green regions hold 1/tp of the tokens (whole heads and features), "
                 "blue ones 1/tp of the heads or features (every token)", fontsize=9)
    return fig
