"""The per-layer sequence of a sharded step (FSDP2, ZeRO-3), drawn for lesson 9.

Each layer's parameters are all-gathered before its forward; with `reshard_after_forward=True`
(FSDP2's default for every layer but the root) they are freed after it and all-gathered again
for its backward; after its backward the gathered parameters are freed and the gradients
reduce-scattered (torch 2.13, `FSDPParamGroup.post_backward`: `reshard()`, then
`foreach_reduce`). With `reshard_after_forward=False` a layer keeps them from its forward to
its backward: one all-gather per layer per step fewer, and every layer whole at the end of
forward. The events are drawn one after another; FSDP2 overlaps a layer's collectives with
its neighbours' compute, which the schedule leaves out: it all-gathers the next layer while the
current one computes (implicitly in forward, on its own streams; in backward through
`FSDPParamGroup._backward_prefetch`), so on a GPU about one layer more is whole than drawn.
"""
from __future__ import annotations

from dataclasses import dataclass

LANES = ("all-gather", "compute", "reduce-scatter")
COLORS = {"all-gather": "#4C72B0", "compute": "#8C8C8C", "reduce-scatter": "#C44E52"}


@dataclass(frozen=True)
class Event:
    lane: str  # one of LANES
    layer: int  # 1-based
    label: str  # what the box says
    whole_after: int  # layers held whole (gathered) once the event is done


def events(layers: int, reshard_after_forward: bool) -> list[Event]:
    """One step's events in order: forward over layers 1..L, then backward L..1."""
    if layers < 1:
        raise ValueError(f"layers must be at least 1, got {layers}")
    whole: set[int] = set()
    out = []

    def add(lane: str, layer: int, label: str) -> None:
        out.append(Event(lane, layer, label, len(whole)))

    for layer in range(1, layers + 1):
        whole.add(layer)
        add("all-gather", layer, f"AG {layer}")
        if reshard_after_forward:
            whole.discard(layer)  # freed right after its forward
        add("compute", layer, f"F {layer}")
    for layer in range(layers, 0, -1):
        if layer not in whole:
            whole.add(layer)
            add("all-gather", layer, f"AG {layer}")
        whole.discard(layer)  # post_backward: reshard first ...
        add("compute", layer, f"B {layer}")
        add("reduce-scatter", layer, f"RS {layer}")  # ... then reduce-scatter the gradients
    return out


def figure(layers: int = 3):
    """Both settings, one above the other: the lanes and the number of layers held whole."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 5.2), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    longest = len(events(layers, True))
    for ax, reshard in zip(axes, (True, False)):
        steps = events(layers, reshard)
        for x, event in enumerate(steps):
            y = len(LANES) - LANES.index(event.lane)
            ax.add_patch(_rect(x + 0.05, y - 0.35, 0.9, 0.7, COLORS[event.lane]))
            ax.text(x + 0.5, y, event.label, ha="center", va="center", fontsize=8, color="white")
        held = [0] + [event.whole_after for event in steps]
        ax.step(range(len(held)), [h * 0.15 for h in held], where="post", color="black", linewidth=1.5)
        peak = max(held)
        prefetch = f"; about {peak + 1} with FSDP2's prefetch" if peak < layers else ""
        ax.text(-0.2, peak * 0.15 + 0.03, f"layers held whole, drawn in sequence (peak {peak}{prefetch})",
                fontsize=7.5, va="bottom")
        gathers = sum(event.lane == "all-gather" for event in steps)
        ax.set_title(f"reshard_after_forward={reshard}" + (" (FSDP2's default, but for the root)" if reshard else "")
                     + f": {gathers} all-gathers, {layers} reduce-scatters per step", fontsize=9)
        ax.set_yticks([len(LANES) - i for i in range(len(LANES))], LANES, fontsize=8)
        ax.set_ylim(-0.2, len(LANES) + 0.6)
        ax.set_xlim(-0.3, longest + 0.3)
        ax.axvline(2 * layers, color="#444444", linestyle=":", linewidth=1)
        ax.text(2 * layers, len(LANES) + 0.45, "forward | backward", ha="center", fontsize=7.5)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[-1].set_xlabel("events of one step, in order (drawn one after another; FSDP2 overlaps them with compute)",
                        fontsize=8)
    axes[-1].set_xticks([])
    return fig


def _rect(x, y, w, h, color):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), w, h, facecolor=color, edgecolor="black", linewidth=0.6)
