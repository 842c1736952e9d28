"""Lesson 2's checks: a stopwatch that tells the truth on an asynchronous device, and a step's time from its FLOPs."""
from __future__ import annotations

import math

from scaledl.workshop import async_timeline
from scaledl.workshop.checks.common import _attempt, _FAILED, _unfinished, _verdict

# The device that check_samples_per_s times, in real time, and that lesson 2's figure and
# check_stopwatch_prediction run in simulated time: one model of the queue for all three.
SimulatedDevice = async_timeline.SimulatedDevice


class _Loss:
    """A step's loss still on the simulated device, as a CUDA tensor's is: `item()` (or `float()`) waits
    until the device has run the step(s) it comes from, then gives the number; `+` and `/` make another
    such loss without waiting, as adding tensors on a GPU queues one more kernel."""

    def __init__(self, device: "_LossDevice", ready_at: float, value: float):
        self._device, self._ready_at, self._value = device, ready_at, value

    def item(self) -> float:
        self._device.wait_until(self._ready_at)
        return self._value

    __float__ = item

    def __add__(self, other):
        if isinstance(other, _Loss):
            return _Loss(self._device, max(self._ready_at, other._ready_at), self._value + other._value)
        return _Loss(self._device, self._ready_at, self._value + float(other))

    __radd__ = __add__

    def __truediv__(self, number):
        return _Loss(self._device, self._ready_at, self._value / float(number))


class _LossDevice(SimulatedDevice):
    """The simulated GPU whose `step()` returns that step's loss (step i's is 1/i), kept on the device."""

    def step(self) -> _Loss:
        super().step()
        return _Loss(self, self.log[-1].device_end, 1.0 / self.steps)

    def wait_until(self, moment: float) -> None:
        wait = moment - self._now()
        if wait > 0:
            self._sleep(wait)

    def waits_between(self, first: int, last: int) -> int:
        """How many times the host waited for a step to finish before launching the next, among steps
        first..last (0-based): each such wait costs the host its running ahead."""
        return sum(self.log[k + 1].host_start >= self.log[k].device_end - 0.005 for k in range(first, last))


def check_samples_per_s(samples_per_s, batch_size: int = 64, num_steps: int = 5, warmup_steps: int = 3) -> bool:
    """Run the learner's `samples_per_s(step, batch_size, synchronize, num_steps, warmup_steps)`, which
    returns (samples per second, the timed steps' mean loss), on a simulated device whose true rate is
    known.  Few timed steps of 40 ms each: one step too many or too few counted is 17 to 25% off, the
    noise of sleeping a few percent.  A host that waits for the device between timed steps (a loss read
    in the loop) is told from the device's log, not from the time."""
    if samples_per_s is None:
        return _unfinished("samples_per_s")
    device = _LossDevice(step_s=0.04, warmup_steps=2, warmup_s=0.15)
    got = _attempt("samples_per_s", "on the check's device (its losses, like a tensor on a GPU, take .item(), + and /)",
                   lambda: samples_per_s(device.step, batch_size, device.synchronize, num_steps=num_steps,
                                         warmup_steps=warmup_steps))
    if got is _FAILED:
        return False
    want = batch_size / device.step_s
    if device.steps != num_steps + warmup_steps:
        return _verdict(False, f"it ran {device.steps} steps for warmup_steps={warmup_steps} and "
                               f"num_steps={num_steps}: run the warm-up steps, then exactly num_steps timed ones")
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        return _verdict(False, f"it returned {got!r}: return two numbers, the samples per second and the mean loss "
                               "of the timed steps")
    rate, loss = got
    if isinstance(loss, _Loss):
        loss = loss.item()
    if not isinstance(rate, (int, float)) or not rate > 0:
        return _verdict(False, f"it returned {rate!r} as samples per second: return a positive number first")
    if rate < 5 and isinstance(loss, (int, float)) and loss > 5:
        return _verdict(False, f"it returned ({rate:.3g}, {loss:.3g}): the samples per second first, then the loss")
    waits = device.waits_between(warmup_steps, warmup_steps + num_steps - 1)
    if waits:
        return _verdict(False, f"the host waited for the device {waits} times between timed steps: a loss's .item() "
                               "(or a synchronize) in the loop stops the host from running ahead, as training lets "
                               "it, so the clock times another loop: keep the losses, read them after the clock")
    if any(math.isclose(rate, seconds, rel_tol=0.15) for seconds in (num_steps * device.step_s, device.step_s)):
        return _verdict(False, f"{rate:.3g} looks like seconds: return samples per second")
    if rate > 3 * want:
        return _verdict(False, f"{rate:,.0f} samples/s, faster than the device can go ({want:,.0f}): the clock "
                               "stopped before the queued work finished: synchronize before reading it")
    if rate < 0.7 * want:
        return _verdict(False, f"{rate:,.0f} samples/s, well below the steady {want:,.0f}: the slow first steps are "
                               "in the timing: start the clock after the warm-up (and synchronize there too)")
    # One step off, either way: n +- 1 steps' samples over n timed, or n over n +- 1 timed.
    if any(abs(rate / want - ratio) < 0.05 for ratio in ((num_steps - 1) / num_steps, (num_steps + 1) / num_steps,
                                                           num_steps / (num_steps - 1), num_steps / (num_steps + 1))):
        return _verdict(False, f"{rate:,.0f} samples/s, {rate / want:.0%} of the true {want:,.0f}: one step off: the "
                               f"clock must cover exactly the {num_steps} timed steps, and count their samples")
    if not 0.9 < rate / want < 1.1:
        return _verdict(False, f"{rate:,.0f} samples/s, expected {want:,.0f}: count only the samples of the timed "
                               "steps, and stop the clock after the device has finished them")
    losses = [1.0 / step for step in range(1, warmup_steps + num_steps + 1)]
    mean = sum(losses[warmup_steps:]) / num_steps
    try:
        loss = float(loss)
    except (TypeError, ValueError):
        return _verdict(False, f"it returned {loss!r} as the loss: return the timed steps' mean loss, a number")
    if not math.isclose(loss, mean, rel_tol=1e-6):
        slips = [(sum(losses) / len(losses), "the warm-up steps' losses are in it: average the timed steps' only"),
                 (losses[-1], "that is the last step's loss: average all the timed steps'"),
                 (sum(losses[warmup_steps:]), "that is the sum: divide by the number of timed steps")]
        hint = next((message for value, message in slips if math.isclose(loss, value, rel_tol=1e-6)),
                    "average the losses of the timed steps")
        return _verdict(False, f"the mean loss {loss:.4g}, expected {mean:.4g}: {hint}")
    return _verdict(True, "within 10% of the simulated device's true rate: warm-up left out, the device "
                          "synchronized before each clock reading, and the losses read without stopping the host")


# (launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize): GPU-bound and launch-bound,
# with and without synchronize, warm-up steps that a count can wrongly take in, and one step alone.
_STOPWATCH_CASES = [(0.001, 0.004, 64, 4, 2, True), (0.003, 0.001, 32, 5, 3, True),
                    (0.0005, 0.005, 128, 10, 2, False), (0.003, 0.001, 32, 5, 3, False),
                    (0.002, 0.0015, 16, 1, 1, True)]


def _stopwatch_slips(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize) -> list:
    """(samples/s, what went wrong) for the wrong predictions learners make, in the order they
    are told apart."""
    L, D, B, n, w = launch_s, device_s, batch_size, num_steps, warmup_steps

    def seconds(steps: int, sync: bool) -> float:  # the closed form of async_timeline.stopwatch
        return L + D + (steps - 1) * max(L, D) if sync else steps * L

    drain = ("that is the host's pace: with synchronize the clock also waits while the device runs "
             "what is still queued")
    warm = ("the warm-up steps run before the clock starts (and are synchronized): they are in neither "
            "the time nor the samples")
    one_off = ("one step off: the clock runs from the first timed launch to the moment it is read, "
               "over exactly num_steps steps' samples")
    if not synchronize:
        slips = [(n * B / seconds(n, True), "that is the reading after synchronize: without it the clock stops as "
                                            "soon as the host has launched the last step"),
                 (B / D, "that is the device's pace: without synchronize the clock never waits for the device"),
                 (B / (L + D), "the host does not wait for each step to run: it only launches them")]
    else:
        slips = [(B / L, drain if D > L else "the host's pace, but the clock also waits for the last step to run "
                                           "on the device"),
                 (B / D, "the device's pace, but the clock also holds the first launch, before the device has "
                         "anything to run" if D > L else
                         "the device is faster than the host feeds it: it waits between steps, so the "
                         "launches set the pace"),
                 (n * B / (L + n * D), "the device waits for each launch: where launching takes longer than "
                                       "running, the launches set the pace"),
                 (B / max(L, D), "that is the pace in between: the clock also holds the first launch (the "
                                 "device has nothing to run yet) and the last run (the host has nothing left "
                                 "to launch)"),
                 (B / (L + D), "the host does not wait for the device between steps: it launches the next "
                               "step while the device runs the last one")]
    if w:
        slips += [((n + w) * B / seconds(n + w, synchronize), warm), ((n + w) * B / seconds(n, synchronize), warm),
                  (n * B / seconds(n + w, synchronize), warm)]
    slips += [(steps * B / seconds(timed, synchronize), one_off)
              for steps, timed in ((n, n + 1), (n, n - 1), (n + 1, n), (n - 1, n)) if timed > 0]
    if synchronize:
        slips += [(n * B / (n * max(L, D) + D), "the device cannot start before the first launch is done"),
                  (n * B / (L + n * max(L, D)), "the last step runs on the device after the host has launched it")]
    return slips


def _number(raw) -> float:
    """A learner's returned value as a float, NaN where it is none (a bool, a string, None)."""
    try:
        return math.nan if isinstance(raw, bool) else float(raw)
    except (TypeError, ValueError):
        return math.nan


def check_stopwatch_prediction(predict) -> bool:
    """`predict(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize) -> samples/s`,
    what lesson 2's stopwatch reads on a device that queues work, against the reading of that
    stopwatch run on `async_timeline.SimulatedDevice` in simulated time (exact, no noise)."""
    if predict is None:
        return _unfinished("stopwatch_reads")
    for case in _STOPWATCH_CASES:
        launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize = case
        where = (f"launch {launch_s * 1e3:g} ms, device {device_s * 1e3:g} ms, {num_steps} steps of {batch_size} "
                 f"after {warmup_steps} warm-up, synchronize={synchronize}")
        raw = _attempt("stopwatch_reads", where, lambda: predict(*case))
        if raw is _FAILED:
            return False
        got = _number(raw)
        if not 0 < got < math.inf:
            return _verdict(False, f"{where}: it returned {raw!r}: return samples per second, a positive number")
        reading = async_timeline.stopwatch(launch_s, device_s, num_steps, warmup_steps=warmup_steps)
        want = reading.samples_per_s(batch_size, synchronize)
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        if got < 1:
            hint = "that looks like seconds: return samples per second"
        elif math.isclose(got * 1e3, want, rel_tol=1e-6):
            hint = "that is samples per millisecond: launch_s and device_s are in seconds"
        else:
            hint = next((message for value, message in _stopwatch_slips(*case)
                         if math.isclose(got, value, rel_tol=1e-6)),
                        "follow the first and the last timed step through the figure: when does the clock stop?")
        shown = f"{got:.3g}" if got < 1 else f"{got:,.0f} samples/s"
        return _verdict(False, f"{where}: {shown}, the stopwatch reads {want:,.0f} samples/s: {hint}")
    return _verdict(True, f"all {len(_STOPWATCH_CASES)} cases: without synchronize the clock reads the host's "
                          "launches; with it, the queue drains first; warmup_steps changes nothing, since the "
                          "synchronize after the warm-up keeps it outside the clock")


# (measured seconds of one step at batch_size, its FLOP floor in seconds, batch_size, new_batch_size): larger
# batches and a smaller one, with ratios that are not 2 or 1/2, so that each slip lands on a value of its own.
_STEP_CASES = [(0.012, 0.003, 32, 128), (0.03, 0.01, 128, 32), (0.9, 0.6, 16, 48)]


def _ratio_slips(measured_s, predicted_s, batch_size, new_batch_size) -> list:
    """(value, what went wrong) for the slips a learner plausibly makes predicting the ratio at new_batch_size."""
    k = new_batch_size / batch_size
    floor, rest = predicted_s * k, measured_s - predicted_s
    return [(measured_s / predicted_s, "that is the ratio at batch_size, as if the rest grew with the batch too: the "
                                       "hypothesis keeps it the same per step"),
            ((floor + rest) / predicted_s, "divide by the floor at new_batch_size: it grew with the batch"),
            (measured_s / floor, "the floor's part of the step grows too: only the rest stays the same"),
            (floor + rest, "that is the step's seconds at new_batch_size: return it over the floor there"),
            (floor / (floor + rest), "that is predicted over measured: the ratio is measured over predicted"),
            (rest / floor, "that is the rest over the floor: measured counts the floor too"),
            ((predicted_s / k + rest) / (predicted_s / k), "the floor grows with the batch, not against it")]


def check_step_prediction(predict) -> bool:
    """`predict(measured_s, predicted_s, batch_size, new_batch_size) -> ratio`: measured over predicted
    (the step's FLOP floor) at new_batch_size, on the hypothesis that the time outside the counted FLOPs
    (measured minus floor) stays the same per step.  The floor grows in proportion to the batch (every
    product a step counts has the batch as a factor), so the ratio is (floor * k + rest) / (floor * k)
    with k = new_batch_size / batch_size.  A failure names the slip, not the learner's lesson values."""
    if predict is None:
        return _unfinished("predict_ratio")
    for measured_s, predicted_s, batch_size, new_batch_size in _STEP_CASES:
        where = (f"measured {measured_s * 1e3:g} ms, floor {predicted_s * 1e3:g} ms at batch {batch_size}, "
                 f"predicted at batch {new_batch_size}")
        raw = _attempt("predict_ratio", where, lambda: predict(measured_s, predicted_s, batch_size, new_batch_size))
        if raw is _FAILED:
            return False
        got = _number(raw)
        if not 0 < got < math.inf:
            return _verdict(False, f"{where}: it returned {raw!r}: return the ratio, a positive number")
        floor = predicted_s * new_batch_size / batch_size
        want = (floor + measured_s - predicted_s) / floor
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        hint = next((message for value, message in _ratio_slips(measured_s, predicted_s, batch_size, new_batch_size)
                     if math.isclose(got, value, rel_tol=1e-6)),
                    "split the step into its floor and the rest, and carry each to the new batch")
        return _verdict(False, f"{where}: {got:.4g}, expected {want:.4g}: {hint}")
    return _verdict(True, f"all {len(_STEP_CASES)} cases: the floor grows with the batch, the rest stays, so the "
                          "ratio moves toward 1 at a larger batch and away from it at a smaller one")
