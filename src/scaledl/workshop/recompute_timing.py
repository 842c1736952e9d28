"""Lesson 10's timed steps: the language model trained for a few steps under each `--recompute` mode.

`step_seconds` builds the model from seed 0 under each mode, trains it with SGD and momentum on one random
micro batch, and times the modes in turn, a few steps each, round after round, so that a slow spell of the
machine falls on every mode alike.  Each round's time is the mean wall time of a step, with the device
synchronized before the clock starts and after it stops (a GPU runs its kernels after Python returns).  Beside
the three modes it times `machinery`: selective's checkpoint with every operation's output kept, so that
backward replays each block through the checkpoint's cache and computes nothing again.  Its extra time over
`none` is the checkpoint's own cost.  `reruns_seconds` times, the same way, only the cheap operations that
`selective` runs again: the lesson's rough prediction for that mode.
"""
from __future__ import annotations

import time

MODES = ("none", "selective", "full", "machinery")


def step_seconds(width: int, depth: int, heads: int, seq_len: int, micro_batch_size: int, steps: int = 20,
                 device=None, warmup: int = 2, rounds: int = 5, modes=MODES) -> dict:
    """{mode: [mean seconds of a step in each round]}: each mode's `steps` split into `rounds` rounds, the modes
    timed in turn within a round, after `warmup` untimed steps each."""
    device = _device(device)
    trains = {mode: _training_step(width, depth, heads, seq_len, micro_batch_size, mode, device) for mode in modes}
    for step in trains.values():
        for _ in range(warmup):
            step()
    per_round = max(1, steps // rounds)
    times = {mode: [] for mode in trains}
    for _ in range(rounds):
        for mode, step in trains.items():
            times[mode].append(_mean_seconds(step, per_round, 0, device))
    return times


def reruns_seconds(width: int, depth: int, heads: int, seq_len: int, micro_batch_size: int, steps: int = 20,
                   device=None, warmup: int = 3) -> float:
    """Mean seconds per step of the operations `--recompute selective` runs again, timed alone: in each block the
    two LayerNorms, the residual sum after attention, the copy that joins the heads and GELU, on tensors of the
    block's shapes. A rough prediction of selective's extra time: it leaves out the checkpoint's own bookkeeping."""
    import torch
    import torch.nn.functional as F

    device = _device(device)
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(width).to(device)
    x = torch.randn(micro_batch_size, seq_len, width, device=device, requires_grad=True)
    split = torch.randn(micro_batch_size, heads, seq_len, width // heads, device=device, requires_grad=True)
    wide = torch.randn(micro_batch_size, seq_len, 4 * width, device=device, requires_grad=True)

    def step():
        for _ in range(depth):
            _ = norm(x), x + x, norm(x), split.transpose(1, 2).reshape(micro_batch_size, seq_len, width), F.gelu(wide)

    return _mean_seconds(step, steps, warmup, device)


def _device(device):
    import torch

    return torch.device("cpu") if device is None else device


def _training_step(width, depth, heads, seq_len, micro_batch_size, mode, device):
    """One SGD-with-momentum step of the model built from seed 0 under `mode` (a `--recompute` mode, or
    `machinery`), on one random micro batch, as a function of no arguments."""
    import torch
    import torch.nn.functional as F

    from scaledl import models

    model = build(width, depth, heads, seq_len, mode).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randint(0, models.VOCAB_SIZE, (micro_batch_size, seq_len), device=device)

    def step():
        F.cross_entropy(model(x), x).backward()  # the loss does not matter here, only the work
        optimizer.step()
        optimizer.zero_grad()

    return step


def build(width: int, depth: int, heads: int, seq_len: int, mode: str):
    """The language model built from seed 0 under `mode`, a `--recompute` mode or `machinery` (selective's
    checkpoint keeping every operation's output, which keeps more than `none`: the outputs autograd would not)."""
    import torch

    from scaledl import layers, models

    torch.manual_seed(0)
    model = models.gpt(width, depth, heads, seq_len, recompute="full" if mode == "machinery" else mode)
    if mode == "machinery":
        layers.use_checkpoint(model, _checkpoint_keeping_all)
    return model


def _keep_every_output(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE


def _checkpoint_keeping_all(run, x):
    """`--recompute selective`'s checkpoint with every operation's output kept: backward runs `run` again,
    each operation through the checkpoint's hooks, and takes every output from the cache."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    return checkpoint(run, x, use_reentrant=False,
                      context_fn=lambda: create_selective_checkpoint_contexts(_keep_every_output))


def _mean_seconds(step, steps: int, warmup: int, device) -> float:
    """Mean wall seconds of `step()` over `steps` calls after `warmup` untimed ones, the device synchronized
    before the clock starts and after it stops (not between calls: a GPU queues them as a training loop does)."""
    from scaledl import devices

    for _ in range(warmup):
        step()
    devices.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    devices.synchronize(device)
    return (time.perf_counter() - start) / steps
