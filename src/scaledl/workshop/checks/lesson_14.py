"""Lesson 14's checks: a layout's memory per rank, a layout for a model on Polaris, and the fastest layout
measured here."""
from __future__ import annotations

from scaledl.workshop.checks.common import _attempt, _FAILED, _unfinished, _verdict

LAYOUT_KEYS = ("dp", "tp", "pp", "zero", "recompute", "micro_batch_size")


def check_memory_per_rank(memory_gib, preset: str = "gpt3-2.7b", system: str = "polaris", nodes: int = 4,
                          global_batch_size: int = 512, rel: float = 0.01) -> bool:
    """`memory_gib(dp, tp, pp, zero, recompute, micro_batch_size)`: the GiB a rank needs for the language model at
    `preset`'s size on `nodes` of `system` (bf16 with Adam), within `rel` of scaledl.perf.choose's, on every layout
    the machine and DeepSpeed allow; a wrong one is told which part is off on the first layout it misses."""
    import math

    from scaledl import models, zero_memory
    from scaledl.perf import choose, predict

    if memory_gib is None:
        return _unfinished("memory_gib")
    if not callable(memory_gib):
        return _verdict(False, "`memory_gib` must be a function of (dp, tp, pp, zero, recompute, micro_batch_size)")
    sizes, machine, device = models.GPT_PRESETS[preset], predict.SYSTEMS[system], choose.DEVICES[system]
    rows = choose.layouts(sizes, machine, device, nodes, global_batch_size)
    # Every pipeline depth, ZeRO stage and tp, at a few micro batch sizes: the cases a formula can get wrong.
    rows = [row for row in rows if row["micro_batch_size"] in (1, 2, 8, 64)]
    for row in rows:
        args = tuple(row[key] for key in LAYOUT_KEYS)
        got = _attempt("memory_gib", f"memory_gib{args}", lambda: float(memory_gib(*args)))
        if got is _FAILED:
            return False
        if math.isclose(got, row["memory_gib"], rel_tol=rel):
            continue
        dp, tp, pp, zero, recompute, micro = args
        held = math.ceil(choose.params_per_rank(sizes["width"], sizes["depth"], sizes["seq_len"], tp, pp))
        weight, grad, state = zero_memory.bytes_per_param("bf16", zero, choose.ADAM_STATE_BYTES)
        state_gib = zero_memory.predict(held, dp, zero, weight, grad, state)["total"] / 2**30
        activation_gib = row["memory_gib"] - state_gib
        in_flight = min(row["micro_batches"], pp) if pp > 1 else 1
        return _verdict(False, f"memory_gib(dp={dp}, tp={tp}, pp={pp}, zero={zero}, recompute={recompute!r}, "
                               f"micro_batch_size={micro}) is {got:.2f} GiB, expected {row['memory_gib']:.2f}: the "
                               f"state of the {held:,} parameters the rank holds is {state_gib:.2f} GiB at ZeRO-{zero} "
                               f"over {dp} ranks, and the activations {activation_gib:.2f} GiB ({in_flight} micro "
                               "batch(es) in flight on the first stage)")
    low, high = min(row["memory_gib"] for row in rows), max(row["memory_gib"] for row in rows)
    return _verdict(True, f"your memory matches the chooser's on all {len(rows)} layouts tried, from {low:.1f} to "
                          f"{high:.0f} GiB a rank")


def check_layout(layout, step_s, preset: str = "gpt3-2.7b", system: str = "polaris", nodes: int = 4,
                 global_batch_size: int = 512, within: float = 0.05, step_within: float = 0.02) -> bool:
    """The capstone: `layout`, a dict of LAYOUT_KEYS for the language model at `preset`'s size on `nodes`
    of `system` at `global_batch_size` sequences a step, must be one the machine and DeepSpeed allow,
    fit in a device (scaledl.perf.choose's memory per rank) and be predicted within `within` of the
    fastest layout that fits.  `step_s`, the learner's own prediction of the layout's step from its
    parts, must be within `step_within` of the chooser's before the verdict on speed says anything: so
    each layout tried costs its arithmetic, and the check is not a search."""
    from scaledl import models
    from scaledl.perf import choose, predict

    if layout is None:
        return _unfinished("layout")
    if step_s is None:
        return _unfinished("layout_step_s")
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
    if not isinstance(step_s, (int, float)) or not abs(step_s - row["step_s"]) <= step_within * row["step_s"]:
        return _verdict(False, f"your layout fits ({row['memory_gib']:.1f} GiB a rank), but `layout_step_s` is not "
                               f"within {step_within:.0%} of its predicted step: add up its parts as the table above "
                               "does (compute at the MFU, the bubble, tp's all-reduces, pp's sends, dp's exposed "
                               "communication), each for this layout")
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
    from scaledl.perf import predict

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
           "tp": f"{predict.RUNG_TP_ALLREDUCES_PER_BLOCK} all-reduces a block and micro batch, {mine['tp_ms']:.3g} ms "
                 "predicted, none hidden",
           "pp": f"a bubble of {mine['bubble']:.0%} and {mine['pp_ms']:.3g} ms of sends predicted"}[fastest_here]
    return _verdict(False, f"{_KINDS[fastest_here]} measured {mine['measured_ms']:.3g} ms a step, {_KINDS[best]} "
                           f"{fastest['measured_ms']:.3g} ms: {fastest_here} costs {why}, against the "
                           f"{fastest['predicted_ms'] - fastest['compute_ms']:.3g} ms {best} adds to its compute")
