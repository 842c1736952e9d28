"""Lesson 14's checks: a layout's memory per rank, a layout for a model on Polaris, and the messages and the
measured order of three layouts here."""
from __future__ import annotations

from scaledl.workshop.checks.common import _attempt, _FAILED, _unfinished, _verdict

LAYOUT_KEYS = ("dp", "tp", "pp", "zero", "recompute", "micro_batch_size")


def _two(seconds: float) -> str:
    """A predicted time to two significant figures (9.3, 0.94, 17, 540), never an exponent: the model's inputs are
    nominal, so only the ranking its digits give is meant."""
    text = f"{seconds:#.2g}".rstrip(".")
    return f"{float(text):.0f}" if "e" in text else text


def check_memory_per_rank(memory_gib, preset: str = "gpt3-2.7b", system: str = "polaris", nodes: int = 4,
                          global_batch_size: int = 512, rel: float = 0.01) -> bool:
    """`memory_gib(dp, tp, pp, zero, recompute, micro_batch_size)`: the GiB a rank needs for the language model at
    `preset`'s size on `nodes` of `system` (bf16 with Adam), within `rel` of scaledl.perf.choose's, on every layout
    the machine and DeepSpeed allow; a wrong one is told which part is off on the first layout it misses."""
    import math

    from scaledl import models
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
        state_gib = _state_gib(sizes, dp, tp, pp, zero)
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


PARTS = {"compute": "1. compute", "bubble": "2. the bubble", "tp": "3. tp's all-reduces", "pp": "4. pp's sends",
         "dp": "5. dp's communication"}


def step_parts_of(row: dict) -> dict:
    """A row of scaledl.perf.choose.evaluate as its five parts, in seconds, one for each of Step 3's five rules: 1
    the compute at the MFU, 2 what the bubble stretches it by, 3 tp's all-reduces, 4 pp's sends and 5 dp's exposed
    communication (they add up to row["step_s"])."""
    stretched = row["step_s"] - row["tp_s"] - row["pp_s"] - row["dp_s"]  # compute / (1 - bubble)
    return {"compute": stretched * (1 - row["bubble"]), "bubble": stretched * row["bubble"], "tp": row["tp_s"],
            "pp": row["pp_s"], "dp": row["dp_s"]}


# The worked example: the lesson takes it through Step 3's five rules just before Exercise 2.
EXAMPLE = {"dp": 4, "tp": 2, "pp": 2, "zero": 1, "recompute": "none", "micro_batch_size": 1}
# A second layout whose parts the lesson never prints, so that part 1 cannot be copied from the worked example:
# rule 4's sends on Slingshot (tp x pp = 8 spans two nodes), and rule 5's ring sharing the node's link 4 ways in
# its ZeRO-0 case with a pipeline: the all-reduces after the last backward, none of them hidden.
SECOND = {"dp": 2, "tp": 4, "pp": 2, "zero": 0, "recompute": "none", "micro_batch_size": 1}


def _parts_wrong(step_parts, layout: dict, want: dict, part_within: float, which: str):
    """None when `step_parts(**layout)` matches `want` part by part, else the one-line FAIL text (False after
    a FAIL already printed by `_attempt`).  A wrong part is named, never its value."""
    import math

    call = ", ".join(f"{key}={layout[key]!r}" for key in LAYOUT_KEYS)
    found = _attempt("step_parts", f"step_parts({call})", lambda: step_parts(**layout))
    if found is _FAILED:
        return False
    if not isinstance(found, dict) or set(found) != set(PARTS):
        return f"`step_parts` must return a dict with the keys {', '.join(PARTS)}, each in seconds"
    for key, name in PARTS.items():
        value = found[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"`step_parts(...)[\"{key}\"]` is {value!r} for {which}: give seconds, a number"
        if not math.isclose(value, want[key], rel_tol=part_within, abs_tol=1e-3):
            return (f"for {which}, the part \"{key}\" is not within {part_within:.0%} of the chooser's: work out "
                    f"rule {name} of Step 3 again for this layout")
    return None


def _parts_graded(step_parts, preset: str, system: str, nodes: int, global_batch_size: int, part_within: float):
    """(the chooser's `evaluate` of a layout, None when `step_parts` matches it part by part on the graded layouts,
    else the verdict that says why not): the start both checks of Exercise 2 share."""
    from scaledl import models
    from scaledl.perf import choose, predict

    sizes, machine, device = models.GPT_PRESETS[preset], predict.SYSTEMS[system], choose.DEVICES[system]

    def chooser(lay: dict) -> dict:
        return choose.evaluate(sizes, machine, device, nodes, global_batch_size, *(lay[key] for key in LAYOUT_KEYS))

    if step_parts is None:
        return chooser, _unfinished("step_parts")
    if not callable(step_parts):
        return chooser, _verdict(False, "`step_parts` must be a function of (dp, tp, pp, zero, recompute, "
                                        "micro_batch_size)")
    for graded, which in ((EXAMPLE, "the worked example"),
                          (SECOND, "the second layout (dp 2, tp 4, pp 2, ZeRO-0, micro batch 1)")):
        wrong = _parts_wrong(step_parts, graded, step_parts_of(chooser(graded)), part_within, which)
        if wrong is not None:
            return chooser, (wrong if wrong is False else _verdict(False, wrong))
    return chooser, None


def check_step_parts(step_parts, preset: str = "gpt3-2.7b", system: str = "polaris", nodes: int = 4,
                     global_batch_size: int = 512, part_within: float = 0.02) -> bool:
    """Exercise 2, part 1 alone: `step_parts(dp, tp, pp, zero, recompute, micro_batch_size)` must match the
    chooser part by part (each within `part_within`, or a millisecond where it is zero) on the worked example
    (EXAMPLE) and on SECOND, whose parts the lesson does not print.  A FAIL names the layout and the part, never
    its value; the PASS gives the worked example's step, which the lesson works out rule by rule before Exercise 2
    and whose parts it prints again after this check."""
    chooser, wrong = _parts_graded(step_parts, preset, system, nodes, global_batch_size, part_within)
    if wrong is not None:
        return wrong
    return _verdict(True, f"every part within {part_within:.0%} of the chooser's on the worked example (a step of "
                          f"{_two(chooser(EXAMPLE)['step_s'])} s) and on the second layout (dp 2, tp 4, pp 2, ZeRO-0, "
                          "micro batch 1)")


def _fastest(rows: list[dict], within: float) -> tuple[dict, list[dict]]:
    """The fastest row that fits, and every fitting row within `within` of it: the set the model cannot tell
    apart (it leaves out effects of a few percent, so a measurement decides between them)."""
    fitting = [row for row in rows if row["fits"]]
    best = min(fitting, key=lambda row: row["step_s"])
    return best, [row for row in fitting if row["step_s"] <= (1 + within) * best["step_s"]]


def _slower_because(row: dict, best: dict, fits_without_recompute: bool) -> str:
    """The symptom of a fitting layout slower than the set the model cannot tell apart: the part of its step that
    exceeds the fastest's the most, in the lesson's words, without naming the fastest layout."""
    mine, fastest = step_parts_of(row), step_parts_of(best)
    excess = {key: mine[key] - fastest[key] for key in PARTS}
    part = max(excess, key=excess.get)
    extra = f"{_two(excess[part])} s more than the fastest's"
    if part == "compute":
        return (f"recomputing every block adds a third to the compute, {extra}"
                + (", and this layout fits without recomputation" if fits_without_recompute else ""))
    if part == "bubble":
        return (f"its pipeline's bubble is {extra}: the bubble grows with the stages and shrinks with the micro "
                "batches a step (lesson 11)")
    if part == "tp":
        return (f"tensor parallelism's all-reduces take {extra}: 4 a block for every micro batch, none hidden behind "
                "compute")
    if part == "pp":
        return (f"its pipeline's sends take {extra}: the step waits on 2 (m + pp - 1) of them, on Slingshot once "
                "tp x pp spans more than a node's GPUs")
    if row["zero"] == 3:
        return f"data parallelism's exposed communication is {extra}: ZeRO-3 gathers the weights for every micro batch"
    if row["zero"] == 2 and row["micro_batches"] > 1:
        return (f"data parallelism's exposed communication is {extra}: ZeRO-2 all-reduces the gradients in every "
                "micro batch's backward (lesson 8), not once a step")
    if row["zero"] in (1, 2):
        return (f"data parallelism's exposed communication is {extra}: ZeRO-{row['zero']} runs its all-reduce and "
                "all-gather after the backward, where DDP without a pipeline runs its buckets during it")
    return (f"data parallelism's exposed communication is {extra}: the more parameters a rank holds and the fewer "
            "rings share the node's link, the longer the reduction")


def check_layout(layout, step_parts, preset: str = "gpt3-2.7b", system: str = "polaris", nodes: int = 4,
                 global_batch_size: int = 512, within: float = 0.005, part_within: float = 0.02) -> bool:
    """The capstone: `step_parts(dp, tp, pp, zero, recompute, micro_batch_size)`, the learner's predicted step of a
    layout as a dict of PARTS' keys in seconds, must match the chooser's part by part (each within `part_within`,
    or a millisecond where it is zero) on the worked example (EXAMPLE), on SECOND (whose parts the
    lesson does not print) and on `layout`.  `layout`, a dict
    of LAYOUT_KEYS for the language model at `preset`'s size on `nodes` of `system` at `global_batch_size`
    sequences a step, must be one the machine and DeepSpeed allow, fit in a device (scaledl.perf.choose's memory
    per rank) and be predicted within `within` of the fastest layout that fits: the set the model cannot tell
    apart (for GPT-3 2.7B on 4 Polaris nodes, 3 layouts within 0.5%, the next 0.55% behind).  The verdict on speed
    comes only after the parts are right, so each layout tried costs its arithmetic.  A FAIL names the symptom
    (the rule broken, the part too large, the memory over the limit), never a value of a part or the fastest
    layout."""
    from scaledl import models
    from scaledl.perf import choose, predict

    sizes, machine, device = models.GPT_PRESETS[preset], predict.SYSTEMS[system], choose.DEVICES[system]
    chooser, wrong = _parts_graded(step_parts, preset, system, nodes, global_batch_size, part_within)
    if wrong is not None:
        return wrong
    if layout is None:
        return _unfinished("layout")
    if not isinstance(layout, dict) or set(LAYOUT_KEYS) - set(layout):
        return _verdict(False, f"`layout` must be a dict with the keys {', '.join(LAYOUT_KEYS)}")
    dp, tp, pp, zero, recompute, micro = (layout[key] for key in LAYOUT_KEYS)
    if not all(isinstance(v, int) and v >= 1 for v in (dp, tp, pp, micro)) or zero not in (0, 1, 2, 3):
        return _verdict(False, "dp, tp, pp and micro_batch_size are whole numbers of at least 1, zero a stage 0-3")
    refused = choose.refusal(sizes, machine, nodes, global_batch_size, dp, tp, pp, zero, recompute, micro)
    if refused:
        return _verdict(False, refused)
    row = chooser(layout)
    limit = (1 - choose.HEADROOM) * device.memory_bytes / 2**30
    if not row["fits"]:
        activations = row["memory_gib"] - _state_gib(sizes, dp, tp, pp, zero)
        return _verdict(False, f"it needs {row['memory_gib']:.1f} GiB a rank, more than {limit:.0f} GiB "
                               f"({1 - choose.HEADROOM:.0%} of the {device.name}'s): the state takes "
                               f"{row['memory_gib'] - activations:.1f} GiB and the "
                               f"activations {activations:.1f} GiB; shrink the larger (shard the state with a higher "
                               "ZeRO stage or split the layers; recompute or use smaller micro batches)")
    wrong = _parts_wrong(step_parts, layout, step_parts_of(row), part_within, "your layout")
    if wrong is not None:
        return wrong if wrong is False else _verdict(False, f"your layout fits ({row['memory_gib']:.1f} GiB a rank), "
                                                            f"but {wrong}")
    best, tied = _fastest(choose.layouts(sizes, machine, device, nodes, global_batch_size), within)
    if row["step_s"] > (1 + within) * best["step_s"]:
        plain = chooser({**layout, "recompute": "none"}) if recompute == "full" else row
        slower = row["step_s"] / best["step_s"] - 1
        return _verdict(False, f"it fits ({row['memory_gib']:.1f} GiB a rank) but is predicted at "
                               f"{_two(row['step_s'])} s a step, {slower:.{2 if slower < 0.01 else 1}%} slower than "
                               f"the fastest that fits ({_two(best['step_s'])} s), beyond the {within:.1%} inside "
                               "which the model cannot tell layouts apart: "
                               + _slower_because(row, best, plain["fits"]))
    return _verdict(True, f"{row['memory_gib']:.1f} GiB a rank, every part of its step right (and of the worked "
                          f"example's and the second layout's), {_two(row['step_s'])} s a step predicted: one of the "
                          f"{len(tied)} layouts within {within:.1%} of the fastest that fits "
                          f"({_two(best['step_s'])} s), which the model cannot tell apart (it leaves out effects of "
                          "a few percent); a measurement decides between them")



# Step 2's five printed layouts, by the name the lesson prints: (dp, tp, pp, zero, recompute, micro_batch_size)
STEP2_LINES = {"plain DDP": (16, 1, 1, 0, "none", 1), "ZeRO-1": (16, 1, 1, 1, "none", 1),
               "ZeRO-1, micro batch 8": (16, 1, 1, 1, "none", 8), "ZeRO-1, recompute, 8": (16, 1, 1, 1, "full", 8),
               "tp 4, pp 2, ZeRO-1": (2, 4, 2, 1, "none", 1)}


def first_guess_note(first_guess, preset: str = "gpt3-2.7b", system: str = "polaris", nodes: int = 4,
                     global_batch_size: int = 512, within: float = 0.005) -> str:
    """One line on the ungraded `first_guess` (a dict of LAYOUT_KEYS), priced by scaledl.perf.choose: how far it
    falls behind the fastest layout that fits, the part of its step in excess (as check_layout words it), and the
    line of Step 2 (STEP2_LINES) it overlooked: the fastest of those lines that fits and beats it."""
    from scaledl import models
    from scaledl.perf import choose, predict

    if not isinstance(first_guess, dict) or set(LAYOUT_KEYS) - set(first_guess):
        return f"`first_guess` is not set yet: a dict with the keys {', '.join(LAYOUT_KEYS)}"
    sizes, machine, device = models.GPT_PRESETS[preset], predict.SYSTEMS[system], choose.DEVICES[system]
    args = tuple(first_guess[key] for key in LAYOUT_KEYS)
    refused = choose.refusal(sizes, machine, nodes, global_batch_size, *args)
    if refused:
        return f"your first guess is not allowed: {refused}"
    price = lambda layout: choose.evaluate(sizes, machine, device, nodes, global_batch_size, *layout)  # noqa: E731
    row = price(args)
    best, _ = _fastest(choose.layouts(sizes, machine, device, nodes, global_batch_size), within)
    lines = {name: price(layout) for name, layout in STEP2_LINES.items()}
    beaten = {name: line for name, line in lines.items() if line["fits"] and line["step_s"] < row["step_s"]}
    head = f"your first guess: {row['memory_gib']:.1f} GiB a rank, {_two(row['step_s'])} s a step predicted"
    if not row["fits"]:
        return f"{head}; it does not fit ({1 - choose.HEADROOM:.0%} of the {device.name}'s memory)"
    if row["step_s"] <= (1 + within) * best["step_s"]:
        return f"{head}, within {within:.1%} of the fastest that fits: the reasoning found it"
    behind = row["step_s"] / best["step_s"] - 1
    fits_without_recompute = price((*args[:4], "none", args[5]))["fits"]
    digits = 0 if behind >= 0.1 else 2 if behind < 0.01 else 1  # the percent to two significant figures
    note = (f"{head}, {behind:.{digits}%} behind the fastest that fits: "
            + _slower_because(row, best, fits_without_recompute))
    if beaten:
        name = min(beaten, key=lambda name: beaten[name]["step_s"])
        note += (f". Overlooked: Step 2's line \"{name}\" already fits ({beaten[name]['memory_gib']:.1f} GiB) and is "
                 f"faster ({_two(beaten[name]['step_s'])} s)")
    return note

def _state_gib(sizes: dict, dp: int, tp: int, pp: int, zero: int) -> float:
    """The state a rank holds (weights, gradients, optimizer state, bf16 with Adam) as scaledl.perf.choose counts
    it, in GiB."""
    import math

    from scaledl import zero_memory
    from scaledl.perf import choose

    held = math.ceil(choose.params_per_rank(sizes["width"], sizes["depth"], sizes["seq_len"], tp, pp))
    weight, grad, state = zero_memory.bytes_per_param("bf16", zero, choose.ADAM_STATE_BYTES)
    return zero_memory.predict(held, dp, zero, weight, grad, state)["total"] / 2**30


_KINDS = {"dp": "data parallelism", "tp": "tensor parallelism", "pp": "a pipeline"}


def _kind(row: dict) -> str:
    return "tp" if row["tp"] > 1 else "pp" if row["pp"] > 1 else "dp"


def _messages(row: dict) -> int:
    """The collectives or sends one step of a 2-rank layout of `scaledl.perf.bench.layouts` waits on, as the
    chooser counts them: dp one all-reduce of the gradients (the small model's fit in one DDP bucket); tp the
    rung's all-reduces a block, for every block and micro batch; pp 2 (m + pp - 1) sends on the critical path."""
    from scaledl.perf import predict
    from scaledl.perf.bench import layouts

    kind = _kind(row)
    if kind == "tp":
        return predict.RUNG_TP_ALLREDUCES_PER_BLOCK * layouts.SIZES["depth"] // row["pp"] * row["micro_batches"]
    if kind == "pp":
        return 2 * (row["micro_batches"] + row["pp"] - 1)
    return 1


def check_layouts_here(messages_here, comm_ms_here, order_here, rows: list[dict], link) -> bool:
    """`messages_here`: {"dp": n, "tp": n, "pp": n}, the all-reduces or sends one step of each 2-rank layout waits
    on (`_messages`); `comm_ms_here(link)`: each layout's predicted communication a step in milliseconds (messages
    times one message's cost on `link`, the fitted all-reduce), within a factor of 2 of the chooser's (`compare`'s
    rows); `order_here`: the three kinds, fastest step first, graded against the measured order or the model's
    (`compare`'s rows, one of each kind: one noisy run can swap layouts the model sets close).  A FAIL
    names the idea to recount or reweigh, never the number or the order."""
    import math

    from scaledl.perf import predict

    if messages_here is None:
        return _unfinished("messages_here")
    if not isinstance(messages_here, dict) or set(messages_here) != set(_KINDS):
        return _verdict(False, f"`messages_here` is a dict with the keys \"dp\", \"tp\" and \"pp\", got "
                               f"{messages_here!r}")
    by_kind = {_kind(row): row for row in rows}
    hints = {"dp": "one step of data parallelism: how many times are the gradients reduced, in how many buckets?",
             "tp": "a block's all-reduces in lesson 12's rung (forward and backward), times the blocks, times the "
                   "micro batches of a step",
             "pp": "each micro batch's activations go forward and its gradient back; the critical path also waits "
                   "through the pipeline's fill and drain (lesson 11)"}
    for kind in ("dp", "tp", "pp"):
        found = messages_here[kind]
        if isinstance(found, bool) or not isinstance(found, int):
            return _verdict(False, f"`messages_here[\"{kind}\"]` is {found!r}: give a whole number")
        want = _messages(by_kind[kind])
        if found != want:
            why = hints[kind]
            if kind == "tp" and found == want // predict.RUNG_TP_ALLREDUCES_PER_BLOCK * \
                    predict.MEGATRON_TP_ALLREDUCES_PER_BLOCK:
                why = "that is Megatron-LM's count a block, with q, k and v fused; the rung's layers are not"
            return _verdict(False, f"`messages_here[\"{kind}\"]` is {found}, not what the chooser counts: {why}")
    if comm_ms_here is None:
        return _unfinished("comm_ms_here")
    if not callable(comm_ms_here):
        return _verdict(False, "`comm_ms_here` must be a function of the link, returning {\"dp\": ms, \"tp\": ms, "
                               "\"pp\": ms}")
    found = _attempt("comm_ms_here", "comm_ms_here(link)", lambda: comm_ms_here(link))
    if found is _FAILED:
        return False
    if not isinstance(found, dict) or set(found) != set(_KINDS):
        return _verdict(False, f"`comm_ms_here(link)` returns a dict with the keys \"dp\", \"tp\" and \"pp\", got "
                               f"{found!r}")
    cost = {"dp": "one ring all-reduce of the gradients' bytes on 2 ranks: 2 ring steps, each alpha in a step "
                  "(`link.alpha_s`) plus half the bytes over the bandwidth",
            "tp": "each all-reduce is a ring all-reduce of one micro batch's activations on 2 ranks (2 alphas in a "
                  "step plus the bytes over the bandwidth)",
            "pp": "each send is one alpha in a step plus one micro batch's activations over the bandwidth"}
    for kind in ("dp", "tp", "pp"):
        value, want = found[kind], by_kind[kind][f"{kind}_ms"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            return _verdict(False, f"`comm_ms_here(link)[\"{kind}\"]` is {value!r}: give milliseconds, a positive "
                                   "number")
        if not want / 2 <= value <= want * 2:
            return _verdict(False, f"your counts are right, but `comm_ms_here(link)[\"{kind}\"]` is more than a factor "
                                   f"of 2 from the chooser's: {cost[kind]}; the link's `alpha_s` and `bandwidth_Bps` "
                                   "are in seconds and bytes a second")
    if order_here is None:
        return _unfinished("order_here")
    if not isinstance(order_here, (list, tuple)) or sorted(order_here) != sorted(_KINDS):
        return _verdict(False, f"`order_here` lists \"dp\", \"tp\" and \"pp\" once each, fastest first, got "
                               f"{order_here!r}")
    measured = [_kind(row) for row in sorted(rows, key=lambda row: row["measured_ms"])]
    modelled = [_kind(row) for row in sorted(rows, key=lambda row: row["predicted_ms"])]
    if list(order_here) not in (measured, modelled):
        return _verdict(False, f"your counts and milliseconds are right, but {list(order_here)} is neither the order "
                               "the model predicts nor the one the runs measured: "
                               "weigh each layout's messages (about a millisecond each here, nothing overlapped), "
                               "recomputation's extra compute and the pipeline's bubble against its compute")
    if list(order_here) != measured:
        # One run on shared cores can swap two layouts the model sets close: the reasoning is graded, not the noise.
        return _verdict(True, f"{' < '.join(modelled)} is the model's order, but this run measured "
                              f"{' < '.join(measured)} ("
                              + ", ".join(f"{kind} {by_kind[kind]['measured_ms']:.3g} ms" for kind in measured)
                              + "): a miss of the model on this machine, not of your reasoning")
    return _verdict(True, f"{' < '.join(measured)}, as measured ("
                          + ", ".join(f"{kind} {by_kind[kind]['measured_ms']:.3g} ms" for kind in measured)
                          + f"): {', '.join(f'{kind} waits on {_messages(by_kind[kind])}' for kind in measured)} "
                          "messages a step; your communication "
                          + ", ".join(f"{kind} {found[kind]:.3g} ms" for kind in measured)
                          + " against the chooser's "
                          + ", ".join(f"{kind} {by_kind[kind][kind + '_ms']:.3g}" for kind in measured))
