"""Lesson 14's checks: a layout for a model on Polaris, and the fastest layout measured here."""
from __future__ import annotations

from scaledl.workshop.checks.common import _unfinished, _verdict

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
        return _verdict(True, f"{_KINDS[best]} ran the fastest step here; the table above shows where the chooser's "
                              "parts put the other two")
    mine = by_kind[fastest_here]
    why = {"dp": f"one all-reduce of the gradients a step, {mine['dp_ms']:.3g} ms predicted",
           "tp": f"4 all-reduces a block and micro batch, {mine['tp_ms']:.3g} ms predicted, none hidden",
           "pp": f"a bubble of {mine['bubble']:.0%} and {mine['pp_ms']:.3g} ms of sends predicted"}[fastest_here]
    return _verdict(False, f"{_KINDS[fastest_here]} measured {mine['measured_ms']:.3g} ms a step, {_KINDS[best]} "
                           f"{fastest['measured_ms']:.3g} ms: {fastest_here} costs {why}, against the "
                           f"{fastest['predicted_ms'] - fastest['compute_ms']:.3g} ms {best} adds to its compute")
