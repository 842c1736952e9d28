"""Lesson 14's checks (the capstone's layout, the fastest layout measured here): each passes the right
answer and names the fault of a wrong one."""

import pytest

from conftest import fails, verdict
from scaledl.workshop import checks


def layout(**changes):
    return {"dp": 16, "tp": 1, "pp": 1, "zero": 1, "recompute": "none", "micro_batch_size": 1, **changes}


def parts_of(layout, **changes):
    """The chooser's predicted step of `layout`, part by part: what a learner's table comes to; `changes` scale
    parts (a wrong part)."""
    from scaledl import models
    from scaledl.perf import choose, predict
    from scaledl.workshop.checks.lesson_14 import step_parts

    row = choose.evaluate(models.GPT_PRESETS["gpt3-2.7b"], predict.POLARIS, choose.DEVICES["polaris"], 4, 512,
                          *(layout[key] for key in ("dp", "tp", "pp", "zero", "recompute", "micro_batch_size")))
    parts = step_parts(row)
    assert sum(parts.values()) == pytest.approx(row["step_s"], rel=1e-12)
    return {key: value * changes.get(key, 1.0) for key, value in parts.items()}


def check(layout, parts="right"):
    return checks.check_layout(layout, parts_of(layout) if parts == "right" else parts)


def test_layout(capsys):
    assert check(layout())
    assert "within 5% of the fastest that fits" in verdict(capsys)
    assert check(layout(dp=8, pp=2, zero=0))  # the predictor's fastest: ZeRO-0's exposed-time rule, pp on NVLink
    verdict(capsys)
    # The table's worked example: every part present and right, but 12% slower than the fastest.
    fails(capsys, check(layout(dp=4, tp=2, pp=2)), "more than 5% slower", "tensor parallelism's all-reduces")
    # Each part within 2%, and a part that is zero may be off by a millisecond.
    assert checks.check_layout(layout(), parts_of(layout(), compute=1.019, dp=0.981))
    verdict(capsys)
    # A wrong part is named, never its value.
    line = fails(capsys, checks.check_layout(layout(), parts_of(layout(), dp=1.1)), "`layout_parts[\"dp\"]`",
                 "5. dp's communication")
    assert "0.2" not in line and "0.3" not in line, line
    # The dp ring's 50 GB/s not shared by min(tp x pp, 4) rings: 2 rings for the worked example.
    fails(capsys, checks.check_layout(layout(dp=4, tp=2, pp=2), parts_of(layout(dp=4, tp=2, pp=2), dp=0.5)),
          "`layout_parts[\"dp\"]`")
    # The bubble forgotten, tp's all-reduces at Megatron-LM's count but 6 a block, pp's sends on Slingshot.
    example = layout(dp=4, tp=2, pp=2)
    fails(capsys, checks.check_layout(example, parts_of(example, bubble=0.0)), "2. the bubble")
    fails(capsys, checks.check_layout(example, parts_of(example, tp=1.5)), "3. tp's all-reduces")
    fails(capsys, checks.check_layout(example, parts_of(example, pp=1.5)), "4. pp's sends")
    fails(capsys, checks.check_layout(layout(), parts_of(layout(), compute=8 / 6)), "1. compute")
    fails(capsys, checks.check_layout(layout(), {"compute": 8.0}), "must be a dict with the keys")
    fails(capsys, checks.check_layout(layout(), {**parts_of(layout()), "dp": "0.28"}), "give seconds")
    fails(capsys, checks.check_layout(layout(), 8.28), "must be a dict with the keys")
    fails(capsys, checks.check_layout(layout(), None), "`layout_parts` is not set")
    fails(capsys, checks.check_layout(None, {}), "`layout` is not set")
    fails(capsys, check({"dp": 16}, {}), "must be a dict with the keys")
    fails(capsys, check(layout(zero=0)), "more than 36 GiB")  # plain DDP: 16 bytes a parameter
    # A slow layout is named slow only once its parts are right: each one tried costs its arithmetic.
    fails(capsys, check(layout(recompute="full"), parts_of(layout())), "`layout_parts[\"compute\"]`")
    fails(capsys, check(layout(recompute="full")), "adds a third to the compute")
    fails(capsys, check(layout(dp=4, tp=4, zero=3, micro_batch_size=8)), "data parallelism's")
    fails(capsys, check(layout(dp=2, tp=8), {}), "stays inside a node")
    fails(capsys, check(layout(dp=8, pp=2, zero=3), {}), "refuses ZeRO-2 and ZeRO-3")
    fails(capsys, check(layout(dp=8), {}), "must use the 16 ranks")
    fails(capsys, check(layout(dp=1, tp=4, pp=4, zero=1), {}), "nothing to partition")
    fails(capsys, check(layout(dp=16, pp=1, tp=1, micro_batch_size=3), {}), "equal parts")
    fails(capsys, check(layout(dp=16 // 3 * 3, tp=1, pp=1), {}), "must use the 16 ranks")
    fails(capsys, check(layout(recompute="selective"), {}), "recompute is one of")
    fails(capsys, check(layout(dp=2, pp=8, tp=1, zero=0, micro_batch_size="1"), {}), "whole numbers")


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


def test_layouts_here_check(capsys):
    check = checks.check_layouts_here
    assert check(MESSAGES, ["dp", "pp", "tp"], layout_rows())
    assert "dp < pp < tp, as measured" in verdict(capsys)
    fails(capsys, check(None, None, layout_rows()), "`messages_here` is not set")
    fails(capsys, check({"dp": 1}, ["dp", "pp", "tp"], layout_rows()), "keys")
    # A count that is wrong is told the idea to recount, never the number.
    fails(capsys, check(MESSAGES | {"tp": 16}, ["dp", "pp", "tp"], layout_rows()), "Megatron-LM's count")
    fails(capsys, check(MESSAGES | {"tp": 6}, ["dp", "pp", "tp"], layout_rows()), "times the blocks")
    fails(capsys, check(MESSAGES | {"pp": 8}, ["dp", "pp", "tp"], layout_rows()), "fill and drain")
    fails(capsys, check(MESSAGES | {"dp": 4}, ["dp", "pp", "tp"], layout_rows()), "buckets")
    fails(capsys, check(MESSAGES | {"dp": 1.0}, ["dp", "pp", "tp"], layout_rows()), "whole number")
    for wrong in (MESSAGES | {"tp": 16}, MESSAGES | {"pp": 8}):
        check(wrong, ["dp", "pp", "tp"], layout_rows())
        line = verdict(capsys)
        assert "24" not in line and "10" not in line  # the answer stays out of the FAIL line
    # Counts right: the order is graded against the measurement, and a wrong order is not told the right one.
    fails(capsys, check(MESSAGES, None, layout_rows()), "`order_here` is not set")
    fails(capsys, check(MESSAGES, ["dp", "tp", "pp"], layout_rows()), "not the order the runs measured")
    check(MESSAGES, ["tp", "dp", "pp"], layout_rows())
    assert "dp < pp" not in verdict(capsys)
    fails(capsys, check(MESSAGES, ["dp", "dp", "tp"], layout_rows()), "once each")
    # The measurement decides: where the pipeline ran fastest, it comes first.
    assert check(MESSAGES, ["pp", "dp", "tp"], layout_rows(dp_ms=60.0))
    verdict(capsys)


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
    fails(capsys, checks.check_memory_per_rank(lambda *a: memory_gib(*a, in_flight=lambda m, pp: m)), "pp=2")
    fails(capsys, checks.check_memory_per_rank(lambda *a: memory_gib(*a, in_flight=lambda m, pp: 1)), "pp=2")
    # pp micro batches in flight even where the step has fewer: only a short step shows it.
    fails(capsys, checks.check_memory_per_rank(lambda *a: memory_gib(*a, in_flight=lambda m, pp: pp if pp > 1 else 1)),
          "micro_batch_size=64", "1 micro batch(es) in flight")
    fails(capsys, checks.check_memory_per_rank(lambda *a: memory_gib(*a, activations=False)), "the activations")
