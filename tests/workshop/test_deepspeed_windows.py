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

