"""Lesson 7's checks: scaling efficiency, the learning-rate warm-up, and the efficiency a communication model
predicts."""
from __future__ import annotations

import math

from scaledl.workshop.checks.common import _attempt, _FAILED, _unfinished, _verdict

# A second measurement the learner never sees: its baseline is 2 ranks, not 1, and its world
# sizes are not all powers of two, so a formula that divides by the 1-rank rate, or by N where it
# should divide by N / baseline, gives other numbers than the right one.
_EFFICIENCY_HIDDEN = {2: 1900.0, 3: 2700.0, 6: 4800.0, 8: 6100.0}


def check_efficiency(efficiency, samples_per_s: dict, mode: str = "weak") -> bool:
    """`efficiency(samples_per_s: {world_size: samples/s}) -> {world_size: efficiency}`:
    samples/s on N ranks over N times the baseline's samples/s per rank, the baseline being the
    smallest world size measured (weak and strong alike).  Checked on `samples_per_s` and on a
    measurement whose baseline is 2 ranks."""
    if efficiency is None:
        return _unfinished("efficiency")
    for rates in (dict(samples_per_s), dict(_EFFICIENCY_HIDDEN)):
        base_n = min(rates)
        per_rank = rates[base_n] / base_n
        try:
            got = efficiency(dict(rates))
        except NotImplementedError:
            return _verdict(False, "efficiency still raises NotImplementedError: finish the exercise cell")
        except Exception as error:  # a learner's error, in one line
            where = f"for {rates}" if base_n == 1 else f"for a baseline of {base_n} ranks, {rates}"
            return _verdict(False, f"efficiency {where} raised {type(error).__name__}: "
                                   f"{(str(error).splitlines() or [''])[0]}: the baseline is the smallest world size "
                                   "measured, not always 1")
        for n, rate in sorted(rates.items()):
            want = rate / (n * per_rank)
            value = got.get(n) if isinstance(got, dict) else None
            if value is None:
                return _verdict(False, f"no efficiency for world_size {n}: return one for every world size measured")
            if math.isclose(value, want, rel_tol=1e-6):
                continue
            where = f"world_size {n}" + (f" (baseline {base_n} ranks)" if base_n != 1 else "")
            if n != base_n and math.isclose(value, rate / rates[base_n], rel_tol=1e-6):
                return _verdict(False, f"{where}: {value:.3g} is the speed-up over the baseline: divide it by the "
                                       "world size, relative to the baseline's")
            if value and math.isclose(value, 1 / want, rel_tol=1e-6):
                return _verdict(False, f"{where}: {value:.3g} is upside down: measured over ideal, not ideal over "
                                       "measured")
            if base_n != 1 and math.isclose(value, rate / (n * rates[base_n]), rel_tol=1e-6):
                return _verdict(False, f"{where}: {value:.3g}, expected {want:.3g}: the baseline's samples/s come from "
                                       f"{base_n} ranks: divide them by {base_n} for one rank's share")
            return _verdict(False, f"{where}: {value:.3g}, expected {want:.3g}: samples/s on N ranks over "
                                   "N times the samples/s per rank of the baseline")
    return _verdict(True, "efficiency = samples/s on N ranks / (N x samples/s per rank of the baseline) at every "
                          "world size, also for a baseline of 2 ranks")


def check_warmup(lr_at, lr: float = 0.1, base_batch_size: int = 64, warmup_steps: int = 100) -> bool:
    """`lr_at(step, lr, global_batch_size, base_batch_size, warmup_steps)`: the linear scaling
    rule with a linear warm-up from the unscaled lr (Goyal et al., 2017; scaledl.schedule).

    Checked on a batch the base does not divide (k = 1.5, where integer division gives 1), on a
    batch equal to the base (k = 1: nothing to ramp), and on a warm-up of 7 steps, where a ramp
    one step ahead or behind is off by 1/7 of the way.  Then two edge cases: no warm-up at all
    (warmup_steps = 0, `--warmup-epochs 0`: the scaled lr from step 0, no division by zero), and a
    global batch smaller than the base (k = 1/4), where the scaled lr is below lr and the rungs'
    schedule starts at the lower of the two (`scaledl.schedule.lr_at`): a warm-up never starts
    above its target."""
    from scaledl import schedule

    if lr_at is None:
        return _unfinished("lr_at")
    cases = [(global_batch_size, warmup, step)
             for global_batch_size, warmup in ((256, warmup_steps), (96, 7), (base_batch_size, warmup_steps))
             for step in (5 * warmup, warmup, 0, warmup // 2, warmup - 1)]  # the target first, then the ramp
    cases += [(256, 0, 0), (256, 0, 5),  # no warm-up: the scaled lr from the first step
              (base_batch_size // 4, 7, 0), (base_batch_size // 4, 7, 3), (base_batch_size // 4, 7, 7)]  # k < 1
    for global_batch_size, warmup, step in cases:
        def expected(at: int, batch: float = global_batch_size) -> float:
            return schedule.lr_at(at, lr=lr, global_batch_size=batch, base_batch_size=base_batch_size,
                                  scale_lr=True, warmup_steps=warmup)

        want = expected(step)
        try:
            got = lr_at(step, lr, global_batch_size, base_batch_size, warmup)
        except NotImplementedError:
            return _verdict(False, "lr_at still raises NotImplementedError: finish the exercise cell")
        except Exception as error:  # a learner's error, in one line
            fix = (": a warm-up of 0 steps (--warmup-epochs 0) means none: the scaled lr from step 0"
                   if warmup == 0 and isinstance(error, ZeroDivisionError) else "")
            return _verdict(False, f"lr_at({step}, {lr}, {global_batch_size}, {base_batch_size}, {warmup}) raised "
                                   f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}{fix}")
        if isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=1e-6):
            continue
        if not isinstance(got, (int, float)):
            return _verdict(False, f"lr_at returned {got!r}: return the learning rate, a number")
        k = global_batch_size / base_batch_size
        integer_k = global_batch_size // base_batch_size
        if k < 1 and step < warmup and math.isclose(got, lr + (lr * k - lr) * step / warmup):
            hint = (f"the global batch is smaller than the base batch, so the scaled lr ({lr * k:.4g}) is below "
                    f"lr: a warm-up keeps the first steps low and never starts above its target: start at the "
                    "lower of the two")
        elif warmup == 0 and math.isclose(got, lr) and k != 1:
            hint = "a warm-up of 0 steps (--warmup-epochs 0) means none: the scaled lr from step 0"
        elif integer_k != k and math.isclose(got, expected(step, integer_k * base_batch_size)):
            hint = f"{global_batch_size} / {base_batch_size} is {k:g}: integer division dropped the fraction"
        elif step >= warmup and math.isclose(got, lr * math.sqrt(k)):
            hint = "that is square-root scaling: the linear rule multiplies lr by global / base batch"
        elif step >= warmup and k != 1 and math.isclose(got, lr):
            hint = "lr never grows with the batch: multiply it by global_batch_size / base_batch_size"
        elif step < warmup and math.isclose(got, lr * k):
            hint = "no warm-up: ramp linearly from lr to the scaled lr over warmup_steps"
        elif step == 0 and math.isclose(got, 0):
            hint = "the ramp starts at the unscaled lr, not at 0 (Goyal et al.)"
        elif any(math.isclose(got, expected(step + shift)) for shift in (1, -1)):
            hint = "the ramp is one step off: step 0 has the unscaled lr, and step warmup_steps the first full one"
        else:
            hint = "a straight line from lr at step 0 to the scaled lr at step warmup_steps, then the scaled lr"
        return _verdict(False, f"global batch {global_batch_size}, warm-up {warmup} steps, step {step}: "
                               f"lr {got:.4g}, expected {want:.4g}: {hint}")
    return _verdict(True, "lr ramps linearly from the base lr up to lr x global/base batch, then stays there (at "
                          "once with a warm-up of 0 steps; never above the target when the batch is below the base)")


# (1-rank step, gradient bytes, ranks, alpha, bandwidth, strong): this lesson's CPU link and 2 ranks; a
# Polaris-like link over 8 ranks, where the ring's latencies weigh most; a large model, where its
# bytes do; strong scaling on 4 and 2 ranks, where each rank's compute shrinks and the all-reduce
# does not; one rank, which communicates nothing, weak and strong.
_EFFICIENCY_CASES = [(0.0138, 827_688, 2, 488e-6, 1.36e9, False),
                     (0.002, 827_688, 8, 10e-6, 50e9, False),
                     (0.05, 400e6, 16, 20e-6, 25e9, False),
                     (0.024, 827_688, 4, 100e-6, 2e9, True),
                     (0.02, 4e6, 2, 50e-6, 10e9, True),
                     (0.01, 827_688, 1, 488e-6, 1.36e9, False),
                     (0.01, 827_688, 1, 488e-6, 1.36e9, True)]


def check_predicted_efficiency(predicted_efficiency) -> bool:
    """`predicted_efficiency(step_s, grad_bytes, ranks, alpha_s, bandwidth_Bps, strong_scaling=False)`: the
    efficiency the communication model predicts for a model whose gradients fit in one DDP bucket
    (all-reduced when backward ends, so none of it hides): a rank's step is its compute plus a ring
    all-reduce of the gradients, 2(N-1) alpha + 2(N-1)/N n / bandwidth (scaledl.perf.predict's `ddp`
    row for such a model).  The compute is the 1-rank step under weak scaling, and 1/N of it under
    strong scaling, where the 1-rank step is the whole global batch's; efficiency = the compute / the step."""
    from scaledl.perf import predict

    if predicted_efficiency is None:
        return _unfinished("predicted_efficiency")
    for step_s, grad_bytes, ranks, alpha, bandwidth, strong in _EFFICIENCY_CASES:
        link = predict.Link(alpha, bandwidth)
        comm = predict.allreduce_s(grad_bytes, ranks, link)
        compute = step_s / ranks if strong else step_s
        want = compute / (compute + comm)
        case = (f"{'strong' if strong else 'weak'} scaling, 1-rank step {step_s * 1e3:g} ms, {grad_bytes / 1e6:g} "
                f"MB of gradients, {ranks} ranks, alpha {alpha * 1e6:g} us, {bandwidth / 1e9:g} GB/s")
        got = _attempt("predicted_efficiency", case,  # the 6th argument: strong scaling?
                       lambda: float(predicted_efficiency(step_s, grad_bytes, ranks, alpha, bandwidth, strong)))
        if got is _FAILED:
            return False
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        one_way = (ranks - 1) * alpha + (ranks - 1) / ranks * grad_bytes / bandwidth
        whole_bytes = 2 * (ranks - 1) * alpha + 2 * grad_bytes / bandwidth
        wrong = [(ranks * want, "that is the speed-up over one rank: efficiency divides it by the ranks"),
                 (1 / want, "upside down: the compute over the whole step, not the step over the compute"),
                 (1.0, "nothing hides here: the one bucket is all-reduced after backward ends (lesson 6)"),
                 (1 - comm / compute, "efficiency is the compute over the compute plus the all-reduce, not 1 minus "
                                      "their ratio"),
                 (step_s / (step_s + comm), "under strong scaling each rank computes 1/N of the global batch: its "
                                            "compute shrinks, the all-reduce of the whole model's gradients does not"),
                 (compute / (compute + one_way), "a ring all-reduce goes round twice (reduce-scatter, then "
                                                 "all-gather): 2(N-1) latencies and 2(N-1)/N of the bytes"),
                 (compute / (compute + whole_bytes), "each rank sends 2(N-1)/N of the bytes, not twice all of them")]
        hint = next((text for value, text in wrong if not math.isclose(value, want, rel_tol=1e-6)
                     and math.isclose(got, value, rel_tol=1e-6)),
                    "the compute over the compute plus a ring all-reduce of every gradient, "
                    "2(N-1) alpha + 2(N-1)/N n / bandwidth")
        return _verdict(False, f"{case}: {got:.4g}, expected {want:.4g}: {hint}")
    return _verdict(True, "weak and strong: the compute over the compute plus a ring all-reduce of every gradient, "
                          "none of it hidden")
