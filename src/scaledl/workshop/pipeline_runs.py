"""Lesson 11's plumbing: a stage's forward and backward timed on a live rank, and the pipeline rung run once.

`time_stage` runs one stage's forward and backward on a micro batch several times, with the device synchronized
around each half (a GPU runs its kernels after Python returns), and keeps the median of each half after the first
runs (which pay for allocation and warm-up).

`run_rung` runs `scaledl.ladder.pipeline` once through `scaledl.workshop.rungs.run` and also reads back every
forward and backward each stage ran, with its start and end (pipeline_events.json, `scaledl.pipeline_events`).
"""
from __future__ import annotations

import json
import statistics
import time

from scaledl.workshop import rungs


def time_stage(stage, inputs, device, repeats: int = 12, skip: int = 2) -> tuple[float, float]:
    """(forward, backward) seconds of `stage` on `inputs`: the medians of `repeats` runs, the first `skip` left out."""
    from scaledl import devices

    forward_s, backward_s = [], []
    for _ in range(repeats):
        devices.synchronize(device)
        start = time.perf_counter()
        out = stage(inputs)
        devices.synchronize(device)
        middle = time.perf_counter()
        out.sum().backward()
        devices.synchronize(device)
        forward_s.append(middle - start)
        backward_s.append(time.perf_counter() - middle)
    return statistics.median(forward_s[skip:]), statistics.median(backward_s[skip:])


def run_rung(world_size: int, args=(), module: str = "scaledl.ladder.pipeline") -> tuple[str, dict, list]:
    """Run the pipeline rung on `world_size` local ranks (`scaledl.workshop.rungs.run`): (its summary line,
    summary.json, its events)."""
    line, summary, out_dir = rungs.run(module, world_size, args)
    return line, summary, json.loads((out_dir / "pipeline_events.json").read_text())["events"]
