"""Lesson 8's checks (DeepSpeed's config, batch and accumulation plan): each passes the solution, FAILs on what
an untouched exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one
line."""

import numpy as np
import pytest

from conftest import fails, untouched, verdict
from scaledl.workshop import checks


# ---------------------------------------------------------------- DeepSpeed and ZeRO

GOOD = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 3, "train_batch_size": 48,
        "gradient_clipping": 0}


def test_deepspeed_config_check(capsys):
    assert checks.check_deepspeed_config([GOOD, GOOD], world_size=2)
    verdict(capsys)
    # Unusual but right: every config DeepSpeed accepts, one batch number left for it to infer.
    for left_out in ("train_batch_size", "gradient_accumulation_steps"):
        config = {key: value for key, value in GOOD.items() if key != left_out}
        assert checks.check_deepspeed_config([config], world_size=2)
        assert f"DeepSpeed infers {left_out}" in verdict(capsys)
    assert checks.check_deepspeed_config([{"train_batch_size": 96, "gradient_accumulation_steps": 3,
                                           "gradient_clipping": 0.0}], world_size=4)
    verdict(capsys)
    # The global batch without the ranks, and without the accumulation: two different numbers, both refused.
    fails(capsys, checks.check_deepspeed_config([{**GOOD, "train_batch_size": 24}], world_size=2),
          "train_batch_size 24 != micro batch 8 x accumulation 3 x world_size 2", "refuses")
    fails(capsys, checks.check_deepspeed_config([{**GOOD, "train_batch_size": 16}], world_size=2),
          "train_batch_size 16 != micro batch 8 x accumulation 3 x world_size 2")
    # The global batch in the micro batch's place.
    as_global = {**GOOD, "train_micro_batch_size_per_gpu": 48, "train_batch_size": 288}
    fails(capsys, checks.check_deepspeed_config([as_global], world_size=2), "comes to 48")
    fails(capsys, checks.check_deepspeed_config([{**GOOD, "gradient_clipping": 1.0}], world_size=2),
          "clips the gradient norm to that")
    # Clipping left to the default: 1.0 from DeepSpeed 0.19.3 on, none before.
    fails(capsys, checks.check_deepspeed_config([{k: v for k, v in GOOD.items() if k != "gradient_clipping"}],
                                                world_size=2), "0.19.3", "older releases do not")
    # Consistent, but not what the exercise asks: no accumulation.
    fails(capsys, checks.check_deepspeed_config([{**GOOD, "gradient_accumulation_steps": 1, "train_batch_size": 16}],
                                                world_size=2), "asks for 3")
    fails(capsys, checks.check_deepspeed_config([{"gradient_accumulation_steps": 3}], world_size=2),
          "needs train_batch_size or train_micro_batch_size_per_gpu")
    fails(capsys, checks.check_deepspeed_config([GOOD], world_size=1), "start 2 or more")
    assert not checks.check_deepspeed_config(None, world_size=2)  # untouched: from_ranks said NOT ATTEMPTED YET


def test_inferred_batch_check(capsys):
    """Exercise 1 leaves train_batch_size out and predicts what DeepSpeed infers: the engines' own number."""
    config = {key: value for key, value in GOOD.items() if key != "train_batch_size"}

    def check(predicted, config=config, inferred=(48, 48)):
        return checks.check_deepspeed_config([config] * 2, world_size=2, predicted=predicted,
                                             inferred_by_rank=None if inferred is None else list(inferred))

    assert check(48)
    assert "DeepSpeed inferred train_batch_size 48 = micro batch 8 x accumulation 3 x world_size 2" in verdict(capsys)
    assert check(48.0)
    verdict(capsys)
    fails(capsys, check(24), "24 is one rank's share")
    fails(capsys, check(16), "16 is one micro batch per rank", "3 micro batches")
    fails(capsys, check(8), "8 is one rank's micro batch")
    fails(capsys, check(100), "not what DeepSpeed inferred")
    fails(capsys, check(None), "`predicted_batch` is not set")
    fails(capsys, check("48"), "give a number")
    fails(capsys, check(48, config=GOOD), "leave \"train_batch_size\" out")
    fails(capsys, check(48, inferred=(48, None)), "not built on every rank")
    fails(capsys, check(48, config={**config, "gradient_clipping": 1.0}), "clips the gradient norm")


def test_batch_pair_check(capsys):
    """Exercise 1's prediction: does DeepSpeed accept train_batch_size and the micro batch alone, and with
    how many accumulation steps?  Graded against DeepSpeed's own verdict on the live ranks."""
    pair = {"train_batch_size": 40, "train_micro_batch_size_per_gpu": 8}
    assert checks.check_batch_pair("refused", "refused", pair, world_size=2)
    line = verdict(capsys)
    assert "refused the pair on 2 ranks" in line and "40 // 8 // 2 = 2" in line and "= 32 against 40" in line
    assert checks.check_batch_pair(" Refused ", "refused", pair, world_size=2)  # spelled loosely
    verdict(capsys)
    # One rank, or five: the pair agrees, and the steps are the answer.
    assert checks.check_batch_pair(5, 5, pair, world_size=1)
    assert "accepted the pair with 5 accumulation steps" in verdict(capsys)
    fails(capsys, checks.check_batch_pair("refused", 5, pair, world_size=1), "accepted 5 steps")
    fails(capsys, checks.check_batch_pair(4, 5, pair, world_size=1), "inferred 5")
    # The integer division taken for the answer, the exact quotient, another number.
    fails(capsys, checks.check_batch_pair(2, "refused", pair, world_size=2), "it does infer 2 steps",
          "rather than train another batch")
    fails(capsys, checks.check_batch_pair(2.5, "refused", pair, world_size=2), "whole micro batches")
    fails(capsys, checks.check_batch_pair(3, "refused", pair, world_size=2), "DeepSpeed refused")
    fails(capsys, checks.check_batch_pair(True, "refused", pair, world_size=2), "give a whole number")
    fails(capsys, checks.check_batch_pair("no", "refused", pair, world_size=2), "give a whole number")
    fails(capsys, checks.check_batch_pair(None, "refused", pair, world_size=2), "`predicted_steps` is not set")
    fails(capsys, checks.check_batch_pair("refused", None, pair, world_size=2), "not recorded on every rank")


def test_batch_pair_check_agrees_with_the_rule():
    """The check's arithmetic is `deepspeed_batch`'s, which the test below holds against DeepSpeed itself."""
    pair = {"train_batch_size": 40, "train_micro_batch_size_per_gpu": 8}
    for world_size in (1, 2, 4, 5, 8):
        try:
            said = checks.deepspeed_batch(pair, world_size)[2]
        except ValueError:
            said = "refused"
        assert (said == "refused") == (world_size not in (1, 5)), world_size


def test_deepspeed_batch_resolves_like_deepspeed(monkeypatch):
    """DeepSpeed's own config class on the same configs, 2 ranks (its rank query answered without a
    process group, so that it asks the world size of `mpu`)."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime.config import DeepSpeedConfig

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *args, **kwargs: 0)

    configs = [GOOD, {"train_batch_size": 48}, {"train_micro_batch_size_per_gpu": 8},
               {"train_batch_size": 48, "train_micro_batch_size_per_gpu": 8},
               {"train_batch_size": 50, "train_micro_batch_size_per_gpu": 8},
               {"train_batch_size": 48, "gradient_accumulation_steps": 5}, {"gradient_accumulation_steps": 2}]
    for config in configs:
        try:
            ours = checks.deepspeed_batch(config, 2)
        except ValueError:
            ours = None
        try:
            resolved = DeepSpeedConfig(dict(config), mpu=_WorldOf(2))
            theirs = (resolved.train_batch_size, resolved.train_micro_batch_size_per_gpu,
                      resolved.gradient_accumulation_steps)
        except AssertionError:
            theirs = None
        assert ours == theirs, config


class _WorldOf:
    """The data-parallel world size DeepSpeedConfig asks its `mpu` for, without a process group."""

    def __init__(self, world_size):
        self.world_size = world_size

    def get_data_parallel_world_size(self):
        return self.world_size

    def get_model_parallel_world_size(self):
        return 1


def test_batch_triple_check(capsys):
    def right(global_batch_size, world_size, max_micro_batch):
        if global_batch_size % world_size:
            raise ValueError("not a multiple of world_size")
        share = global_batch_size // world_size
        micro = max(m for m in range(1, min(share, max_micro_batch) + 1) if share % m == 0)
        return {"train_batch_size": global_batch_size, "train_micro_batch_size_per_gpu": micro,
                "gradient_accumulation_steps": share // micro}

    def first_guess(global_batch_size, world_size, max_micro_batch):  # the fewest windows that hold the share
        share = right(global_batch_size, world_size, 1)["gradient_accumulation_steps"]
        accumulation = -(-share // max_micro_batch)
        return {"train_batch_size": global_batch_size, "train_micro_batch_size_per_gpu": share // accumulation,
                "gradient_accumulation_steps": accumulation}

    assert checks.check_batch_triple(right)
    assert "all 7 cases" in verdict(capsys)
    assert checks.check_batch_triple(right, "accepted: 50 = 5 x 5 x 2")
    assert "DeepSpeed on the live ranks accepted" in verdict(capsys)
    # Unusual but right: NumPy integers, and the accumulation left for DeepSpeed to infer.
    def inferred(global_batch_size, world_size, max_micro_batch):
        config = right(global_batch_size, world_size, max_micro_batch)
        return {"train_batch_size": np.int64(global_batch_size),
                "train_micro_batch_size_per_gpu": np.int64(config["train_micro_batch_size_per_gpu"])}
    assert checks.check_batch_triple(inferred)
    verdict(capsys)
    # The first guess: a micro batch that does not divide a rank's share, which DeepSpeed refuses.
    fails(capsys, checks.check_batch_triple(first_guess), "100 on 4 ranks", "100 != micro batch 6 x accumulation 4",
          "divide each rank's share")
    # The largest micro batch whatever the share: accumulation 24 // 32 = 0 on the share of 24.
    fails(capsys, checks.check_batch_triple(lambda g, n, m: {"train_batch_size": g, "train_micro_batch_size_per_gpu": m,
                                                             "gradient_accumulation_steps": g // n // m}),
          "DeepSpeed would refuse")
    # Legal, but not the fewest accumulation steps: a micro batch of 1.
    fails(capsys, checks.check_batch_triple(lambda g, n, m: right(g, n, 1)), "the fewest", "a micro batch of 8 fits")
    # A micro batch that does not fit (no limit at all).
    fails(capsys, checks.check_batch_triple(lambda g, n, m: right(g, n, g)), "does not fit")
    # The global batch per rank in train_batch_size's place.
    fails(capsys, checks.check_batch_triple(lambda g, n, m: {**right(g, n, m), "train_batch_size": g // n}),
          "DeepSpeed would refuse")
    # An answer where none exists, and an error where one does.
    def rounded(global_batch_size, world_size, max_micro_batch):
        return right(global_batch_size - global_batch_size % world_size, world_size, max_micro_batch)
    fails(capsys, checks.check_batch_triple(rounded), "50 on 4 ranks", "raise ValueError")
    def refuses(global_batch_size, world_size, max_micro_batch):
        if (global_batch_size // world_size) % max_micro_batch:
            raise ValueError("does not divide")
        return right(global_batch_size, world_size, max_micro_batch)
    fails(capsys, checks.check_batch_triple(refuses), "raised ValueError", "5 x 5 x 4 makes it")
    fails(capsys, checks.check_batch_triple(lambda g, n, m: (g, m, g // n // m)), "return a dict")
    fails(capsys, checks.check_batch_triple(lambda g, n, m: 1 / 0), "ZeroDivisionError")
    # The live ranks: DeepSpeed's own refusal, or no verdict.
    fails(capsys, checks.check_batch_triple(right, "refused: Check batch related parameters."), "refused")
    fails(capsys, checks.check_batch_triple(right, None), "no verdict from DeepSpeed")
    fails(capsys, checks.check_batch_triple(untouched), "NotImplementedError")
    fails(capsys, checks.check_batch_triple(None), "`batch_triple` is not set")


def test_batch_triple_answer_is_what_deepspeed_accepts(monkeypatch):
    """Every triple the check wants passes DeepSpeed's own config class; the case without one fails it."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime.config import DeepSpeedConfig

    from scaledl.workshop.checks.lesson_08 import _TRIPLE_CASES

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *args, **kwargs: 0)
    for global_batch, world_size, largest in _TRIPLE_CASES:
        want = checks.batch_triple_answer(global_batch, world_size, largest)
        if want is None:
            with pytest.raises(AssertionError):
                DeepSpeedConfig({"train_batch_size": global_batch, "train_micro_batch_size_per_gpu": 1},
                                mpu=_WorldOf(world_size))
            continue
        resolved = DeepSpeedConfig(dict(want), mpu=_WorldOf(world_size))
        assert resolved.train_micro_batch_size_per_gpu <= largest


CNN = [6_000, 400, 200_000, 500, 1_000, 10]  # gradient sizes far under one bucket, as this lesson's CNN
MEASURED = {"all_reduces": 3, "bytes": 3 * 4 * sum(CNN), "ms": 1.0}  # a window of 3 at stage 2, from the ranks


def test_stage2_window_check(capsys):
    def one_backward(numels, bucket, full=lambda filled, n, bucket: filled + n > bucket, last=True):
        buckets, filled = [], 0
        for n in numels:
            if filled and full(filled, n, bucket):
                buckets, filled = buckets + [filled], 0
            filled += n
        return buckets + ([filled] if filled and last else [])

    def right(numels, accumulation_steps, reduce_bucket_size=500_000_000):
        buckets = [4 * n for n in one_backward(numels, reduce_bucket_size)]
        return {"buckets": buckets, "all_reduces": accumulation_steps * len(buckets),
                "bytes": accumulation_steps * sum(buckets)}

    def with_rule(rule, times=lambda a: a, nbytes=lambda numels, a: a * 4 * sum(numels), unit=4):
        """A window whose buckets come from `rule(numels, bucket)` (elements), its calls from their number."""
        def window(numels, accumulation_steps, reduce_bucket_size=500_000_000):
            buckets = [unit * n for n in rule(numels, reduce_bucket_size)]
            return {"buckets": buckets, "all_reduces": times(accumulation_steps) * len(buckets),
                    "bytes": nbytes(numels, accumulation_steps)}
        return window

    assert checks.check_stage2_window(right)
    assert "all 4 cases" in verdict(capsys)
    assert checks.check_stage2_window(right, MEASURED, CNN, world_size=2, accumulation_steps=3)
    assert "as the ranks measured" in verdict(capsys)
    # Unusual but right: numpy numbers, a tuple, the rule written with the bucket's room left.
    def numpy_window(numels, accumulation_steps, reduce_bucket_size=500_000_000):
        buckets = tuple(np.int64(4 * n) for n in one_backward(
            numels, reduce_bucket_size, full=lambda filled, n, bucket: n > bucket - filled))
        return {"buckets": buckets, "all_reduces": np.int64(accumulation_steps * len(buckets)),
                "bytes": np.int64(accumulation_steps * sum(buckets))}
    assert checks.check_stage2_window(numpy_window)
    verdict(capsys)
    # One bucket per backward, whatever the bucket size.
    fails(capsys, checks.check_stage2_window(with_rule(lambda numels, bucket: [sum(numels)])), "DeepSpeed sends")
    # Full buckets: the total cut into bucket-sized pieces.
    fails(capsys, checks.check_stage2_window(with_rule(lambda numels, bucket: [
        min(bucket, sum(numels) - k * bucket) for k in range(-(-sum(numels) // bucket))])), "DeepSpeed sends")
    fails(capsys, checks.check_stage2_window(with_rule(lambda numels, bucket: list(numels))), "one call per bucket")
    # A bucket sent once it is full (>=), and no send at the end of backward.
    fails(capsys, checks.check_stage2_window(with_rule(lambda numels, bucket: one_backward(
        numels, bucket, full=lambda filled, n, bucket: filled + n >= bucket))), "fills the bucket exactly")
    fails(capsys, checks.check_stage2_window(with_rule(lambda numels, bucket: one_backward(numels, bucket,
                                                                                        last=False))),
          "end of a backward")
    # Buckets in elements, not bytes.
    fails(capsys, checks.check_stage2_window(with_rule(one_backward, unit=1)), "those are elements")
    # One backward's calls (as stage 0's one call per window, in the first case), and one backward's bytes.
    fails(capsys, checks.check_stage2_window(with_rule(one_backward, times=lambda a: 1)), "every backward reduces")
    fails(capsys, checks.check_stage2_window(with_rule(one_backward, nbytes=lambda numels, a: 4 * sum(numels))),
          "one backward's bytes")
    fails(capsys, checks.check_stage2_window(with_rule(one_backward, nbytes=lambda numels, a: a * sum(numels))),
          "4 bytes")
    fails(capsys, checks.check_stage2_window(lambda numels, a, bucket=5e8: {"all_reduces": a, "bytes": 4 * a}),
          "three keys")
    fails(capsys, checks.check_stage2_window(lambda numels, a, bucket=5e8: {**right(numels, a, bucket),
                                                                           "buckets": "two"}), "list of numbers")
    # The live config's small bucket: this CNN in 2 buckets a backward, 6 calls a window on the ranks.  The
    # check asks for the live bucket size: at the default one bucket (3 calls) is predicted, and rejected.
    split = {**MEASURED, "all_reduces": 6}
    assert checks.check_stage2_window(right, split, CNN, world_size=2, accumulation_steps=3,
                                      reduce_bucket_size=204_800)
    assert "6 all-reduces" in verdict(capsys)
    fails(capsys, checks.check_stage2_window(right, split, CNN, world_size=2, accumulation_steps=3),
          "3 all-reduces, the ranks made 6", "one bucket")
    fails(capsys, checks.check_stage2_window(right, MEASURED, CNN, world_size=2, accumulation_steps=3,
                                             reduce_bucket_size=204_800), "6 all-reduces, the ranks made 3")
    # Right on the cases, wrong against the ranks (a measurement that is not this model's window).
    fails(capsys, checks.check_stage2_window(right, {**MEASURED, "bytes": 1}, CNN), "on this model")
    fails(capsys, checks.check_stage2_window(right, None, CNN), "no measurement")
    fails(capsys, checks.check_stage2_window(untouched), "NotImplementedError")
    fails(capsys, checks.check_stage2_window(None), "not set")


# The lesson's CNN: its gradients in the order backward hands them over (recorded with
# register_post_accumulate_grad_hook, torch 2.13): each Linear's bias before its weight, each Conv2d's weight
# before its bias; and what DeepSpeed 0.19.8's stage 2 all-reduced on 2 gloo ranks at reduce_bucket_size 204,800.
RECORDED = [10, 1_280, 128, 200_704, 4_608, 32, 144, 16]
SENT = [808_488, 19_200]
WINDOW = {"all_reduces": 6, "bytes": 3 * 4 * sum(RECORDED), "ms": 5.0}


def test_stage2_buckets_are_graded_bucket_by_bucket(capsys):
    def right(numels, accumulation_steps, reduce_bucket_size=500_000_000):
        buckets, filled = [], 0
        for n in numels:
            if filled + n > reduce_bucket_size:
                buckets, filled = buckets + [4 * filled], 0
            filled += n
        buckets += [4 * filled] if filled else []
        return {"buckets": buckets, "all_reduces": accumulation_steps * len(buckets),
                "bytes": accumulation_steps * sum(buckets)}

    assert checks.check_stage2_window(right, WINDOW, RECORDED, world_size=2, accumulation_steps=3,
                                      reduce_bucket_size=204_800, measured_buckets=SENT)
    assert "buckets of 808,488 + 19,200 bytes per backward" in verdict(capsys)
    # model.parameters() reversed puts the convolution's bias first: the same calls and total, other buckets.
    bias_first = [10, 1_280, 128, 200_704, 32, 4_608, 16, 144]
    assert right(bias_first, 3, 204_800)["all_reduces"] == WINDOW["all_reduces"]
    assert right(bias_first, 3, 204_800)["bytes"] == WINDOW["bytes"]
    fails(capsys, checks.check_stage2_window(right, WINDOW, bias_first, world_size=2, accumulation_steps=3,
                                             reduce_bucket_size=204_800, measured_buckets=SENT),
          "808,616 + 19,072", "the ranks all-reduced 808,488 + 19,200", "recorded order")
