"""Lesson 14's checks (the capstone's layout, the fastest layout measured here): each passes the right
answer and names the fault of a wrong one."""

import pytest

from conftest import fails, verdict
from scaledl.workshop import checks


def layout(**changes):
    return {"dp": 16, "tp": 1, "pp": 1, "zero": 1, "recompute": "none", "micro_batch_size": 1, **changes}


def row_of(layout):
    """The chooser's row of `layout` (scaledl.perf.choose.evaluate)."""
    from scaledl import models
    from scaledl.perf import choose, predict

    return choose.evaluate(models.GPT_PRESETS["gpt3-2.7b"], predict.POLARIS, choose.DEVICES["polaris"], 4, 512,
                           *(layout[key] for key in ("dp", "tp", "pp", "zero", "recompute", "micro_batch_size")))


def parts_of(layout, **changes):
    """The chooser's predicted step of `layout`, part by part: what a learner's table comes to; `changes` scale
    parts (a wrong part)."""
    from scaledl.workshop.checks.lesson_14 import step_parts_of

    row = row_of(layout)
    parts = step_parts_of(row)
    assert sum(parts.values()) == pytest.approx(row["step_s"], rel=1e-12)
    return {key: value * changes.get(key, 1.0) for key, value in parts.items()}


def learner(**changes):
    """A learner's `step_parts` function: the chooser's parts, with `changes` scaling some of them."""
    return lambda **lay: parts_of(lay, **changes)


def check(layout, step_parts=None):
    return checks.check_layout(layout, step_parts or learner())


def test_layout(capsys):
    # The set the model cannot tell apart: 3 layouts within 0.5% of the fastest, the next 0.55% behind.
    assert check(layout())
    assert "one of the 3 layouts within 0.5% of the fastest" in verdict(capsys)
    # ZeRO-2 needs less memory, but all-reduces the gradients in each of the 32 micro batches' backward.
    fails(capsys, check(layout(zero=2)), "71.0% slower", "ZeRO-2 all-reduces the gradients in every micro batch's")
    fails(capsys, check(layout(zero=2, micro_batch_size=4)), "16.0% slower", "every micro batch's backward")
    # DDP on 2 stages: DeepSpeed's pipeline reduces after its last backward, so its bubble is not repaid.
    fails(capsys, check(layout(dp=8, pp=2, zero=0)), "0.55% slower", "its pipeline's bubble")
    assert check(layout(micro_batch_size=4))  # 4 sequences at once: as fast, more memory
    verdict(capsys)
    # A realistic wrong answer is told its symptom, never the fastest layout nor a part's value.
    fastest = "dp 16, tp 1, pp 1"
    for wrong, symptom in ((layout(dp=2, tp=8), "stays inside a node"),  # tp across nodes
                           (layout(micro_batch_size=8), "the activations 40.2 GiB"),  # does not fit
                           (layout(zero=0), "the state takes 37.6 GiB"),  # plain DDP: 16 bytes a parameter
                           (layout(dp=4, pp=4, zero=0), "its pipeline's bubble"),  # more stages than fitting needs
                           (layout(dp=4, tp=2, pp=2), "tensor parallelism's all-reduces"),  # the worked example
                           (layout(recompute="full"), "fits without recomputation"),
                           (layout(zero=3), "ZeRO-3 gathers the weights for every micro batch")):
        line = fails(capsys, check(wrong), symptom)
        assert fastest not in line and "zero 1" not in line, line  # the fastest layout stays unnamed
    fails(capsys, check(layout(dp=4, pp=4, zero=0)), "1.1% slower", "beyond the 0.5%")
    # Symptoms no wrong answer reaches here, where the fastest has no pipeline: against a 2-stage pipeline's row.
    from scaledl.workshop.checks.lesson_14 import _slower_because

    piped = row_of(layout(dp=8, pp=2, zero=0))
    assert "its pipeline's sends" in _slower_because(row_of(layout(dp=1, pp=16, zero=0)), piped, True)
    assert "ZeRO-1 runs its all-reduce and all-gather after the backward" in _slower_because(
        row_of(layout(dp=8, pp=2)), piped, True)
    fails(capsys, check(layout(recompute="full", micro_batch_size=8)), "adds a third to the compute")
    check(layout(recompute="full", micro_batch_size=8))
    assert "fits without recomputation" not in verdict(capsys)  # 8 sequences need it
    fails(capsys, check(layout(dp=8, pp=2, zero=0, micro_batch_size=4)), "more than 36 GiB", "shrink the larger")
    fails(capsys, check(layout(dp=4, tp=4, zero=3, micro_batch_size=8)), "data parallelism's")
    # Each part within 2%, and a part that is zero may be off by a millisecond.
    assert check(layout(), learner(compute=1.019, dp=0.981))
    verdict(capsys)
    # A wrong part is named, never its value; the worked example is graded first.
    line = fails(capsys, check(layout(), learner(dp=1.1)), "the part \"dp\"", "5. dp's communication",
                 "the worked example")
    assert "0.2" not in line and "0.3" not in line, line
    # Right on the worked example, wrong on the second layout, whose parts the lesson does not print: rule 5's
    # ZeRO-0 case with a pipeline (nothing hidden), or rule 4's sends kept on NVLink when tp x pp spans two nodes.
    only_zero0 = lambda **lay: parts_of(lay, dp=1.5 if lay["zero"] == 0 else 1.0)  # noqa: E731
    line = fails(capsys, check(layout(dp=8, pp=2, zero=0), only_zero0), "the second layout", "5. dp's communication")
    assert "worked example" not in line, line
    nvlink_only = lambda **lay: parts_of(lay, pp=0.5 if lay["tp"] * lay["pp"] > 4 else 1.0)  # noqa: E731
    fails(capsys, check(layout(), nvlink_only), "the second layout (dp 2, tp 4, pp 2, ZeRO-0", "4. pp's sends")
    # Right on both graded layouts, wrong only on the learner's own (rule 5's ZeRO-1 case without a pipeline).
    only_mine = lambda **lay: parts_of(lay, dp=1.5 if lay["pp"] == 1 else 1.0)  # noqa: E731
    fails(capsys, check(layout(), only_mine), "your layout fits", "5. dp's communication")
    # Rule 5's B: the node's 50 GB/s shared by min(tp x pp, 4) rings, 4 for the worked example. A dp part off by
    # such a factor is named.
    fails(capsys, check(layout(), learner(dp=0.5)), "the part \"dp\"")
    # Rule 2's bubble forgotten, rule 3's all-reduces at 6 a block, rule 4's sends on Slingshot, rule 1's compute
    # stretched by 8/6 without recomputation.
    fails(capsys, check(layout(), learner(bubble=0.0)), "2. the bubble")
    fails(capsys, check(layout(), learner(tp=1.5)), "3. tp's all-reduces")
    fails(capsys, check(layout(), learner(pp=1.5)), "4. pp's sends")
    fails(capsys, check(layout(), learner(compute=8 / 6)), "1. compute")
    fails(capsys, check(layout(), lambda **lay: {"compute": 8.0}), "must return a dict with the keys")
    fails(capsys, check(layout(), lambda **lay: {**parts_of(lay), "dp": "0.28"}), "give seconds")
    fails(capsys, checks.check_layout(layout(), 8.28), "must be a function")
    fails(capsys, checks.check_layout(layout(), None), "`step_parts` is not set")
    fails(capsys, check(layout(), lambda **lay: 1 / 0), "raised ZeroDivisionError")
    fails(capsys, check(None), "`layout` is not set")
    fails(capsys, check({"dp": 16}), "must be a dict with the keys")
    # A slow layout is named slow only once its parts are right: each one tried costs its arithmetic.
    fails(capsys, check(layout(recompute="full"), lambda **lay: parts_of(lay, compute=0.75 if lay["recompute"] ==
                                                                         "full" else 1.0)), "1. compute")
    fails(capsys, check(layout(dp=8, pp=2, zero=3)), "refuses ZeRO-2 and ZeRO-3")
    fails(capsys, check(layout(dp=8)), "must use the 16 ranks")
    fails(capsys, check(layout(dp=1, tp=4, pp=4, zero=1)), "nothing to partition")
    fails(capsys, check(layout(dp=16, pp=1, tp=1, micro_batch_size=3)), "equal parts")
    fails(capsys, check(layout(dp=16 // 3 * 3, tp=1, pp=1)), "must use the 16 ranks")
    fails(capsys, check(layout(recompute="selective")), "recompute is one of")
    fails(capsys, check(layout(dp=2, pp=8, tp=1, zero=0, micro_batch_size="1")), "whole numbers")


def test_step_parts(capsys):
    from scaledl.workshop.checks.lesson_14 import check_step_parts

    # Part 1 alone: the worked example and the second layout, each part within 2%; a FAIL names the part only, by
    # its rule's number in Step 3.
    assert check_step_parts(learner())
    assert "a step of 9.3 s)" in verdict(capsys)  # two significant figures: nominal inputs
    line = fails(capsys, check_step_parts(learner(tp=1.5)), "the worked example", "3. tp's all-reduces")
    assert "0.9" not in line, line
    nvlink_only = lambda **lay: parts_of(lay, pp=0.5 if lay["tp"] * lay["pp"] > 4 else 1.0)  # noqa: E731
    fails(capsys, check_step_parts(nvlink_only), "the second layout", "4. pp's sends")
    fails(capsys, check_step_parts(None), "`step_parts` is not set")
    fails(capsys, check_step_parts(8.28), "must be a function")


# ---------------------------------------------------------------- the fastest layout here
def layout_rows(dp_ms=18.6, tp_ms=76.5, pp_ms=49.1):
    """Rows shaped as scaledl.perf.bench.layouts.compare returns them (the numbers from a run here)."""
    return [{"dp": 2, "tp": 1, "pp": 1, "micro_batches": 1, "measured_ms": dp_ms, "predicted_ms": 17.0,
             "compute_ms": 14.9, "tp_ms": 0.0, "pp_ms": 0.0, "dp_ms": 2.2, "bubble": 0.0},
            {"dp": 1, "tp": 1, "pp": 2, "micro_batches": 4, "measured_ms": pp_ms, "predicted_ms": 26.9,
             "compute_ms": 18.6, "tp_ms": 0.0, "pp_ms": 8.3, "dp_ms": 0.0, "bubble": 0.2},
            {"dp": 1, "tp": 2, "pp": 1, "micro_batches": 1, "measured_ms": tp_ms, "predicted_ms": 42.9,
             "compute_ms": 14.9, "tp_ms": 28.0, "pp_ms": 0.0, "dp_ms": 0.0, "bubble": 0.0}]


MESSAGES = {"dp": 1, "tp": 24, "pp": 10}  # the exercise's answer: 1 all-reduce; 6 x 4 blocks x 1; 2 x (4 + 2 - 1)


def _link():
    from scaledl.perf import predict

    return predict.Link(770e-6, 1.52e9)


def comm_ms(link, scale=1.0, forget_bandwidth=False):
    """The exercise's answer: each layout's messages times one message's cost on `link`, in milliseconds."""
    from scaledl.perf import predict

    per_byte = 0.0 if forget_bandwidth else 1 / link.bandwidth_Bps
    return {"dp": 1e3 * predict.allreduce_s(237_184 * 4, 2, link) * scale,
            "tp": 1e3 * 24 * (2 * link.alpha_s + 16 * 64 * 64 * 4 * per_byte) * scale,
            "pp": 1e3 * 10 * (link.alpha_s + 4 * 64 * 64 * 4 * per_byte) * scale}


def test_layouts_here_check(capsys):
    link = _link()
    rows = layout_rows()
    want = comm_ms(link)
    for row in rows:  # the rows priced with the same link, as `compare` prices them
        kind = "tp" if row["tp"] > 1 else "pp" if row["pp"] > 1 else "dp"
        row[f"{kind}_ms"] = round(want[kind], 1)

    def check(messages, comm, order, rows=rows):
        return checks.check_layouts_here(messages, comm, order, rows, link)

    assert check(MESSAGES, comm_ms, ["dp", "pp", "tp"])
    assert "dp < pp < tp, as measured" in verdict(capsys)
    fails(capsys, check(None, None, None), "`messages_here` is not set")
    fails(capsys, check({"dp": 1}, comm_ms, ["dp", "pp", "tp"]), "keys")
    # A count that is wrong is told the idea to recount, never the number.
    fails(capsys, check(MESSAGES | {"tp": 16}, comm_ms, ["dp", "pp", "tp"]), "Megatron-LM's count")
    fails(capsys, check(MESSAGES | {"tp": 6}, comm_ms, ["dp", "pp", "tp"]), "times the blocks")
    fails(capsys, check(MESSAGES | {"pp": 8}, comm_ms, ["dp", "pp", "tp"]), "fill and drain")
    fails(capsys, check(MESSAGES | {"dp": 4}, comm_ms, ["dp", "pp", "tp"]), "buckets")
    fails(capsys, check(MESSAGES | {"dp": 1.0}, comm_ms, ["dp", "pp", "tp"]), "whole number")
    for wrong in (MESSAGES | {"tp": 16}, MESSAGES | {"pp": 8}):
        check(wrong, comm_ms, ["dp", "pp", "tp"])
        line = verdict(capsys)
        assert "24" not in line and "10" not in line  # the answer stays out of the FAIL line
    # The milliseconds: within a factor of 2 of the chooser's, each kind named when off.
    fails(capsys, check(MESSAGES, None, ["dp", "pp", "tp"]), "`comm_ms_here` is not set")
    fails(capsys, check(MESSAGES, {"dp": 2.2}, ["dp", "pp", "tp"]), "must be a function of the link")
    fails(capsys, check(MESSAGES, lambda link: comm_ms(link, scale=1e-3), ["dp", "pp", "tp"]),
          "more than a factor of 2", "comm_ms_here(link)[\"dp\"]")  # seconds, not milliseconds
    fails(capsys, check(MESSAGES, lambda link: comm_ms(link) | {"tp": comm_ms(link)["tp"] * 2.5}, ["dp", "pp", "tp"]),
          "comm_ms_here(link)[\"tp\"]")
    fails(capsys, check(MESSAGES, lambda link: comm_ms(link) | {"pp": 1e3 * 10 * link.alpha_s / 4},
                        ["dp", "pp", "tp"]), "comm_ms_here(link)[\"pp\"]")
    fails(capsys, check(MESSAGES, lambda link: {"dp": 1.0}, ["dp", "pp", "tp"]), "returns a dict")
    fails(capsys, check(MESSAGES, lambda link: 1 / 0, ["dp", "pp", "tp"]), "raised ZeroDivisionError")
    assert check(MESSAGES, lambda link: comm_ms(link, scale=1.9), ["dp", "pp", "tp"])  # a factor of 2 is allowed
    verdict(capsys)
    # Counts and milliseconds right: the order is graded against the measurement or the model, never told.
    fails(capsys, check(MESSAGES, comm_ms, None), "`order_here` is not set")
    fails(capsys, check(MESSAGES, comm_ms, ["dp", "tp", "pp"]), "neither the order the model predicts nor")
    check(MESSAGES, comm_ms, ["tp", "dp", "pp"])
    assert "dp < pp" not in verdict(capsys)
    fails(capsys, check(MESSAGES, comm_ms, ["dp", "dp", "tp"]), "once each")
    # The measurement decides: where the pipeline ran fastest, it comes first.
    slow_dp = layout_rows(dp_ms=60.0)
    for row, priced in zip(slow_dp, rows):
        row.update({key: priced[key] for key in ("tp_ms", "pp_ms", "dp_ms")})
    assert check(MESSAGES, comm_ms, ["pp", "dp", "tp"], slow_dp)
    verdict(capsys)
    # The model's order passes too where one noisy run swapped two layouts, and the verdict says which ran first.
    assert check(MESSAGES, comm_ms, ["dp", "pp", "tp"], slow_dp)
    assert "the model's order, but this run measured pp < dp < tp" in verdict(capsys)
    fails(capsys, check(MESSAGES, comm_ms, ["tp", "pp", "dp"], slow_dp), "neither the order")


# ---------------------------------------------------------------- a layout's memory per rank
WIDTH, DEPTH, HEADS, SEQ_LEN, GLOBAL_BATCH_SIZE = 2560, 32, 32, 2048, 512


def memory_gib(dp, tp, pp, zero, recompute, micro_batch_size, sharded=(1, 2, 3), in_flight=None, activations=True):
    """The exercise's answer, with one part changeable into a learner's mistake."""
    from scaledl.perf import choose

    held = choose.params_per_rank(WIDTH, DEPTH, SEQ_LEN, tp, pp)
    one = choose.activation_bytes(SEQ_LEN, micro_batch_size, WIDTH, DEPTH // pp, HEADS, recompute, "bf16", tp)
    weights, grads, state = 2 * held, 2 * held, 12 * held
    state /= dp if zero >= sharded[0] else 1
    grads /= dp if zero >= sharded[1] else 1
    weights /= dp if zero >= sharded[2] else 1
    m = GLOBAL_BATCH_SIZE // (dp * micro_batch_size)
    held_at_once = (min(m, pp) if pp > 1 else 1) if in_flight is None else in_flight(m, pp)
    return (weights + grads + state + held_at_once * one * activations) / 2**30


def test_memory_per_rank(capsys):
    assert checks.check_memory_per_rank(memory_gib)
    assert "matches the chooser's on all" in verdict(capsys)
    fails(capsys, checks.check_memory_per_rank(None), "`memory_gib` is not set")
    fails(capsys, checks.check_memory_per_rank(3.0), "must be a function")
    fails(capsys, checks.check_memory_per_rank(lambda *args: 1 / 0), "raised ZeroDivisionError")
    # ZeRO-2 taken to shard the weights too, as stage 3 does.
    fails(capsys, checks.check_memory_per_rank(lambda *a: memory_gib(*a, sharded=(1, 2, 2))), "at ZeRO-2")
    # No sharding at all: every stage held as stage 0.
    fails(capsys, checks.check_memory_per_rank(lambda *a: memory_gib(*a, sharded=(9, 9, 9))), "at ZeRO-",
          "over 16 ranks")
    # Every micro batch of the step held at once, or one only, with a pipeline.
    fails(capsys, checks.check_memory_per_rank(lambda *a: memory_gib(*a, in_flight=lambda m, pp: m if pp > 1 else 1)),
          "pp=2")
    fails(capsys, checks.check_memory_per_rank(lambda *a: memory_gib(*a, in_flight=lambda m, pp: 1)), "pp=2")
    # pp micro batches in flight even where the step has fewer: only a short step shows it.
    fails(capsys, checks.check_memory_per_rank(lambda *a: memory_gib(*a, in_flight=lambda m, pp: pp if pp > 1 else 1)),
          "micro_batch_size=64", "1 micro batch(es) in flight")
    fails(capsys, checks.check_memory_per_rank(lambda *a: memory_gib(*a, activations=False)), "the activations")


def test_two_significant_figures():
    from scaledl.workshop.checks.lesson_14 import _two

    # Predicted seconds from nominal inputs: two significant figures, never an exponent.
    assert [_two(x) for x in (9.2531, 8.0, 0.9412, 0.0283, 36.4, 540.3, 1234.5)] == \
        ["9.3", "8.0", "0.94", "0.028", "36", "540", "1200"]


def test_first_guess_note():
    from scaledl.workshop.checks.lesson_14 import first_guess_note

    # The lesson's plausible guess: split the layers. The note names the excess part and the line overlooked.
    note = first_guess_note(layout(dp=2, tp=4, pp=2))
    assert "36% behind" in note and "11 s a step" in note and "tensor parallelism's all-reduces" in note
    assert 'Overlooked: Step 2\'s line "ZeRO-1" already fits (16.2 GiB)' in note
    note = first_guess_note(layout(recompute="full"))  # fits at 16.2 GiB without recomputing
    assert "recomputing every block" in note and "fits without recomputation" in note and '"ZeRO-1"' in note
    note = first_guess_note(layout(recompute="full", micro_batch_size=8))  # needs it: 51.4 GiB without
    assert "recomputing every block" in note and "fits without recomputation" not in note
    assert "the reasoning found it" in first_guess_note(layout(micro_batch_size=2))  # inside the tie
    assert "does not fit" in first_guess_note(layout(zero=0))  # plain DDP: 42.6 GiB
    assert "not allowed" in first_guess_note(layout(dp=2, tp=8))
    assert "not set yet" in first_guess_note(None)
