"""Lesson 7's checks (efficiency, warm-up, predicted efficiency): each passes the solution, FAILs on what an
untouched exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one
line."""
import math

import numpy as np

from conftest import fails, untouched, verdict
from scaledl import schedule
from scaledl.workshop import checks
from test_lesson_03 import ring


# ---------------------------------------------------------------- scaling

def test_efficiency_check(capsys):
    rates = {1: 1000.0, 2: 1700.0, 4: 3000.0}

    def right(r):
        base = min(r)
        return {n: v / (n * r[base] / base) for n, v in r.items()}

    assert checks.check_efficiency(right, rates)
    assert "baseline of 2 ranks" in verdict(capsys)
    # Unusual but right: a measurement that starts at 2 ranks, and numpy numbers back.
    assert checks.check_efficiency(lambda r: {n: np.float64(e) for n, e in right(r).items()}, {2: 1800.0, 4: 3000.0})
    verdict(capsys)
    # The baseline hard-coded as 1 rank: a KeyError on the hidden measurement.
    fails(capsys, checks.check_efficiency(lambda r: {n: v / (n * r[1]) for n, v in r.items()}, rates),
          "baseline of 2 ranks", "KeyError", "not always 1")
    # The baseline's rate not divided by its ranks: right when the baseline is 1, wrong from 2.
    fails(capsys, checks.check_efficiency(lambda r: {n: v / (n * r[min(r)]) for n, v in r.items()}, rates),
          "baseline 2 ranks", "divide them by 2")
    fails(capsys, checks.check_efficiency(lambda r: {n: v / r[min(r)] for n, v in r.items()}, rates),
          "is the speed-up")
    fails(capsys, checks.check_efficiency(lambda r: {n: 1 / e for n, e in right(r).items()}, rates), "upside down")
    fails(capsys, checks.check_efficiency(lambda r: {n: e for n, e in right(r).items() if n > 1}, rates),
          "no efficiency for world_size 1")
    fails(capsys, checks.check_efficiency(untouched, rates), "NotImplementedError")
    fails(capsys, checks.check_efficiency(None, rates), "not set")


def test_warmup_check(capsys):
    def solution(step, lr, global_batch_size, base_batch_size, warmup_steps):
        return schedule.lr_at(step, lr=lr, global_batch_size=global_batch_size, base_batch_size=base_batch_size,
                              scale_lr=True, warmup_steps=warmup_steps)

    def interpolated(step, lr, global_batch_size, base_batch_size, warmup_steps):  # unusual but right
        target = lr * global_batch_size / base_batch_size
        return float(np.interp(step, [0, warmup_steps], [min(lr, target), target])) if warmup_steps else target

    def ramps_down(step, lr, global_batch_size, base_batch_size, warmup_steps):  # from lr even when k < 1
        target = lr * global_batch_size / base_batch_size
        return target if step >= warmup_steps else lr + (target - lr) * step / warmup_steps

    def divides_first(step, lr, global_batch_size, base_batch_size, warmup_steps):
        target = lr * global_batch_size / base_batch_size
        start = min(lr, target)
        return start + (target - start) * min(1.0, step / warmup_steps)

    def zero_means_unscaled(step, lr, global_batch_size, base_batch_size, warmup_steps):
        if warmup_steps == 0:
            return lr
        return ramps_down(step, lr, global_batch_size, base_batch_size, warmup_steps)

    def no_warmup(step, lr, global_batch_size, base_batch_size, warmup_steps):
        return lr * global_batch_size / base_batch_size

    def not_scaled(step, lr, global_batch_size, base_batch_size, warmup_steps):
        return lr * min(1.0, step / warmup_steps) if step < warmup_steps else lr

    def square_root(step, lr, global_batch_size, base_batch_size, warmup_steps):
        target = lr * math.sqrt(global_batch_size / base_batch_size)
        return target if step >= warmup_steps else lr + (target - lr) * step / warmup_steps

    def from_zero(step, lr, global_batch_size, base_batch_size, warmup_steps):
        target = lr * global_batch_size / base_batch_size
        return target * min(1.0, step / warmup_steps)

    def one_step_ahead(step, lr, global_batch_size, base_batch_size, warmup_steps):
        target = lr * global_batch_size / base_batch_size
        return target if step >= warmup_steps else lr + (target - lr) * (step + 1) / warmup_steps

    def integer_factor(step, lr, global_batch_size, base_batch_size, warmup_steps):
        target = lr * (global_batch_size // base_batch_size)
        return target if step >= warmup_steps else lr + (target - lr) * step / warmup_steps

    assert checks.check_warmup(solution)
    verdict(capsys)
    assert checks.check_warmup(interpolated)
    verdict(capsys)
    fails(capsys, checks.check_warmup(no_warmup), "no warm-up")
    fails(capsys, checks.check_warmup(square_root), "square-root scaling")
    fails(capsys, checks.check_warmup(from_zero), "not at 0")
    fails(capsys, checks.check_warmup(not_scaled), "never grows with the batch")
    fails(capsys, checks.check_warmup(one_step_ahead), "one step off")
    fails(capsys, checks.check_warmup(integer_factor), "96 / 64 is 1.5", "integer division")
    fails(capsys, checks.check_warmup(divides_first), "ZeroDivisionError", "warm-up of 0 steps", "means none")
    fails(capsys, checks.check_warmup(zero_means_unscaled), "warm-up 0 steps", "means none")
    fails(capsys, checks.check_warmup(ramps_down), "global batch 16", "never starts above its target")
    fails(capsys, checks.check_warmup(untouched), "NotImplementedError")



def test_predicted_efficiency_check(capsys):
    def solution(step_s, grad_bytes, ranks, alpha, bandwidth, strong=False):
        comm = ring(grad_bytes, ranks, alpha, bandwidth)
        compute = step_s / ranks if strong else step_s
        return compute / (compute + comm)

    def from_samples(step_s, grad_bytes, ranks, alpha, bandwidth, strong=False):  # unusual, right: throughputs
        comm = ring(grad_bytes, ranks, alpha, bandwidth)
        one = 1 / step_s  # batches a second on one rank
        many = 1 / (step_s / ranks + comm) if strong else ranks / (step_s + comm)
        return np.float64(many / (ranks * one))

    def speed_up(step_s, grad_bytes, ranks, alpha, bandwidth, strong=False):
        return ranks * solution(step_s, grad_bytes, ranks, alpha, bandwidth, strong)

    def upside_down(step_s, grad_bytes, ranks, alpha, bandwidth, strong=False):
        return 1 / solution(step_s, grad_bytes, ranks, alpha, bandwidth, strong)

    def hidden(step_s, grad_bytes, ranks, alpha, bandwidth, strong=False):
        return 1.0

    def one_minus(step_s, grad_bytes, ranks, alpha, bandwidth, strong=False):
        compute = step_s / ranks if strong else step_s
        return 1 - ring(grad_bytes, ranks, alpha, bandwidth) / compute

    def strong_as_weak(step_s, grad_bytes, ranks, alpha, bandwidth, strong=False):
        return solution(step_s, grad_bytes, ranks, alpha, bandwidth)

    def strong_comm_shared_too(step_s, grad_bytes, ranks, alpha, bandwidth, strong=False):
        share = ranks if strong else 1
        comm = ring(grad_bytes, ranks, alpha, bandwidth) / share
        return (step_s / share) / (step_s / share + comm)

    def one_way_ring(step_s, grad_bytes, ranks, alpha, bandwidth, strong=False):
        compute = step_s / ranks if strong else step_s
        return compute / (compute + (ranks - 1) * alpha + (ranks - 1) / ranks * grad_bytes / bandwidth)

    def all_bytes_twice(step_s, grad_bytes, ranks, alpha, bandwidth, strong=False):
        compute = step_s / ranks if strong else step_s
        return compute / (compute + 2 * (ranks - 1) * alpha + 2 * grad_bytes / bandwidth)

    assert checks.check_predicted_efficiency(solution)
    verdict(capsys)
    assert checks.check_predicted_efficiency(from_samples)
    verdict(capsys)
    fails(capsys, checks.check_predicted_efficiency(speed_up), "speed-up")
    fails(capsys, checks.check_predicted_efficiency(upside_down), "upside down")
    fails(capsys, checks.check_predicted_efficiency(hidden), "nothing hides")
    fails(capsys, checks.check_predicted_efficiency(one_minus), "not 1 minus")
    fails(capsys, checks.check_predicted_efficiency(strong_as_weak), "strong scaling", "compute shrinks")
    fails(capsys, checks.check_predicted_efficiency(strong_comm_shared_too), "strong scaling", "does not")
    fails(capsys, checks.check_predicted_efficiency(one_way_ring), "goes round twice")
    fails(capsys, checks.check_predicted_efficiency(all_bytes_twice), "2(N-1)/N of the bytes")
    fails(capsys, checks.check_predicted_efficiency(untouched), "NotImplementedError")
    fails(capsys, checks.check_predicted_efficiency(None), "not set")
