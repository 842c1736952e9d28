"""Lesson 8's recording of accumulation windows, on a stand-in engine and communication module: no
DeepSpeed, no process group, no live ranks."""
import types

import pytest
import torch

from scaledl.workshop import deepspeed_windows


class FakeEngine:
    """An engine as lesson 8 uses it: forward, a backward that all-reduces a buffer of `numel` floats
    through `comm` in the last micro step of each window (stages 0-1), and a step that applies the
    optimizer only at a window's end."""

    def __init__(self, comm, accumulation_steps=3, numel=100, fail_at=None):
        self.comm, self.accumulation, self.numel, self.fail_at = comm, accumulation_steps, numel, fail_at
        self.model = torch.nn.Linear(28 * 28, 10)
        self.micro_steps, self.global_steps = 0, 0

    def gradient_accumulation_steps(self):
        return self.accumulation

    def __call__(self, x):
        return self.model(x.flatten(1))

    def backward(self, loss):
        if self.micro_steps == self.fail_at:
            raise RuntimeError("a rank went away")
        loss.backward()
        if (self.micro_steps + 1) % self.accumulation == 0:
            self.comm.all_reduce(torch.zeros(self.numel))  # looked up on the module, as DeepSpeed's `dist` is

    def step(self):
        self.micro_steps += 1
        if self.micro_steps % self.accumulation == 0:
            self.global_steps += 1


def test_every_call_and_every_all_reduce_is_recorded_with_its_bytes_and_origin():
    calls = []
    comm = types.SimpleNamespace(all_reduce=lambda tensor, **kwargs: calls.append(tensor.numel()))
    original = comm.all_reduce
    engine = FakeEngine(comm)
    events, reduced = deepspeed_windows.record_windows(engine, torch.device("cpu"), torch.Generator().manual_seed(0),
                                                       windows=2, comm=comm)
    assert comm.all_reduce is original  # put back
    assert calls == [100, 100]  # the real all_reduce still ran
    assert [(micro_step, call, nbytes) for micro_step, call, nbytes, _ in reduced] == [(2, "backward", 400),
                                                                                        (5, "backward", 400)]
    kinds = [kind for kind, *_ in events]
    assert kinds.count("forward") == kinds.count("backward") == 6
    assert kinds.count("all-reduce") == 2
    steps = [kind for kind in kinds if kind in ("step()", "optimizer step")]
    assert steps == ["step()", "step()", "optimizer step"] * 2
    assert all(end >= start for _, start, end in events)
    for i, (kind, start, end) in enumerate(events):  # each all-reduce inside the backward recorded after it
        if kind == "all-reduce":
            assert events[i + 1][0] == "backward" and events[i + 1][1] <= start <= end <= events[i + 1][2]
    assert engine.global_steps == 2


def test_the_wrapper_is_removed_when_a_call_fails():
    comm = types.SimpleNamespace(all_reduce=lambda tensor, **kwargs: None)
    original = comm.all_reduce
    with pytest.raises(RuntimeError, match="went away"):
        deepspeed_windows.record_windows(FakeEngine(comm, fail_at=4), "cpu", torch.Generator().manual_seed(0),
                                         comm=comm)
    assert comm.all_reduce is original


def test_call_timings_take_the_shortest_rank_then_every_call_against_the_prediction():
    # two ranks, five calls each: the shortest over the ranks is 1, 1, 2, 5, 6 ms
    rank0 = [(0, "backward", 400, ms) for ms in (1.0, 3.0, 2.0, 5.0, 9.0)]
    rank1 = [(0, "backward", 400, ms) for ms in (4.0, 1.0, 2.5, 7.0, 6.0)] + [(0, "step", 4, 0.1)]
    timings = deepspeed_windows.call_timings({"probe": [rank0, rank1]}, predicted_ms=1.0)
    assert timings["probe"] == {"calls": 5, "fastest": 1.0, "median": 2.0, "fast": 3,
                                "sorted": [1.0, 1.0, 2.0, 5.0, 6.0]}
    table = deepspeed_windows.timing_table(timings, predicted_ms=1.0)
    assert table.splitlines()[0].split()[:4] == ["calls", "predicted", "fastest", "median"]
    assert table.splitlines()[0].endswith("calls within 2x (of 5)")
    assert table.splitlines()[1].split() == ["probe", "5", "1.00", "1.00", "2.00", "3"]
    fig = deepspeed_windows.sorted_calls_figure(timings, predicted_ms=1.0)
    ax = fig.axes[0]
    assert list(ax.lines[0].get_ydata()) == [1.0, 1.0, 2.0, 5.0, 6.0]  # every call, fastest first
    assert [line.get_ydata()[0] for line in ax.lines[1:]] == [1.0, 2.0]  # the prediction, and twice it


def test_first_quartile_ignores_a_minority_of_stretched_calls():
    assert deepspeed_windows.first_quartile([0.5, 0.5, 0.6, 0.5, 4.0, 5.0, 6.0, 0.5]) == 0.5


def test_probe_times_each_size_after_a_backward_then_the_whole_gradient():
    calls, seen, whole_seen, barriers = 3, [], [], []
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 10))
    laps, whole = deepspeed_windows.probe_all_reduces(
        model, torch.device("cpu"), torch.Generator().manual_seed(0), [4, 16], calls=calls,
        all_reduce=lambda buffer: seen.append(buffer.numel()), whole_all_reduce=lambda buffer: whole_seen.append(
            buffer.numel()), barrier=lambda: barriers.append(1))
    assert seen == [4] * (1 + calls) + [16] * (1 + calls)  # a warm-up, then the timed calls, per size
    assert [len(lap) for lap in laps] == [calls, calls] and all(seconds >= 0 for lap in laps for seconds in lap)
    assert len(barriers) == 2 and whole_seen == [28 * 28 * 10 + 10] * calls
    assert [(call, where, nbytes) for call, where, nbytes, _ in whole] == [(c, "backward", 4 * 7850) for c in range(3)]
    assert model[1].weight.grad is not None  # the probe ran backwards
