"""Lesson 2's model of asynchronous execution: the simulated device the stopwatch check times,
run in simulated time, gives the readings the lesson's arithmetic predicts."""
import math
import time

import pytest

from scaledl.workshop import async_timeline, checks


def closed_form(launch_s, device_s, num_steps, synchronize):
    """The lesson's arithmetic: the first launch, the slower side's pace, the last run."""
    if not synchronize:
        return num_steps * launch_s
    return launch_s + (num_steps - 1) * max(launch_s, device_s) + device_s


@pytest.mark.parametrize("launch_s, device_s", [(0.001, 0.004), (0.003, 0.001), (0.002, 0.002), (0.0, 0.005)])
@pytest.mark.parametrize("num_steps", [1, 2, 7])
@pytest.mark.parametrize("warmup_steps", [0, 3])
def test_the_simulated_stopwatch_reads_what_the_arithmetic_predicts(launch_s, device_s, num_steps, warmup_steps):
    reading = async_timeline.stopwatch(launch_s, device_s, num_steps, warmup_steps=warmup_steps, warmup_s=0.5)
    assert len(reading.steps) == num_steps
    for synchronize, stop in ((False, reading.host_done), (True, reading.device_done)):
        assert math.isclose(stop - reading.start, closed_form(launch_s, device_s, num_steps, synchronize),
                            rel_tol=1e-9, abs_tol=1e-12)


def test_gpu_bound_the_queue_grows_launch_bound_the_device_idles():
    gpu_bound = async_timeline.stopwatch(0.001, 0.004, 5)
    assert max(async_timeline.queued(gpu_bound)[1]) == 4  # the host is done while the device has run one
    assert all(b.device_start == a.device_end for a, b in zip(gpu_bound.steps, gpu_bound.steps[1:]))
    launch_bound = async_timeline.stopwatch(0.003, 0.001, 5)
    assert max(async_timeline.queued(launch_bound)[1]) == 1
    assert all(b.device_start - a.device_end > 0.0015 for a, b in zip(launch_bound.steps, launch_bound.steps[1:]))
    times, counts = async_timeline.queued(launch_bound)
    assert counts[-1] == 0 and times == sorted(times)


def test_without_synchronize_the_reading_ignores_the_device():
    fast, slow = (async_timeline.stopwatch(0.001, device_s, 10) for device_s in (0.0001, 0.1))
    assert fast.samples_per_s(64, synchronize=False) == pytest.approx(slow.samples_per_s(64, synchronize=False))
    assert slow.samples_per_s(64, synchronize=True) < slow.samples_per_s(64, synchronize=False) / 50


@pytest.mark.serial  # real seconds
def test_the_grader_times_the_same_device_in_real_time():
    assert checks.SimulatedDevice is async_timeline.SimulatedDevice
    device = async_timeline.SimulatedDevice(step_s=0.05, warmup_steps=0, launch_s=0.005)
    start = time.perf_counter()
    for _ in range(3):
        device.step()
    launched = time.perf_counter() - start
    device.synchronize()
    # The host pays its launches (3 x 5 ms) and does not wait for the device (3 x 50 ms after the first launch).
    assert 0.015 <= launched < 0.1 and time.perf_counter() - start >= 0.155


def test_a_virtual_clock_never_waits():
    clock = async_timeline.VirtualClock()
    device = async_timeline.SimulatedDevice(step_s=100.0, warmup_steps=0, launch_s=10.0, clock=clock)
    start = time.perf_counter()
    device.step()
    device.synchronize()
    assert clock.now() == 110.0 and time.perf_counter() - start < 1


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="num_steps"):
        async_timeline.stopwatch(0.001, 0.002, 0)
    with pytest.raises(ValueError, match="device_s"):
        async_timeline.stopwatch(0.001, 0.0, 3)


def test_the_figure_marks_both_readings():
    fig = async_timeline.figure(num_steps=5, batch_size=64)
    assert len(fig.axes) == 2
    for ax, (launch_s, device_s) in zip(fig.axes, ((0.001, 0.004), (0.003, 0.001))):
        reading = async_timeline.stopwatch(launch_s, device_s, 5)
        labels = [text.get_text() for text in ax.get_legend().get_texts()]
        for synchronize in (False, True):
            assert any(f"{reading.samples_per_s(64, synchronize):,.0f} samples/s" in label for label in labels)
    assert "the host runs ahead" in fig.axes[0].get_title() and "idles" in fig.axes[1].get_title()


def test_the_figure_can_leave_the_readings_out():
    fig = async_timeline.figure(num_steps=5, batch_size=64, show_readings=False)
    labels = [text.get_text() for ax in fig.axes for text in ax.get_legend().get_texts()]
    assert "clock read without synchronize" in labels and "clock read after synchronize" in labels
    assert not any("samples/s" in label for label in labels)
