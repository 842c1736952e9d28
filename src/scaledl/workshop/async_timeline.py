"""Asynchronous execution, simulated and drawn for lesson 2: the host launches each step's
kernels into the device's queue, and the device runs them while the host goes on.

`SimulatedDevice` is the stand-in for a GPU that `scaledl.workshop.checks.check_samples_per_s` times the
learner's stopwatch on (in real time). Given a `VirtualClock` it runs in simulated time instead:
the host's launch cost moves the clock on, and `synchronize()` moves it to the moment the queue
is done. `stopwatch` runs the lesson's stopwatch on it (warm-up steps, synchronize, start the
clock, the timed steps, read the clock, synchronize, read it again), so the figure
and `checks.check_stopwatch_prediction` get their numbers from the same device model.

The model: a step's launch takes `launch_s` of the host's time; its work enters the queue when
the launch is done and runs for `device_s` once the device has finished what was queued before.
The queue never fills, and launching and running do not slow each other down.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

HOST, DEVICE, IDLE = "#4C72B0", "#DD8452", "#DDDDDD"


@dataclass(frozen=True)
class Step:
    """One step's times: the host launching it, the device running it."""
    host_start: float
    host_end: float  # the work enters the queue here
    device_start: float
    device_end: float


class VirtualClock:
    """Simulated time for `SimulatedDevice`: `now()` reads it, `sleep(s)` moves it on at once."""

    def __init__(self, start: float = 0.0):
        self.t = start

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)


class SimulatedDevice:
    """A stand-in for a GPU to check timing code against: `step()` costs the host `launch_s`,
    then only queues its work (as a CUDA launch does) and returns; `synchronize()` waits until
    the queue is done. The first `warmup_steps` steps are slow on the device, as first steps on
    a real device are. Every step's times are kept in `log`. Without a `clock` it runs in real
    time (`time.perf_counter`, `time.sleep`); with a `VirtualClock` in simulated time."""

    def __init__(self, step_s: float = 0.004, warmup_steps: int = 2, warmup_s: float = 0.15,
                 launch_s: float = 0.0, clock: VirtualClock | None = None):
        self.step_s, self.warmup_steps, self.warmup_s, self.launch_s = step_s, warmup_steps, warmup_s, launch_s
        self._now, self._sleep = (clock.now, clock.sleep) if clock else (time.perf_counter, time.sleep)
        self._lock = threading.Lock()
        self._busy_until = self._now()
        self.steps = 0
        self.log: list[Step] = []

    def step(self) -> None:
        host_start = self._now()
        if self.launch_s:
            self._sleep(self.launch_s)
        with self._lock:
            queued = self._now()
            cost = self.warmup_s if self.steps < self.warmup_steps else self.step_s
            begin = max(self._busy_until, queued)
            self._busy_until = begin + cost
            self.steps += 1
            self.log.append(Step(host_start, queued, begin, self._busy_until))

    def synchronize(self) -> None:
        with self._lock:
            wait = self._busy_until - self._now()
        if wait > 0:
            self._sleep(wait)


@dataclass(frozen=True)
class Reading:
    """One run of the stopwatch: the timed steps and the clock's three readings."""
    steps: list[Step]
    start: float  # the clock starts: warm-up done and synchronized
    host_done: float  # the host has launched the last step: a clock read without synchronize
    device_done: float  # the device has run the last step: a clock read after synchronize

    def samples_per_s(self, batch_size: int, synchronize: bool) -> float:
        stop = self.device_done if synchronize else self.host_done
        return len(self.steps) * batch_size / (stop - self.start)


def stopwatch(launch_s: float, device_s: float, num_steps: int, warmup_steps: int = 0,
              warmup_s: float | None = None) -> Reading:
    """The lesson's stopwatch on a `SimulatedDevice` in simulated time: `warmup_steps` steps
    (each `warmup_s` on the device, `device_s` by default), synchronize, start the clock, launch
    `num_steps` steps, read the clock (what a stopwatch without synchronize reports),
    synchronize, read it again. Without the first synchronize the first reading is the same:
    the host's launches do not wait for the device."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be at least 1, got {num_steps}")
    if launch_s < 0 or device_s <= 0:
        raise ValueError(f"launch_s must be >= 0 and device_s > 0, got {launch_s} and {device_s}")
    clock = VirtualClock()
    device = SimulatedDevice(step_s=device_s, warmup_steps=warmup_steps,
                             warmup_s=device_s if warmup_s is None else warmup_s, launch_s=launch_s, clock=clock)
    for _ in range(warmup_steps):
        device.step()
    device.synchronize()
    start = clock.now()
    for _ in range(num_steps):
        device.step()
    host_done = clock.now()
    device.synchronize()
    return Reading(device.log[warmup_steps:], start, host_done, clock.now())


def queued(reading: Reading) -> tuple[list[float], list[int]]:
    """Steps launched and not yet run, over time: (times, counts) for a step plot."""
    events = sorted([(s.host_end, 1) for s in reading.steps] + [(s.device_end, -1) for s in reading.steps],
                    key=lambda event: (event[0], event[1]))
    times, counts, depth = [0.0], [0], 0
    for at, change in events:
        depth += change
        times.append(at - reading.start)
        counts.append(depth)
    return times, counts


def figure(num_steps: int = 5, batch_size: int = 64, gpu_bound: tuple = (0.001, 0.004),
           launch_bound: tuple = (0.003, 0.001), show_readings: bool = True):
    """Two panels, each (launch_s, device_s): a GPU-bound step (the host runs ahead and the queue
    grows) and a launch-bound one (the device idles between steps). Each marks where a stopwatch
    without synchronize stops the clock and where it stops after synchronize, with the samples/s
    each reports unless `show_readings` is False (lesson 2 draws the figure before the exercise that
    asks for them)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 5.6), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    readings = [stopwatch(*case, num_steps) for case in (gpu_bound, launch_bound)]
    end = max(r.device_done - r.start for r in readings) * 1e3
    for ax, (launch_s, device_s), reading, kind in zip(axes, (gpu_bound, launch_bound), readings,
                                                       ("GPU-bound", "launch-bound")):
        ms = lambda t: (t - reading.start) * 1e3  # noqa: E731 (milliseconds since the clock started)
        for i, step in enumerate(reading.steps, start=1):
            for lane, (a, b), color in ((2, (step.host_start, step.host_end), HOST),
                                        (1, (step.device_start, step.device_end), DEVICE)):
                ax.broken_barh([(ms(a), ms(b) - ms(a))], (lane - 0.3, 0.6), facecolors=color, edgecolors="black",
                               linewidth=0.6)
                ax.text((ms(a) + ms(b)) / 2, lane, str(i), ha="center", va="center", fontsize=8, color="white")
        ends = [reading.start] + [step.device_end for step in reading.steps[:-1]]
        idle = [(ms(a), ms(step.device_start) - ms(a)) for a, step in zip(ends, reading.steps)
                if step.device_start > a]
        if idle:
            ax.broken_barh(idle, (0.7, 0.6), facecolors=IDLE, edgecolors="none", label="device idle")
        ax.broken_barh([(ms(reading.host_done), ms(reading.device_done) - ms(reading.host_done))], (1.7, 0.6),
                       facecolors="white", edgecolors="#888888", hatch="///", linewidth=0.6,
                       label="host waits in synchronize()")
        times, counts = queued(reading)
        ax.step([t * 1e3 for t in times], [c * 0.12 for c in counts], where="post", color="black", linewidth=1.2,
                label=f"steps launched, not yet finished (at most {max(counts)})")
        no_sync, synced = (reading.samples_per_s(batch_size, sync) for sync in (False, True))
        ax.axvline(ms(reading.host_done), color="#C44E52", linestyle="--", linewidth=1.5,
                   label="clock read without synchronize" + (f": {no_sync:,.0f} samples/s" if show_readings else ""))
        ax.axvline(ms(reading.device_done), color="#55A868", linestyle="-", linewidth=1.5,
                   label="clock read after synchronize" + (f": {synced:,.0f} samples/s" if show_readings else ""))
        why = ("the host runs ahead, the queue grows" if device_s > launch_s
               else "the device idles between steps")
        ax.set_title(f"{kind}: launch {launch_s * 1e3:g} ms, device {device_s * 1e3:g} ms per step, "
                     f"{num_steps} steps of {batch_size}: {why}", fontsize=9)
        ax.set_yticks([0.2, 1, 2], ["queue", "device: runs", "host: launches"], fontsize=8)
        ax.set_ylim(-0.1, 2.45)
        ax.set_xlim(0, end * 1.02)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[-1].set_xlabel("ms since the clock started (warm-up done, device synchronized)", fontsize=8)
    return fig
