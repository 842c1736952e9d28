"""Lesson 2's checks (the stopwatch, a step from its FLOPs): each passes the solution, FAILs on what an untouched
exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one line."""
import math

import pytest

from conftest import fails, untouched, verdict
from scaledl.workshop import checks
from scaledl.workshop.checks import lesson_02


# ---------------------------------------------------------------- lesson 2

def honest(step, batch_size, synchronize, num_steps=20, warmup_steps=3):
    """The lesson's solution: the losses kept, and read once the clock is read."""
    import time

    for _ in range(warmup_steps):
        step()
    synchronize()
    start = time.perf_counter()
    losses = [step() for _ in range(num_steps)]
    synchronize()
    seconds = time.perf_counter() - start
    return num_steps * batch_size / seconds, sum(loss.item() for loss in losses) / num_steps


def accumulated_on_the_device(step, batch_size, synchronize, num_steps=20, warmup_steps=3):
    """Unusual but right: the losses summed as they come (on the device, as the rungs' metrics do), one read."""
    import time

    for _ in range(warmup_steps):
        step()
    synchronize()
    start, total = time.perf_counter(), 0
    for _ in range(num_steps):
        total = total + step()
    mean = (total / num_steps).item()  # waits for the last step: a synchronize in all but name
    return num_steps * batch_size / (time.perf_counter() - start), mean


def item_every_step(step, batch_size, synchronize, num_steps=20, warmup_steps=3):
    import time

    for _ in range(warmup_steps):
        step()
    synchronize()
    start, total = time.perf_counter(), 0.0
    for _ in range(num_steps):
        total += step().item()  # waits for the device every step
    synchronize()
    return num_steps * batch_size / (time.perf_counter() - start), total / num_steps


def synchronized_every_step(step, batch_size, synchronize, num_steps=20, warmup_steps=3):
    """A wall clock, the device waited for after every step, the mean step time."""
    import time

    for _ in range(warmup_steps):
        step()
    synchronize()
    times, losses = [], []
    for _ in range(num_steps):
        started = time.time()
        losses.append(step())
        synchronize()
        times.append(time.time() - started)
    return batch_size / (sum(times) / len(times)), sum(loss.item() for loss in losses) / num_steps


def no_synchronize(step, batch_size, synchronize, num_steps=20, warmup_steps=3):
    import time

    for _ in range(warmup_steps):
        step()
    start = time.perf_counter()
    losses = [step() for _ in range(num_steps)]
    rate = num_steps * batch_size / (time.perf_counter() - start)  # reads the clock while the device works
    return rate, sum(loss.item() for loss in losses) / num_steps


def warmup_timed(step, batch_size, synchronize, num_steps=20, warmup_steps=3):
    import time

    synchronize()
    start = time.perf_counter()
    losses = [step() for _ in range(warmup_steps + num_steps)]
    synchronize()
    rate = (warmup_steps + num_steps) * batch_size / (time.perf_counter() - start)
    return rate, sum(loss.item() for loss in losses[warmup_steps:]) / num_steps


def counted(extra_steps: int = 0, returns=None, loss_of=None):
    """The solution with one thing changed: samples of num_steps + extra_steps counted, or what is returned."""
    def samples_per_s(step, batch_size, synchronize, num_steps=20, warmup_steps=3):
        import time

        warm = [step() for _ in range(warmup_steps)]
        synchronize()
        start = time.perf_counter()
        losses = [step() for _ in range(num_steps)]
        synchronize()
        seconds = time.perf_counter() - start
        rate = (num_steps + extra_steps) * batch_size / seconds
        loss = loss_of(warm, losses) if loss_of else sum(loss.item() for loss in losses) / num_steps
        return returns(rate, seconds, loss) if returns else (rate, loss)
    return samples_per_s


@pytest.mark.serial  # the simulated device runs in real seconds: a busy core beside it blurs the 10% tolerance
def test_samples_per_s_on_a_simulated_device(capsys):
    assert checks.check_samples_per_s(honest)
    assert "losses read without stopping the host" in verdict(capsys)
    assert checks.check_samples_per_s(accumulated_on_the_device)
    verdict(capsys)
    fails(capsys, checks.check_samples_per_s(item_every_step), "waited for the device 4 times", "read them after")
    fails(capsys, checks.check_samples_per_s(synchronized_every_step), "waited for the device")
    fails(capsys, checks.check_samples_per_s(no_synchronize), "synchronize before reading it")
    fails(capsys, checks.check_samples_per_s(warmup_timed), "slow first steps are in the timing")
    fails(capsys, checks.check_samples_per_s(counted(1)), "one step off")
    fails(capsys, checks.check_samples_per_s(counted(-1)), "one step off")
    fails(capsys, checks.check_samples_per_s(counted(returns=lambda rate, seconds, loss: (seconds, loss))),
          "looks like seconds")
    fails(capsys, checks.check_samples_per_s(counted(returns=lambda rate, seconds, loss: rate)), "two numbers")
    fails(capsys, checks.check_samples_per_s(counted(returns=lambda rate, seconds, loss: (loss, rate))),
          "samples per second first")
    fails(capsys, checks.check_samples_per_s(counted(loss_of=lambda warm, timed: sum(
        loss.item() for loss in warm + timed) / len(warm + timed))), "warm-up steps' losses")
    fails(capsys, checks.check_samples_per_s(counted(loss_of=lambda warm, timed: timed[-1].item())),
          "last step's loss")
    fails(capsys, checks.check_samples_per_s(counted(loss_of=lambda warm, timed: sum(timed).mean())),
          "raised AttributeError", ".item()")
    fails(capsys, checks.check_samples_per_s(lambda step, *args, **kwargs: [step() for _ in range(40)] and (1e4, 1.0)),
          "it ran 40 steps")
    fails(capsys, checks.check_samples_per_s(untouched), "NotImplementedError")
    fails(capsys, checks.check_samples_per_s(None), "not set")


@pytest.mark.serial  # real seconds
def test_simulated_device_queues_work_until_synchronized():
    import time

    device = checks.SimulatedDevice(step_s=0.02, warmup_steps=0)
    start = time.perf_counter()
    for _ in range(5):
        device.step()
    queued = time.perf_counter() - start
    device.synchronize()
    assert queued < 0.01 and time.perf_counter() - start >= 0.1


def stopwatch_reads(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    """The lesson's solution: the first launch, then the slower side's pace, then the last run."""
    if not synchronize:
        return num_steps * batch_size / (num_steps * launch_s)
    return num_steps * batch_size / (launch_s + (num_steps - 1) * max(launch_s, device_s) + device_s)


def step_by_step(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    """Unusual but right: follow every step through the host and the device, in milliseconds."""
    host = device = 0
    for _ in range(num_steps):
        host += launch_s * 1000
        device = max(device, host) + device_s * 1000
    return batch_size * num_steps / ((device if synchronize else host) / 1000)


def queue_never_drains(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    return batch_size / launch_s  # the host's pace, synchronize or not


def device_time_only(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    if not synchronize:
        return batch_size / launch_s
    return num_steps * batch_size / (launch_s + num_steps * device_s)  # right only where the GPU is the bottleneck


def warmup_counted(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    return stopwatch_reads(launch_s, device_s, batch_size, num_steps + warmup_steps, 0, synchronize)


def one_step_too_many_timed(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    if not synchronize:
        return batch_size / launch_s
    return num_steps * batch_size / (launch_s + num_steps * max(launch_s, device_s) + device_s)


def serial(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    return batch_size / (launch_s + device_s)  # the host waiting for every step


def steady_pace(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    return batch_size / (max(launch_s, device_s) if synchronize else launch_s)


def synchronized_always(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    return stopwatch_reads(launch_s, device_s, batch_size, num_steps, warmup_steps, True)


def step_seconds(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    return 1 / stopwatch_reads(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize)


def test_stopwatch_prediction(capsys):
    assert checks.check_stopwatch_prediction(stopwatch_reads)
    assert verdict(capsys).startswith("PASS: all 5 cases")
    assert checks.check_stopwatch_prediction(step_by_step)
    verdict(capsys)
    fails(capsys, checks.check_stopwatch_prediction(queue_never_drains), "synchronize=True",
          "waits while the device runs what is still queued")
    fails(capsys, checks.check_stopwatch_prediction(device_time_only), "launch 3 ms, device 1 ms",
          "the launches set the pace")
    fails(capsys, checks.check_stopwatch_prediction(warmup_counted), "warm-up steps run before the clock starts")
    fails(capsys, checks.check_stopwatch_prediction(one_step_too_many_timed), "one step off")
    fails(capsys, checks.check_stopwatch_prediction(serial), "launches the next step while the device runs")
    fails(capsys, checks.check_stopwatch_prediction(steady_pace), "holds the first launch")
    fails(capsys, checks.check_stopwatch_prediction(synchronized_always), "synchronize=False",
          "stops as soon as the host has launched the last step")
    fails(capsys, checks.check_stopwatch_prediction(step_seconds), "looks like seconds")
    fails(capsys, checks.check_stopwatch_prediction(lambda *case: stopwatch_reads(*case) / 1000), "per millisecond")
    fails(capsys, checks.check_stopwatch_prediction(lambda *case: None), "returned None")
    fails(capsys, checks.check_stopwatch_prediction(lambda *case: 1 / 0), "ZeroDivisionError")
    fails(capsys, checks.check_stopwatch_prediction(untouched), "NotImplementedError")
    fails(capsys, checks.check_stopwatch_prediction(None), "`stopwatch_reads` is not set")


def test_stopwatch_cases_tell_the_slips_from_the_right_reading():
    """In every case the reading is not itself one of the wrong answers' values, and each slip
    is some case's wrong answer: the check can name it."""
    for case in lesson_02._STOPWATCH_CASES:
        reading = stopwatch_reads(*case)
        assert math.isclose(reading, lesson_02.async_timeline.stopwatch(case[0], case[1], case[3], case[4])
                            .samples_per_s(case[2], case[5]), rel_tol=1e-9)
    for wrong in (queue_never_drains, device_time_only, warmup_counted, one_step_too_many_timed, serial,
                  steady_pace, synchronized_always):
        assert any(not math.isclose(wrong(*case), stopwatch_reads(*case), rel_tol=1e-6)
                   for case in lesson_02._STOPWATCH_CASES), wrong.__name__


def predict_ratio(measured_s, predicted_s, batch_size, new_batch_size):
    """The lesson's solution: the floor grows with the batch, the rest of the step stays the same."""
    floor = predicted_s * new_batch_size / batch_size
    return (floor + measured_s - predicted_s) / floor


def test_step_prediction(capsys):
    assert checks.check_step_prediction(predict_ratio)
    assert verdict(capsys).startswith("PASS: all 3 cases")
    # Unusual but right: the excess as a ratio, scaled down by the batch's growth, in NumPy numbers.
    import numpy as np

    def excess_shrinks(measured_s, predicted_s, batch_size, new_batch_size):
        return 1 + (np.float64(measured_s) / predicted_s - 1) * np.int64(batch_size) / new_batch_size
    assert checks.check_step_prediction(excess_shrinks)
    verdict(capsys)

    def k(b, n):
        return n / b
    fails(capsys, checks.check_step_prediction(lambda m, p, b, n: m / p), "the ratio at batch_size")
    fails(capsys, checks.check_step_prediction(lambda m, p, b, n: (p * k(b, n) + m - p) / p), "divide by the floor")
    fails(capsys, checks.check_step_prediction(lambda m, p, b, n: m / (p * k(b, n))), "the floor's part")
    fails(capsys, checks.check_step_prediction(lambda m, p, b, n: p * k(b, n) + m - p), "the step's seconds")
    fails(capsys, checks.check_step_prediction(lambda m, p, b, n: p * k(b, n) / (p * k(b, n) + m - p)),
          "predicted over measured")
    fails(capsys, checks.check_step_prediction(lambda m, p, b, n: (m - p) / (p * k(b, n))), "the rest over the floor")
    fails(capsys, checks.check_step_prediction(lambda m, p, b, n: (p / k(b, n) + m - p) / (p / k(b, n))),
          "not against it")
    # The rest grown with the batch as well: a ratio that never moves, the first slip again.
    fails(capsys, checks.check_step_prediction(lambda m, p, b, n: (m * k(b, n)) / (p * k(b, n))), "grew with the batch")
    fails(capsys, checks.check_step_prediction(lambda m, p, b, n: 2.0), "carry each to the new batch")
    fails(capsys, checks.check_step_prediction(lambda m, p, b, n: None), "returned None")
    fails(capsys, checks.check_step_prediction(untouched), "NotImplementedError")
    fails(capsys, checks.check_step_prediction(None), "`predict_ratio` is not set")


def test_step_cases_tell_the_slips_apart():
    """In every case the right answer is none of the slips' values, and the slips differ from each other, so the
    check can name each slip."""
    for case in lesson_02._STEP_CASES:
        want = predict_ratio(*case)
        values = [value for value, _ in lesson_02._ratio_slips(*case)]
        for value in values:
            assert not math.isclose(value, want, rel_tol=1e-3)
        assert all(not math.isclose(a, b, rel_tol=1e-3) for i, a in enumerate(values) for b in values[i + 1:])
