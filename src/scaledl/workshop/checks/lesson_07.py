"""Lesson 7's checks: scaling efficiency, the learning-rate warm-up, and the communication left exposed."""
from __future__ import annotations

import math

from scaledl.workshop.checks.common import _unfinished, _verdict

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
    one step ahead or behind is off by 1/7 of the way."""
    from scaledl import schedule

    if lr_at is None:
        return _unfinished("lr_at")
    cases = [(global_batch_size, warmup, step)
             for global_batch_size, warmup in ((256, warmup_steps), (96, 7), (base_batch_size, warmup_steps))
             for step in (5 * warmup, warmup, 0, warmup // 2, warmup - 1)]  # the target first, then the ramp
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
            return _verdict(False, f"lr_at({step}, {lr}, {global_batch_size}, {base_batch_size}, {warmup}) raised "
                                   f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}")
        if isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=1e-6):
            continue
        if not isinstance(got, (int, float)):
            return _verdict(False, f"lr_at returned {got!r}: return the learning rate, a number")
        k = global_batch_size / base_batch_size
        integer_k = global_batch_size // base_batch_size
        if integer_k != k and math.isclose(got, expected(step, integer_k * base_batch_size)):
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
    return _verdict(True, "lr ramps linearly from the base lr to lr x global/base batch, then stays there")


MIB = 2**20
# (buckets in launch order, ranks, alpha, bandwidth, backward): a long backward (only the last bucket
# shows), a short one (the overflow shows), buckets of unequal size (first and last differ), one
# bucket, one rank.
_EXPOSED_CASES = [([25 * MIB, 25 * MIB, 10 * MIB], 4, 10e-6, 10e9, 0.2),
                  ([25 * MIB, 25 * MIB, 10 * MIB], 4, 10e-6, 10e9, 0.004),
                  ([1 * MIB, 24 * MIB], 8, 50e-6, 5e9, 0.003),
                  ([100 * MIB], 16, 20e-6, 25e9, 0.05),
                  ([25 * MIB, 5 * MIB], 1, 10e-6, 10e9, 0.01)]


def check_exposed(exposed_s) -> bool:
    """`exposed_s(buckets, ranks, alpha_s, bandwidth_Bps, backward_s)`: the seconds of DDP's
    bucketed all-reduce that backward does not hide (scaledl.perf.predict.bucketed_s with overlap):
    each bucket a ring all-reduce, one after another; the last starts when backward ends, so it is
    always exposed, and what did not fit under backward is too."""
    from scaledl.perf import predict

    if exposed_s is None:
        return _unfinished("exposed_s")
    for buckets, ranks, alpha, bandwidth, backward in _EXPOSED_CASES:
        link = predict.Link(alpha, bandwidth)
        each = [predict.allreduce_s(b, ranks, link) for b in buckets]
        want = predict.bucketed_s(buckets, ranks, link, backward, overlap=True)
        case = (f"buckets of {', '.join(f'{b / MIB:g}' for b in buckets)} MiB on {ranks} ranks, alpha "
                f"{alpha * 1e6:g} us, {bandwidth / 1e9:g} GB/s, backward {backward * 1e3:g} ms")
        try:
            got = float(exposed_s(list(buckets), ranks, alpha, bandwidth, backward))
        except NotImplementedError:
            return _verdict(False, "exposed_s still raises NotImplementedError: finish the exercise cell")
        except Exception as error:
            return _verdict(False, f"{case}: exposed_s raised {type(error).__name__}: "
                                   f"{(str(error).splitlines() or [''])[0]}")
        if math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12):
            continue
        total = sum(each)
        if ranks > 1 and math.isclose(got, total, rel_tol=1e-6):
            hint = "that is every bucket's time: the buckets before the last run while backward still computes"
        elif math.isclose(got, each[-1], rel_tol=1e-6):
            hint = "only the last bucket: when backward is short, what did not fit under it is exposed too"
        elif any(math.isclose(got, v, rel_tol=1e-6, abs_tol=1e-12)
                 for v in (total - backward, max(0.0, total - backward))):
            hint = "total minus backward can be below the last bucket, which starts only when backward ends"
        elif len(each) > 1 and math.isclose(got, max(each[0], total - backward), rel_tol=1e-6):
            hint = "the buckets are in launch order: the last one in the list goes when backward ends"
        elif ranks == 1:
            hint = "one rank has nothing to all-reduce"
        else:
            hint = "each bucket is a ring all-reduce, 2(N-1) alpha + 2(N-1)/N n / bandwidth, one after another"
        return _verdict(False, f"{case}: {got * 1e3:.4g} ms, expected {want * 1e3:.4g} ms: {hint}")
    return _verdict(True, "the last bucket, or what did not fit under backward, whichever is longer")
