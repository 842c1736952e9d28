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
    assert not checks.check_deepspeed_config(None, world_size=2)  # untouched: from_ranks said FAIL


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


def test_accumulation_plan_check(capsys):
    def right(micro_steps, accumulation_steps, zero_stage):
        steps = micro_steps // accumulation_steps
        return (micro_steps if zero_stage >= 2 else steps), steps

    assert checks.check_accumulation_plan(right)
    assert "PASS: all 5 cases" in verdict(capsys)
    assert checks.check_accumulation_plan(right, (6, 3, 0, 2, 2))
    assert "as the live ranks did (2 reducing backwards, 2 optimizer steps)" in verdict(capsys)
    fails(capsys, checks.check_accumulation_plan(right, (6, 3, 0, 6, 2)), "the live ranks did 6 and 2")
    fails(capsys, checks.check_accumulation_plan(None), "`plan` is not set")
    # Every micro step reduces, whatever the stage (no accumulation of the communication).
    fails(capsys, checks.check_accumulation_plan(lambda m, a, z: (m, m // a)), "only in a window's last backward")
    # Stage 2 treated like stage 0.
    fails(capsys, checks.check_accumulation_plan(lambda m, a, z: (m // a, m // a)), "from stage 2 on every backward")
    # Every step() counted as an optimizer step.
    fails(capsys, checks.check_accumulation_plan(lambda m, a, z: (m if z >= 2 else m // a, m)),
          "applies the optimizer only at a window's end")
    # An unfinished window counted as a step (rounding up).
    fails(capsys, checks.check_accumulation_plan(lambda m, a, z: (m if z >= 2 else -(-m // a), -(-m // a))),
          "a window left unfinished")
    # Unusual but right: a list of NumPy integers, the windows counted in a loop.
    def counted(micro_steps, accumulation_steps, zero_stage):
        steps = sum(1 for m in range(1, micro_steps + 1) if m % accumulation_steps == 0)
        return [np.int64(micro_steps if zero_stage > 1 else steps), np.int64(steps)]
    assert checks.check_accumulation_plan(counted)
    verdict(capsys)


CNN = [6_000, 400, 200_000, 500, 1_000, 10]  # gradient sizes far under one bucket, as this lesson's CNN
MEASURED = {"all_reduces": 3, "bytes": 3 * 4 * sum(CNN), "ms": 1.0}  # a window of 3 at stage 2, from the ranks


def test_stage2_window_check(capsys):
    def right(numels, accumulation_steps, reduce_bucket_size=500_000_000):
        calls, filled = 0, 0
        for n in numels:
            if filled + n > reduce_bucket_size:
                calls, filled = calls + 1, 0
            filled += n
        return {"all_reduces": accumulation_steps * (calls + (filled > 0)),
                "bytes": accumulation_steps * 4 * sum(numels)}

    def with_rule(rule, times=lambda a: a, nbytes=lambda numels, a: a * 4 * sum(numels)):
        def window(numels, accumulation_steps, reduce_bucket_size=500_000_000):
            return {"all_reduces": times(accumulation_steps) * rule(numels, reduce_bucket_size),
                    "bytes": nbytes(numels, accumulation_steps)}
        return window

    def greedy(numels, bucket, full=lambda filled, n, bucket: filled + n > bucket, last=1):
        calls, filled = 0, 0
        for n in numels:
            if filled and full(filled, n, bucket):
                calls, filled = calls + 1, 0
            filled += n
        return calls + (last if filled else 0)

    assert checks.check_stage2_window(right)
    assert "all 4 cases" in verdict(capsys)
    assert checks.check_stage2_window(right, MEASURED, CNN, world_size=2, accumulation_steps=3)
    assert "as the ranks measured" in verdict(capsys)
    # Unusual but right: numpy numbers, the rule written with the bucket's room left.
    assert checks.check_stage2_window(with_rule(lambda numels, bucket: np.int64(greedy(
        numels, bucket, full=lambda filled, n, bucket: n > bucket - filled)), nbytes=lambda numels, a: np.int64(
        a * 4 * sum(numels))))
    verdict(capsys)
    # Stage 0's count: one call per window.
    fails(capsys, checks.check_stage2_window(with_rule(lambda numels, bucket: 1, times=lambda a: 1)), "stages 0 and 1")
    # One call per backward, whatever the bucket.
    fails(capsys, checks.check_stage2_window(with_rule(lambda numels, bucket: 1)), "fills several buckets")
    # The buckets counted as if full: the total over the bucket size, rounded up.
    fails(capsys, checks.check_stage2_window(with_rule(lambda numels, bucket: -(-sum(numels) // bucket))),
          "buckets are not full")
    fails(capsys, checks.check_stage2_window(with_rule(lambda numels, bucket: len(numels))), "not per gradient")
    # A bucket sent once it is full (>=), and no send at the end of backward.
    fails(capsys, checks.check_stage2_window(with_rule(lambda numels, bucket: greedy(
        numels, bucket, full=lambda filled, n, bucket: filled + n >= bucket))), "fills the bucket exactly")
    fails(capsys, checks.check_stage2_window(with_rule(lambda numels, bucket: greedy(numels, bucket, last=0))),
          "end of a backward")
    # One backward's calls, and one backward's bytes.
    fails(capsys, checks.check_stage2_window(with_rule(greedy, times=lambda a: 1)), "stages 0 and 1")
    fails(capsys, checks.check_stage2_window(with_rule(greedy, nbytes=lambda numels, a: 4 * sum(numels))),
          "one backward's bytes")
    fails(capsys, checks.check_stage2_window(with_rule(greedy, nbytes=lambda numels, a: a * sum(numels))),
          "4 bytes")
    fails(capsys, checks.check_stage2_window(lambda numels, a, bucket=5e8: (a, a * 4 * sum(numels))), "two keys")
    # Right on the cases, wrong against the ranks (a measurement that is not this model's window).
    fails(capsys, checks.check_stage2_window(right, {**MEASURED, "bytes": 1}, CNN), "on this model")
    fails(capsys, checks.check_stage2_window(right, None, CNN), "no measurement")
    fails(capsys, checks.check_stage2_window(untouched), "NotImplementedError")
    fails(capsys, checks.check_stage2_window(None), "not set")
