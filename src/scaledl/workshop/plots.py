"""The lessons' figures, drawn from numbers the lessons measure (or from the arithmetic they teach).

Each function returns a matplotlib Figure built without pyplot (no global state, no display
side effects); `image(fig)` turns it into the PNG a notebook shows and stores, so the figures
read on GitHub and the tests can call every function.
"""
from __future__ import annotations

import io
import math

COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868", "activations": "#8172B3",
          "forward": "#4C72B0", "backward": "#DD8452", "comm": "#C44E52", "idle": "#DDDDDD"}


def _figure(width: float, height: float, ncols: int = 1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols)
    return fig, axes


def png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


def image(fig):
    """The figure as an IPython Image: the notebook shows it and stores it with its outputs."""
    from IPython.display import Image

    return Image(data=png(fig), format="png")


def _box(ax, x, y, w, h, text, color, fontsize=8):
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", facecolor=color, edgecolor="black",
                                linewidth=0.8))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def parallelism(world_size: int = 4):
    """Data parallelism (whole model per rank, data split, gradients all-reduced) next to model
    parallelism (layers split over ranks, activations passed along)."""
    fig, (left, right) = _figure(10, 3.6, 2)
    layers = ["conv 1", "conv 2", "linear 1", "linear 2"]
    for rank in range(world_size):
        x = rank * 1.2
        _box(left, x, 3.0, 1.0, 0.5, f"batch {rank}/{world_size}", "#EEEEEE")
        for i, layer in enumerate(layers):
            _box(left, x, 2.2 - i * 0.5, 1.0, 0.4, layer, COLORS["params"] + "55", fontsize=7)
        left.annotate("", (x + 0.5, 2.6), (x + 0.5, 3.0), arrowprops={"arrowstyle": "->"})
    left.plot([0.1, world_size * 1.2 - 0.3], [0.35, 0.35], color=COLORS["comm"], linewidth=3)
    left.text(world_size * 0.6 - 0.1, 0.05, "all-reduce of the gradients, every step", ha="center",
              color=COLORS["comm"], fontsize=8)
    left.set_title("data parallelism: every rank holds the whole model")
    for i, layer in enumerate(layers):
        x = i * 1.2
        _box(right, x, 1.6, 1.0, 0.6, f"rank {i}\n{layer}", COLORS["params"] + "55")
        if i:
            right.annotate("", (x, 1.9), (x - 0.2, 1.9), arrowprops={"arrowstyle": "->", "color": COLORS["comm"]})
    _box(right, 0, 2.8, 1.0, 0.5, "whole batch", "#EEEEEE")
    right.annotate("", (0.5, 2.2), (0.5, 2.8), arrowprops={"arrowstyle": "->"})
    right.text(2.3, 1.1, "activations forward, their gradients back\n(send / recv between neighbours)",
               ha="center", color=COLORS["comm"], fontsize=8)
    right.set_title("model (pipeline) parallelism: every rank holds a part")
    for ax in (left, right):
        ax.set(xlim=(-0.2, 4.8), ylim=(-0.1, 3.7))
        ax.axis("off")
    return fig


def training_memory(parts_gb: dict, device_gb: float, device_name: str = "one GPU"):
    """Stacked bars of what training a model keeps (parameters, gradients, optimizer states,
    activations), against one device's memory."""
    fig, ax = _figure(6.5, 3.4)
    bottom = 0.0
    for key, value in parts_gb.items():
        ax.bar(["training state"], [value], bottom=bottom, color=COLORS.get(key, None), label=f"{key} {value:,.0f} GB")
        bottom += value
    ax.axhline(device_gb, color="black", linestyle="--")
    ax.text(-0.38, device_gb, f"{device_name}: {device_gb:g} GB", va="bottom", fontsize=8,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
    ax.set(ylabel="GB", title=f"{bottom:,.0f} GB needed, {device_gb:g} GB on the device")
    # Beside the axes, not over them: the bar fills the plot's width.
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8, frameon=False)
    return fig


def ring_allreduce(world_size: int = 4):
    """The ring all-reduce: each of world_size ranks sends one chunk to its right-hand neighbour
    per step; world_size - 1 reduce-scatter steps, then world_size - 1 all-gather steps."""
    import numpy as np
    from matplotlib.patches import Circle

    fig, (ring, grid) = _figure(10, 3.8, 2)
    angles = [math.pi / 2 - 2 * math.pi * r / world_size for r in range(world_size)]
    points = [(math.cos(a), math.sin(a)) for a in angles]
    for rank, (x, y) in enumerate(points):
        ring.add_patch(Circle((x, y), 0.22, facecolor=COLORS["params"] + "55", edgecolor="black"))
        ring.text(x, y, f"rank {rank}", ha="center", va="center", fontsize=8)
        nx, ny = points[(rank + 1) % world_size]
        ring.annotate("", (nx * 0.8 + x * 0.2, ny * 0.8 + y * 0.2), (x * 0.8 + nx * 0.2, y * 0.8 + ny * 0.2),
                      arrowprops={"arrowstyle": "->", "color": COLORS["comm"], "linewidth": 1.5})
    ring.set(xlim=(-1.4, 1.4), ylim=(-1.4, 1.4), aspect="equal")
    # Two lines: the ring's square axes are narrower than one line of title.
    ring.set_title(f"each step, every rank sends\n1/{world_size} of the buffer to the next")
    ring.axis("off")
    steps = 2 * (world_size - 1)
    chunk = np.zeros((world_size, steps))
    for step in range(steps):
        for rank in range(world_size):
            chunk[rank, step] = (rank - step) % world_size  # the chunk this rank sends at this step
    grid.imshow(chunk, cmap="tab10", vmin=0, vmax=9, aspect="auto")
    for step in range(steps):
        for rank in range(world_size):
            grid.text(step, rank, f"{int(chunk[rank, step])}", ha="center", va="center", fontsize=8)
    grid.axvline(world_size - 1.5, color="black")
    grid.set(xticks=range(steps), xticklabels=[str(s + 1) for s in range(steps)], yticks=range(world_size),
             xlabel="step (left: reduce-scatter, right: all-gather)", ylabel="rank",
             title="the chunk each rank sends at each step")
    return fig


def allreduce_cost(nbytes, seconds, alpha: float, inverse_beta: float, world_size: int):
    """Measured all-reduce time against the ring model 2(p-1) alpha + 2(p-1)/p n/beta, log-log."""
    import numpy as np

    fig, ax = _figure(6, 3.6)
    n = np.asarray(nbytes, dtype=float)
    p = world_size
    model = 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * inverse_beta
    ax.loglog(n, np.asarray(seconds) * 1e6, "o", label="measured")
    ax.loglog(n, model * 1e6, "-", label=f"model: alpha {alpha * 1e6:.0f} us, beta {1 / inverse_beta / 1e9:.2f} GB/s")
    ax.loglog(n, np.full(len(n), 2 * (p - 1) * alpha * 1e6), ":", color="gray", label="latency term alone")
    ax.set(xlabel="bytes all-reduced", ylabel="time (us)", title=f"all-reduce on {p} ranks")
    ax.legend(fontsize=8)
    return fig


def sampler_order(orders: dict, num_samples: int):
    """Sample order per epoch, one panel per case ({"title": [[indices of epoch 0], ...]}):
    identical rows mean every epoch repeats the same order."""
    fig, axes = _figure(5 * len(orders), 2.8, len(orders))
    axes = [axes] if len(orders) == 1 else list(axes)
    for ax, (title, epochs) in zip(axes, orders.items()):
        image = ax.imshow(epochs, cmap="viridis", vmin=0, vmax=num_samples - 1, aspect="auto")
        ax.set(title=title, xlabel="position in the epoch (this rank)", ylabel="epoch", yticks=range(len(epochs)))
    fig.colorbar(image, ax=axes, label="sample index", shrink=0.9)
    return fig


def ddp_timeline(events_by_rank: list):
    """Backward and all-reduce on each rank against time.  Each rank's events are
    (row, label, start_s, end_s) with row "backward" or "all-reduce"; times from a common zero.

    A layer whose backward takes a few microseconds still shows, as a bar of the figure's
    smallest visible width; a label wider than its bar goes beside the bar, alternately above and
    below, so that the labels of short neighbours do not cover each other."""
    fig, ax = _figure(10, 1.4 + 1.3 * len(events_by_rank))
    span_ms = max((end for events in events_by_rank for *_, end in events), default=0.001) * 1e3
    min_width_ms = span_ms / 300
    chars_per_ms = 120 / span_ms  # 6-point characters across the axis, about 120 in 10 inches
    yticks, ylabels = [], []
    for rank, events in enumerate(events_by_rank):
        for offset, row in enumerate(("backward", "all-reduce")):
            y = rank * 3.2 + (1 - offset) * 1.4
            yticks.append(y)
            ylabels.append(f"rank {rank} {row}")
            levels = [0.36, -0.36, 0.62, -0.62]  # beside the bar: above, below, then a step further out
            ends = dict.fromkeys(levels, -math.inf)  # where the last label at each level ends, in ms
            for kind, label, start, end in sorted((e for e in events if e[0] == row), key=lambda e: e[2]):
                start_ms, width_ms = start * 1e3, max((end - start) * 1e3, min_width_ms)
                color = COLORS["backward"] if row == "backward" else COLORS["comm"]
                ax.barh(y, width_ms, left=start_ms, height=0.6, color=color, edgecolor="black", linewidth=0.5)
                middle = start_ms + width_ms / 2
                if len(label) + 1 <= width_ms * chars_per_ms:
                    ax.text(middle, y, label, ha="center", va="center", fontsize=6)
                else:  # beside the bar, at the first level still free there; near an end of the axis, running inwards
                    align = "left" if middle < 0.05 * span_ms else "right" if middle > 0.95 * span_ms else "center"
                    text_ms = (len(label) + 1) / chars_per_ms
                    left = middle - {"left": 0, "center": text_ms / 2, "right": text_ms}[align]
                    level = next((lv for lv in levels if ends[lv] <= left), min(levels, key=ends.get))
                    ends[level] = left + text_ms
                    ax.text(middle, y + level, label, ha=align, va="bottom" if level > 0 else "top", fontsize=6)
    ax.set(yticks=yticks, yticklabels=ylabels, xlabel="ms since backward started", xlim=(0, span_ms * 1.02),
           ylim=(-0.9, (len(events_by_rank) - 1) * 3.2 + 2.3),
           title="DDP on every rank (torch.profiler): backward op by op, all-reduce bucket by bucket\n"
                 "(\"small ops\": neighbouring ops each under 5% of backward, merged into one bar)")
    return fig


def zero_memory(panels: dict):
    """Bytes per rank at each ZeRO stage, stacked by kind; one panel per case:
    {"title": {stage: {"params": bytes, "grads": bytes, "optimizer": bytes}}}."""
    fig, axes = _figure(6 * len(panels), 3.6, len(panels))
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (title, stages) in zip(axes, panels.items()):
        names = [f"stage {s}" for s in stages]
        scale, unit = (1e9, "GB") if max(sum(v.values()) for v in stages.values()) > 1e9 else (1e6, "MB")
        bottom = [0.0] * len(stages)
        for key in ("params", "grads", "optimizer"):
            values = [stages[s][key] / scale for s in stages]
            ax.bar(names, values, bottom=bottom, color=COLORS[key], label=key)
            bottom = [b + v for b, v in zip(bottom, values)]
        for x, total in enumerate(bottom):
            ax.text(x, total, f"{total:.3g}", ha="center", va="bottom", fontsize=8)
        ax.set(title=title, ylabel=f"{unit} per rank")
        ax.legend(fontsize=8)
    return fig


def _bar_labels(ax, labels: list, span: float, fontsize: float, margin: float = 4, boxed: bool = False) -> None:
    """Write each (middle, row, width, text) label inside its bar, in data units of an x axis `span` wide, only
    where the bar is wider than its text (at most 0.7 of the font size a character) and a margin (points): a
    narrower bar stays bare.  The axis is taken as 10% wider than `span`, for matplotlib's margins.  `boxed`
    puts each label on a white patch, readable on a hatched bar."""
    points_per_unit = ax.get_position().width * ax.figure.get_figwidth() * 72 / (1.1 * span) if span > 0 else 0.0
    box = {"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.85} if boxed else None
    for middle, row, width, text in labels:
        if width * points_per_unit >= 0.7 * fontsize * len(text) + margin:  # the text, with a margin each side
            ax.text(middle, row, text, ha="center", va="center", fontsize=fontsize, bbox=box)


def pipeline_schedule(forward_s: list, backward_s: list, microbatches: int):
    """The GPipe schedule from measured per-stage times (forward and backward of one micro batch
    on each stage): all forwards, then all backwards, micro batch 0 first both ways, as torch's
    `ScheduleGPipe._step_microbatches` runs them; grey is the bubble."""
    stages = len(forward_s)
    fig, ax = _figure(10, 0.9 + 0.6 * stages)
    free = [0.0] * stages  # when each stage is next free
    done_forward = [[0.0] * microbatches for _ in range(stages)]
    labels = []  # (middle, row, width, text), written once the step's length is known
    for m in range(microbatches):
        for s in range(stages):
            start = max(free[s], done_forward[s - 1][m] if s else 0.0)
            free[s] = done_forward[s][m] = start + forward_s[s]
            ax.barh(s, forward_s[s] * 1e3, left=start * 1e3, color=COLORS["forward"], edgecolor="black")
            labels.append(((start + forward_s[s] / 2) * 1e3, s, forward_s[s] * 1e3, f"F{m}"))
    done_backward = [[0.0] * microbatches for _ in range(stages)]
    for m in range(microbatches):  # torch's order: micro batch 0's backward first
        for s in reversed(range(stages)):
            ready = done_forward[stages - 1][microbatches - 1] if s == stages - 1 else done_backward[s + 1][m]
            start = max(free[s], ready)
            free[s] = done_backward[s][m] = start + backward_s[s]
            ax.barh(s, backward_s[s] * 1e3, left=start * 1e3, color=COLORS["backward"], edgecolor="black")
            labels.append(((start + backward_s[s] / 2) * 1e3, s, backward_s[s] * 1e3, f"B{m}"))
    end = max(free)
    _bar_labels(ax, labels, end * 1e3, 7)
    ax.barh(range(stages), [end * 1e3] * stages, color=COLORS["idle"], zorder=0)
    busy = sum(microbatches * (f + b) for f, b in zip(forward_s, backward_s))
    bubble = 1 - busy / (stages * end)
    ax.set(yticks=range(stages), yticklabels=[f"stage {s} (rank {s})" for s in range(stages)],
           xlabel="ms", title=f"GPipe, {stages} stages x {microbatches} micro batches: bubble {bubble:.0%} "
                              f"(formula (S-1)/(M+S-1) = {(stages - 1) / (microbatches + stages - 1):.0%})")
    ax.invert_yaxis()
    fig.bubble = bubble  # what the drawing shows, for a caller or a test
    return fig


def pipeline_timeline(events: list, step: int | None = None, title: str = ""):
    """One step of a pipeline as it ran (`scaledl.pipeline_events`: the rung's pipeline_events.json):
    a row per rank, each forward (blue) and backward (orange) where its stage's clock put it, labelled
    F<micro batch> or B<micro batch>; grey is the time the rank sat idle.  Where a rank holds two stages
    (interleaved), the bars of its second stage are hatched and labelled with the micro batch alone, the
    legend saying which is which: the narrow bars have room for one digit."""
    from matplotlib.patches import Patch

    from scaledl import pipeline_events

    step = max(e[0] for e in events) if step is None else step
    mine = [e for e in events if e[0] == step]
    ranks = sorted({e[1] for e in mine})
    several = len({e[2] for e in mine}) > len(ranks)  # interleaved: two stages a rank
    start = min(e[5] for e in mine)
    span = max(e[6] for e in mine) - start
    fig, ax = _figure(10, 1.3 + 0.6 * len(ranks))
    ax.barh(ranks, [span * 1e3] * len(ranks), color=COLORS["idle"], zorder=0)
    labels = []
    for _, rank, stage, kind, micro_batch, begin, end in mine:
        color = COLORS["forward" if kind == "F" else "backward"]
        ax.barh(rank, (end - begin) * 1e3, left=(begin - start) * 1e3, color=color, edgecolor="black", linewidth=0.5,
                hatch="//" if several and stage >= len(ranks) else None)
        label = f"{micro_batch}" if several else f"{kind}{micro_batch}"
        labels.append(((begin - start + (end - begin) / 2) * 1e3, rank, (end - begin) * 1e3, label))
    _bar_labels(ax, labels, span * 1e3, 6, margin=2 if several else 4, boxed=several)
    handles = [Patch(color=COLORS["forward"], label="forward (F), of the micro batch written on it"),
               Patch(color=COLORS["backward"], label="backward (B)"), Patch(color=COLORS["idle"], label="idle")]
    if several:
        last = len(ranks) - 1
        handles.insert(2, Patch(facecolor="white", edgecolor="black", hatch="//",
                                label=f"hatched: the rank's second chunk (stages {last + 1}-{2 * last + 1}); "
                                      f"plain: its first (stages 0-{last})"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=7, frameon=False)
    measured = pipeline_events.bubble(mine, skip_first=False)
    ax.set(yticks=ranks, yticklabels=[f"rank {r}" for r in ranks], xlabel="ms from the step's first forward",
           title=f"{title or f'step {step} as measured'}: the ranks idle {measured:.0%} of it")
    ax.invert_yaxis()
    fig.bubble = measured
    return fig


def scaling(runs: dict):
    """Efficiency against world size for each mode: {"weak": {world_size: samples/s}, ...}."""
    fig, (speed, efficiency) = _figure(10, 3.4, 2)
    every = sorted({n for rates in runs.values() for n in rates})
    for mode, rates in runs.items():  # each mode against its own one-rank run: the two baselines differ
        sizes = sorted(rates)
        base = rates[sizes[0]] / sizes[0]
        line, = speed.plot(sizes, [rates[n] for n in sizes], "o-", label=mode)
        speed.plot(every, [n * base for n in every], "--", color=line.get_color(), lw=0.8, label=f"ideal ({mode})")
        efficiency.plot(sizes, [rates[n] / (n * base) for n in sizes], "o-", label=mode)
    efficiency.axhline(1.0, linestyle="--", color="gray", label="ideal")
    speed.set(xlabel="world_size", ylabel="samples/s", xticks=every, title="throughput")
    efficiency.set(xlabel="world_size", ylabel="efficiency", xticks=every, ylim=(0, 1.2),
                   title="efficiency = samples/s / (N x one rank's)")
    speed.legend(fontsize=8)
    efficiency.legend(fontsize=8)
    return fig


def lr_schedules(curves: dict, steps_per_epoch: dict):
    """Learning rate against epoch for each global batch size: {label: [lr per step]}."""
    fig, ax = _figure(6, 3.4)
    for label, lrs in curves.items():
        ax.plot([step / steps_per_epoch[label] for step in range(len(lrs))], lrs, label=label)
    ax.set(xlabel="epoch", ylabel="lr", title="linear scaling rule with a linear warm-up")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: no curve under it
    return fig


def _stagger(times: list[float], span: float, levels: int = 4) -> list[int]:
    """A label level for each of `times`: the lowest level whose last label is more than 7% of the
    axis away (labels are about that wide), else the level whose last label is farthest, so labels
    that sit close together do not overlap."""
    last: list[float | None] = [None] * levels
    out = [0] * len(times)
    for index in sorted(range(len(times)), key=times.__getitem__):
        at = times[index]
        free = [level for level in range(levels) if last[level] is None or at - last[level] > 0.07 * span]
        level = free[0] if free else min(range(levels), key=lambda level: last[level])
        out[index], last[level] = level, at
    return out


def horovod_cycles(submitted: list[dict], sizes: dict, cycle_ms: float = 1.0, fusion_bytes: float = 128 * 2**20,
                   spans: list[dict] | None = None, title: str | None = None):
    """Horovod's negotiation and tensor fusion, from when each rank hands each tensor to the
    background thread: `submitted[rank] = {name: ms}`.  At every cycle tick the ranks reduce the
    tensors that *every* rank has submitted by then (matched by name, whatever the order), packed
    into fusion buffers of at most `fusion_bytes` (`sizes[name]` bytes each).  `spans[rank] =
    {label: (start ms, end ms)}` draws what each rank was doing meanwhile (backward, step())."""
    names = list(sizes)
    ready = {name: max(rank[name] for rank in submitted) for name in names}  # the last rank's submission
    ticks = math.ceil(max(ready.values()) / cycle_ms + 1e-9)
    reductions = []  # (tick ms, [names]) per fused all-reduce
    counts = dict.fromkeys(names, 0)
    for tick in range(1, ticks + 1):
        # Horovod's order: the coordinator counts this cycle's requests rank by rank (its own, then
        # rank 1's, ...), each rank's in the order it made them; a tensor is due when its count
        # reaches the world size (Controller::ComputeResponseList and IncrementTensorCount,
        # horovod/common/controller.cc, 0.28.1).
        due = []
        for rank in submitted:
            for name in sorted((n for n in names if tick - 1 < rank[n] / cycle_ms <= tick), key=rank.get):
                counts[name] += 1
                if counts[name] == len(submitted):
                    due.append(name)
        buffer, used = [], 0
        for name in due:
            if buffer and used + sizes[name] > fusion_bytes:
                reductions.append((tick * cycle_ms, buffer))
                buffer, used = [], 0
            buffer.append(name)
            used += sizes[name]
        if buffer:
            reductions.append((tick * cycle_ms, buffer))
    # The axis ends a cycle after the last reduction or submission: a span that runs on (a step()
    # waiting on a busy machine) is cut there and says where it ends.
    last_at = max([at for rank in submitted for at in rank.values()] + [start for rank in spans or []
                                                                         for start, _ in rank.values()])
    right = max(ticks * cycle_ms, last_at) + cycle_ms
    # Two panels on one time axis: above, the times given (measured, or an example's); below, what the
    # model of Horovod's cycle makes of them (its ticks and fused all-reduces), never drawn as measured.
    from matplotlib.figure import Figure

    rows = len(submitted)
    fig = Figure(figsize=(10, 2.4 + (1.0 if spans else 0.6) * rows), layout="constrained")
    ax, model_ax = fig.subplots(2, 1, sharex=True, height_ratios=[rows + 0.6 * bool(spans), 1.2])
    palette = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
    color = {name: palette[i % len(palette)] for i, name in enumerate(names)}
    span_colors = {}
    for rank, rank_spans in enumerate(spans or []):
        for label, (start, end) in rank_spans.items():
            span_colors.setdefault(label, ["#EEDDAA", "#BBDDEE", "#DDEEBB"][len(span_colors) % 3])
            ax.barh(rank, min(end, right) - start, left=start, height=0.5, color=span_colors[label], edgecolor="gray",
                    linewidth=0.5, label=label if rank == 0 else None, zorder=0)
            if end > right:
                ax.text(right, rank + 0.05, f"{label} until {end:.1f} ms \u2192", ha="right", va="center", fontsize=7)
    for rank, times in enumerate(submitted):
        levels = _stagger(list(times.values()), right)
        for (name, at), level in zip(times.items(), levels):
            ax.plot([at], [rank], "o", color=color[name], zorder=2)
            ax.annotate(name, (at, rank), textcoords="offset points", xytext=(0, 7 + 9 * level), ha="center",
                        fontsize=7)
    ax.set(yticks=range(rows), yticklabels=[f"rank {r}" for r in range(rows)], ylim=(-0.6 - 0.3 * bool(spans),
                                                                                      rows - 0.4),
           title=title or "when each rank hands each tensor to Horovod (a dot each)")
    ax.grid(axis="x", color="0.9", linewidth=0.5)  # a ruler, one line a cycle: read the ticks in the panel below
    if spans:
        ax.legend(loc="lower left", fontsize=7, framealpha=0.9)
    ax.invert_yaxis()
    for index, (tick, group) in enumerate(reductions):
        width = 0.8 * cycle_ms / max(1, sum(1 for t, _ in reductions if t == tick))
        left = tick + width * sum(1 for t, _ in reductions[:index] if t == tick)
        # Hatched: a modelled reduction, started at a modelled tick; its width is drawn, not a duration.
        model_ax.barh(0, width, left=left, height=0.5, color=COLORS["comm"], edgecolor="black", linewidth=0.5,
                      hatch="//", label=None if index else "fused all-reduce (its start; width drawn)")
        fits = 0.045 * right * len(group) < width  # room for the names inside the bar
        model_ax.text(left + width / 2, 0 if fits else 0.55, "+".join(group) if fits else
                      f"{len(group)} tensor{'s' * (len(group) > 1)}", ha="center", va="center", fontsize=6,
                      color="white" if fits else "black")
    for tick in range(ticks + 1):
        model_ax.axvline(tick * cycle_ms, color="gray", linewidth=0.8, linestyle=":",
                         label=None if tick else f"the background thread's tick, every {cycle_ms:g} ms")
    model_ax.set(yticks=[0], yticklabels=["all ranks (model)"], ylim=(0.9, -0.6), xlim=(0, right), xlabel="ms",
                 title="model, not measured: at each tick, one fused all-reduce of what every rank has handed over")
    handles, labels = model_ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize=7, frameon=False)
    if right / cycle_ms <= 20:
        from matplotlib.ticker import MultipleLocator

        model_ax.xaxis.set_major_locator(MultipleLocator(cycle_ms))  # both panels: a tick label each cycle
    fig.reductions = reductions  # what the drawing shows, for a caller or a test
    return fig


def accumulation_timeline(events_by_rank: list[list], accumulation_steps: int):
    """Micro steps and optimizer steps under gradient accumulation, from the ranks' own clocks:
    `events_by_rank[rank] = [(kind, start ms, end ms), ...]` with kind "forward", "backward",
    "all-reduce" (inside a backward), "step()" (the call, however little it did) or "optimizer step"
    (the call that applied the update).  Dashed lines close each accumulation window."""
    colors = {"forward": COLORS["forward"], "backward": COLORS["backward"], "all-reduce": COLORS["comm"],
              "step()": "0.45", "optimizer step": COLORS["optimizer"]}  # step(): dark, so that a thin bar shows
    heights = {"all-reduce": 0.3}
    right = max(end for events in events_by_rank for _, _, end in events)
    fig, ax = _figure(10, 1.8 + 0.55 * len(events_by_rank))
    shown = set()
    for rank, events in enumerate(events_by_rank):
        for kind, start, end in events:
            width = max(end - start, 0.004 * right)  # the shortest still shows
            ax.barh(rank, width, left=start, height=heights.get(kind, 0.6), color=colors[kind], edgecolor="black",
                    linewidth=0.4, label=None if kind in shown else kind, zorder=2 if kind == "all-reduce" else 1)
            shown.add(kind)
            if kind == "optimizer step":  # on this rank's own row: the ranks' clocks are not aligned
                ax.plot([end, end], [rank - 0.45, rank + 0.45], color="gray", linestyle="--", linewidth=0.8)
    ax.set(yticks=range(len(events_by_rank)), yticklabels=[f"rank {r}" for r in range(len(events_by_rank))],
           xlabel="ms from the first micro step (each rank's own clock)", ylim=(len(events_by_rank) - 0.4, -0.6),
           title=f"gradient accumulation, {accumulation_steps} micro steps a window:\none all-reduce and one "
                 "optimizer step per window (dashed: a window ends, on each rank's clock)")
    order = [kind for kind in colors if kind in shown]
    handles, labels = ax.get_legend_handles_labels()
    fig.legend([handles[labels.index(kind)] for kind in order], order, loc="outside lower center", ncols=len(order),
               fontsize=7, frameon=False)
    fig.windows = sum(kind == "optimizer step" for kind, _, _ in events_by_rank[0])
    return fig


VERDICT_COLORS = {"local": "#55A868", "split": "#DD8452", "far": "#C44E52"}  # scaledl.hpc.binding's verdicts


def _verdict_legend(fig) -> None:
    from matplotlib.patches import Patch

    fig.legend(handles=[Patch(color=VERDICT_COLORS["local"], label="local: all its cores on its GPU's NUMA node"),
                        Patch(color=VERDICT_COLORS["split"], label="split: some of them"),
                        Patch(color=VERDICT_COLORS["far"], label="far: none")],
               loc="outside lower center", ncol=3, fontsize=8, frameon=False)


def node_binding(panels: dict, numa_cpus: dict, gpu_nodes: dict):
    """Where each local rank runs on one node: its cores' NUMA node and the GPU it drives.

    `panels`: title -> the ranks' `scaledl.hpc.binding.Placement`s (one panel each, e.g. two GPU
    mappings of the same launch); `numa_cpus`: NUMA node -> its CPUs; `gpu_nodes`: each GPU's PCI
    address -> its NUMA node, in PCI order (GPU k is the k-th).  A rank sits on its cores' NUMA
    node (a bar under a rank spans the NUMA nodes of a split one); its arrow goes to its GPU, green
    when the GPU is on that NUMA node (local), orange when only some of its cores are (split), red
    when none are (far): that rank's data loader, pinned memory and copies to the GPU cross the chip."""
    from matplotlib.patches import FancyArrowPatch

    from scaledl.hpc.binding import format_cpulist

    from matplotlib.figure import Figure

    nodes, gpus = sorted(numa_cpus), list(gpu_nodes)
    fig = Figure(figsize=(2.6 * len(nodes), 3.0 * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    counts = {}
    for ax, (title, placements) in zip(axes, panels.items()):
        column = {node: i for i, node in enumerate(nodes)}
        for node, i in column.items():
            _box(ax, i + 0.05, 1.55, 0.9, 0.9, f"NUMA node {node}\nCPUs {format_cpulist(numa_cpus[node])}", "#E8EEF7")
        for k, address in enumerate(gpus):
            node = gpu_nodes[address]
            _box(ax, column[node] + 0.2, 0.05, 0.6, 0.55, f"GPU {k}\n{address}\n", "#F3E3D3", fontsize=7)
        local = 0
        for p in placements:
            if p.gpu is None or not p.cpu_nodes:
                continue
            local += p.verdict == "local"
            color = VERDICT_COLORS.get(p.verdict, "#8C8C8C")
            # A rank spans every NUMA node its cores are on (a split rank: two or more).
            spanned = [column[node] for node in p.cpu_nodes]
            left, right = min(spanned) + 0.1, max(spanned) + 0.9
            x0 = (left + right) / 2
            ax.text(x0, 1.7, f"rank {p.local_rank}: CPUs {format_cpulist(p.cpus)}", ha="center", va="center",
                    fontsize=8, fontweight="bold", color="white", bbox={"boxstyle": "round", "facecolor": color})
            if len(spanned) > 1:  # a bar under the label across the NUMA nodes the rank spans
                ax.plot([left, right], [1.6, 1.6], color=color, linewidth=4, solid_capstyle="round")
            x1 = column[gpu_nodes[p.gpu]] + 0.5
            if abs(x1 - x0) < 0.3:
                ax.add_patch(FancyArrowPatch((x0, 1.57), (x1, 0.62), arrowstyle="-|>", mutation_scale=12,
                                             linewidth=1.6, color=color))
            else:
                # Across the chip: down, along a lane of its own, down into the GPU, as a circuit
                # diagram routes wires, so that each arrow can be followed from its rank to its GPU
                # (straight arrows of mirrored ranks would all cross at one point).
                lane = 1.42 - 0.17 * (p.local_rank % 4)
                start, end = x0 - 0.12, x1 + 0.12
                ax.plot([start, start, end], [1.57, lane, lane], color=color, linewidth=1.6)
                ax.add_patch(FancyArrowPatch((end, lane), (end, 0.62), arrowstyle="-|>", mutation_scale=12,
                                             linewidth=1.6, color=color, shrinkA=0))
            ax.text(x1, 0.12, f"rank {p.local_rank}'s", ha="center", va="center", fontsize=7, color=color,
                    fontweight="bold")
        counts[title] = local
        ax.set_title(f"{title}: {local} of {len(placements)} ranks local", fontsize=10)
        ax.set(xlim=(0, len(nodes)), ylim=(0, 2.5))
        ax.axis("off")
    _verdict_legend(fig)
    fig.local_counts = counts  # what the drawing shows, for a caller or a test
    return fig


def cpu_map(panels: dict, numa_cpus: dict, gpu_nodes: dict):
    """Each local rank's CPUs as a bar over the node's cores, shaded by NUMA node: for nodes with
    many ranks per NUMA node (Aurora: 6 a socket), where `node_binding`'s arrows would pile up.

    `panels`: title -> the ranks' `scaledl.hpc.binding.Placement`s; `numa_cpus`: NUMA node -> its CPUs;
    `gpu_nodes`: each GPU's PCI address -> its NUMA node, in PCI order (GPU k is the k-th).  A bar is
    green when all its CPUs are on its GPU's NUMA node, orange when some are (split), red when none
    are (far); the text beside it names the GPU and that GPU's NUMA node."""
    from matplotlib.figure import Figure

    from scaledl.hpc.binding import cpu_runs, format_cpulist

    shades = ["#E8EEF7", "#F3E3D3", "#E3F0E3", "#EFE3F3"]
    gpus = list(gpu_nodes)
    ranks = max(len(placements) for placements in panels.values())
    shown = [cpu for placements in panels.values() for p in placements for cpu in p.cpus]
    # The cores drawn: from 0 to the end of the run of CPUs (of one NUMA node) that holds the
    # highest CPU a rank has, so that the second hardware threads of a node stay off the axis.
    top = max(shown) if shown else 0
    end = next((last + 1 for cpus in numa_cpus.values() for first, last in cpu_runs(cpus)
                if first <= top <= last), top + 1)
    fig = Figure(figsize=(9.5, 0.32 * ranks * len(panels) + 1.1 * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    fig.local_counts = {}
    for ax, (title, placements) in zip(axes, panels.items()):
        for node, cpus in sorted(numa_cpus.items()):
            inside = sorted(cpu for cpu in cpus if cpu < end)
            if not inside:
                continue
            ax.axvspan(inside[0], inside[-1] + 1, color=shades[node % len(shades)], zorder=0)
            ax.text((inside[0] + inside[-1] + 1) / 2, -0.9, f"NUMA node {node}: CPUs {format_cpulist(inside)}",
                    ha="center", va="center", fontsize=8)
        local = 0
        for p in placements:
            if not p.cpus:
                continue
            local += p.verdict == "local"
            y = p.local_rank
            for first, last in cpu_runs(p.cpus):
                ax.barh(y, last + 1 - first, left=first, height=0.7, color=VERDICT_COLORS.get(p.verdict, "#8C8C8C"),
                        edgecolor="black", linewidth=0.5)
            gpu = f"GPU {gpus.index(p.gpu)} (NUMA node {gpu_nodes[p.gpu]})" if p.gpu in gpu_nodes else "no GPU"
            ax.text(end + 1, y, f"rank {p.local_rank}: CPUs {format_cpulist(p.cpus)} -> {gpu}", va="center",
                    fontsize=7)
        fig.local_counts[title] = local
        ax.set_title(f"{title}: {local} of {len(placements)} ranks local", fontsize=10)
        ax.set(xlim=(0, end), ylim=(ranks - 0.4, -1.4), xlabel="CPU (core)", ylabel="local rank")
        ax.set_yticks(range(ranks))
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    _verdict_legend(fig)
    return fig


def data_parallel_step(world_size: int = 4):
    """One data-parallel step, as Horovod (and DDP) run it on `world_size` ranks: each rank takes its
    own shard of the global batch, runs forward and backward on that micro batch, and gets its own
    gradients; one all-reduce averages them, so every rank holds the same gradients, takes the same
    optimizer step and ends with the same weights.  Per-rank colours mark what differs between
    ranks; one grey marks what is identical on all of them."""
    from matplotlib.patches import FancyArrowPatch

    if world_size < 2:
        raise ValueError(f"data parallelism needs at least 2 ranks, got world_size={world_size}")
    palette = ["#4C72B0", "#DD8452", "#55A868", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974"]
    own = [palette[r % len(palette)] + "66" for r in range(world_size)]  # light: the text stays readable
    same = "#D9D9D9"
    pitch, width = 1.3, 1.05  # column pitch and box width, in data units
    right = (world_size - 1) * pitch + width
    fig, ax = _figure(2.6 + 1.35 * world_size, 7.0)
    # Each row: (bottom, height), top to bottom.
    rows = {"batch": (8.05, 0.45), "data": (7.0, 0.62), "compute": (5.9, 0.62), "grads": (4.8, 0.62),
            "allreduce": (3.45, 0.85), "averaged": (2.35, 0.62), "update": (1.25, 0.62), "weights": (0.15, 0.62)}
    for key, text in (("batch", "the global batch"), ("data", "each rank\nits own shard"),
                      ("compute", "forward + backward,\neach rank alone"), ("grads", "its own gradients\n(different)"),
                      ("allreduce", "one all-reduce\n(communication)"), ("averaged", "averaged gradients\n(identical)"),
                      ("update", "the same\noptimizer step"), ("weights", "identical weights")):
        bottom, height = rows[key]
        ax.text(-0.25, bottom + height / 2, text, ha="right", va="center", fontsize=8, color="0.25")
    _box(ax, 0, *rows["batch"][:1], right, rows["batch"][1],
         f"global_batch_size = {world_size} x micro_batch_size", "#EEEEEE")
    terms = " + ".join(f"g_{r}" for r in range(world_size)) if world_size <= 4 else \
        "g_0 + \\dots + g_{%d}" % (world_size - 1)
    _box(ax, 0, rows["allreduce"][0], right, rows["allreduce"][1],
         f"all-reduce, average:\n$\\bar g = ({terms})\\,/\\,{world_size}$\n(lesson 3's ring; Horovod fuses tensors)",
         COLORS["comm"] + "55")
    for r in range(world_size):
        x, centre = r * pitch, r * pitch + width / 2
        for key, text, color, size in (("data", f"rank {r}\nmicro batch {r}", own[r], 8),
                                       ("compute", "forward,\nbackward", own[r], 8),
                                       ("grads", f"$g_{{{r}}}$", own[r], 10), ("averaged", r"$\bar g$", same, 10),
                                       ("update", r"$w \leftarrow \mathrm{step}(w, \bar g)$", same, 8),
                                       ("weights", "$w$", same, 10)):
            _box(ax, x, rows[key][0], width, rows[key][1], text, color, fontsize=size)
        order = list(rows)
        for top, bottom in zip(order, order[1:]):
            ax.add_patch(FancyArrowPatch((centre, rows[top][0] - 0.02), (centre, sum(rows[bottom]) + 0.04),
                                         arrowstyle="-|>", mutation_scale=10, linewidth=0.9, color="0.3"))
    ax.set(xlim=(-2.1, right + 0.1), ylim=(rows["weights"][0] - 0.12, sum(rows["batch"]) + 0.1))
    ax.set_title(f"one data-parallel step on {world_size} rank{'s' * (world_size > 1)}:\n"
                 "different data and gradients in, identical weights out", fontsize=10)
    ax.axis("off")
    return fig


def prediction_figure(labels: list[str], predicted_s: list[float], measured_s_by_rank: list[list[float]],
                      title: str):
    """Predicted (light bar) against measured (dark bar: the shortest over the ranks; a dot per rank)
    for each quantity in `labels`, in ms.  `measured_s_by_rank[rank][i]` is rank's value of labels[i].
    The shortest is the rank that waited least: the longer ones also waited for a slower rank.  The
    axis ends at 1.5 times the longest bar; a rank beyond it is a triangle at the edge, with its value."""
    from matplotlib.figure import Figure  # no pyplot: leaves a notebook's backend alone

    fig = Figure(figsize=(7, 1.2 + 0.7 * len(labels)), layout="constrained")
    ax = fig.subplots()
    values = [[rank[i] * 1e3 for rank in measured_s_by_rank if i < len(rank)] for i in range(len(labels))]
    right = 1.5 * max([t * 1e3 for t in predicted_s] + [min(v) for v in values if v] + [1e-3])
    for i, label in enumerate(labels):
        ax.barh(i - 0.18, predicted_s[i] * 1e3, height=0.34, color="#E8B4B5", edgecolor="black", linewidth=0.5,
                label="predicted" if i == 0 else None)
        if not values[i]:
            continue
        ax.barh(i + 0.18, min(values[i]), height=0.34, color="#C44E52", edgecolor="black", linewidth=0.5,
                label="measured, shortest over the ranks" if i == 0 else None)
        inside = [v for v in values[i] if v <= right]
        ax.plot(inside, [i + 0.18] * len(inside), "o", color="black", ms=4,
                label="measured, each rank" if i == 0 else None)
        for v in (v for v in values[i] if v > right):  # a rank that waited long: at the edge, with its value
            ax.plot(right, i + 0.18, ">", color="black", ms=5)
            ax.annotate(f"{v:.3g} ms", (right, i + 0.18), xytext=(-4, 5), textcoords="offset points", ha="right",
                        fontsize=7)
    ax.set(yticks=range(len(labels)), yticklabels=labels, xlabel="ms", title=title, ylim=(len(labels) - 0.5, -0.5),
           xlim=(0, right * 1.02))
    handles, names = ax.get_legend_handles_labels()
    order = [names.index(name) for name in ("predicted", "measured, shortest over the ranks", "measured, each rank")
             if name in names]
    fig.legend([handles[i] for i in order], [names[i] for i in order], loc="outside lower center", ncols=3,
               fontsize=7, frameon=False)
    return fig


def memory_stack(bars: dict, limit_bytes: float | None = None, limit_label: str = "", measured: dict | None = None,
                 title: str = ""):
    """Stacked bars of a training step's memory by kind, one bar a case: {label: {"params": bytes,
    "grads": bytes, "optimizer": bytes, "activations": bytes}}; `limit_bytes` draws a device's memory,
    `measured` ({label: bytes}) marks the bar's state plus what a run counted of its activations.  Binary units,
    MiB and GiB, as the lessons print memory."""
    fig, ax = _figure(max(5.5, 1.6 * len(bars) + 2.5), 3.6)
    largest = max([sum(parts.values()) for parts in bars.values()] + [limit_bytes or 0])
    scale, unit = (2**30, "GiB") if largest > 2**30 else (2**20, "MiB") if largest > 2**20 else (2**10, "KiB")
    labels, bottom = list(bars), [0.0] * len(bars)
    for key in ("params", "grads", "optimizer", "activations"):
        values = [bars[label].get(key, 0) / scale for label in labels]
        ax.bar(labels, values, bottom=bottom, color=COLORS[key], label=key)
        if key == "activations" and measured:
            for x, label in enumerate(labels):
                if label in measured:
                    ax.plot(x, bottom[x] + measured[label] / scale, "D", color="black", markersize=6,
                            label="state + activations counted live" if x == 0 else None)
        bottom = [b + v for b, v in zip(bottom, values)]
    for x, total in enumerate(bottom):  # above the bar and its diamond
        ax.annotate(f"{total:.3g}", (x, total), xytext=(0, 7), textcoords="offset points", ha="center", fontsize=8)
    if limit_bytes:
        ax.axhline(limit_bytes / scale, color="black", linestyle="--", linewidth=1)
        ax.text(len(labels) - 0.5, limit_bytes / scale, limit_label, ha="right", va="bottom", fontsize=8)
    ax.set(ylabel=f"{unit} per rank", title=title, ylim=(0, 1.12 * largest / scale))  # room for the labels
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8, frameon=False)
    return fig


def layout_parts(rows: list[dict], title: str = ""):
    """The predicted step of each layout (`scaledl.perf.choose.evaluate`'s rows) as a stacked bar of its parts:
    compute, the pipeline's bubble, tensor parallelism's all-reduces, the pipeline's sends and data parallelism's
    exposed communication, with each layout's memory per rank at the bar's end."""
    parts = []
    for row in rows:
        stretched = row["step_s"] - row["tp_s"] - row["pp_s"] - row["dp_s"]  # compute / (1 - bubble)
        parts.append({"compute": stretched * (1 - row["bubble"]), "bubble": stretched * row["bubble"],
                      "tp all-reduces": row["tp_s"], "pp sends": row["pp_s"], "dp communication": row["dp_s"]})
    colors = {"compute": "#9ecae1", "bubble": "#d9d9d9", "tp all-reduces": "#fdae6b", "pp sends": "#a1d99b",
              "dp communication": "#bcbddc"}
    height = 1.9 + 0.45 * len(rows)  # inches: a bar a row, and room for the legend below the axis
    fig, ax = _figure(9, height)
    labels = [f"dp {r['dp']} tp {r['tp']} pp {r['pp']} ZeRO-{r['zero']} {r['recompute']} b{r['micro_batch_size']}"
              for r in rows]
    for y, part in enumerate(parts):
        left = 0.0
        for name, seconds in part.items():
            ax.barh(y, seconds, left=left, color=colors[name], edgecolor="black", linewidth=0.4,
                    label=name if y == 0 else None)
            left += seconds
        ax.text(left, y, f"  {left:.2f} s, {rows[y]['memory_gib']:.1f} GiB", va="center", fontsize=8)
    ax.set(yticks=range(len(rows)), yticklabels=labels, xlabel="predicted step (s)",
           title=title or "each layout's step, part by part (fastest at the top)")
    ax.invert_yaxis()
    ax.set_xlim(0, 1.25 * max(r["step_s"] for r in rows))
    handles, names = ax.get_legend_handles_labels()
    fig.legend(handles, names, fontsize=7, loc="outside lower center", ncol=5)  # constrained layout makes room
    return fig


def ring_hiding(thresholds: dict, ranks: int, tokens=None):
    """When a ring attention step hides its send (lesson 13): for each link, `thresholds[name]` the tokens per
    rank n = F e / (2B) at which a step's compute equals its send; against the tokens per rank n, the ratio
    compute / send = n / threshold.  Above 1 the next block arrives while this one is in use; below it, the
    ring waits on its link.  Each link's crossing is marked at its threshold; the top axis gives the sequence
    length s = ranks x n on a ring of `ranks`."""
    tokens = list(tokens or [2 ** k for k in range(8, 19)])  # 256 to 262,144 tokens a rank
    fig, ax = _figure(7, 3.6)
    ax.axhspan(1, 1e4, color="#e5f5e0", zorder=0)
    ax.axhline(1, color="black", linewidth=0.8)
    ratios = []
    for (name, threshold), color in zip(thresholds.items(), ["#4C72B0", "#DD8452", "#C44E52", "#55A868"]):
        ratio = [n / threshold for n in tokens]
        ratios += ratio
        ax.plot(tokens, ratio, marker="o", markersize=3, color=color,
                label=f"{name}: hides from {threshold:,.0f} tokens a rank")
        ax.axvline(threshold, color=color, linestyle=":", linewidth=1)
    ax.set(xscale="log", yscale="log", xlabel="tokens per rank n",
           ylabel="ring step: compute / send", ylim=(min(ratios) / 1.5, max(ratios) * 1.5),
           title="ring attention hides its sends above the line")
    top = ax.secondary_xaxis("top", functions=(lambda n: n * ranks, lambda s: s / ranks))
    top.set_xlabel(f"sequence length s on a ring of {ranks} ranks (s = {ranks} n)", fontsize=8)
    ax.text(tokens[0], 1.15, "send hidden behind compute", fontsize=8, va="bottom")
    ax.text(tokens[0], 0.87, "ring waits on its link", fontsize=8, va="top")
    ax.legend(fontsize=8, loc="lower right")
    return fig
