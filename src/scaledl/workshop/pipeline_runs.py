"""Lesson 11's plumbing: a stage's forward and backward timed on a live rank, and the pipeline rung run once.

`time_stage` runs one stage's forward and backward on a micro batch several times, with the device synchronized
around each half (a GPU runs its kernels after Python returns), and keeps the median of each half after the first
runs (which pay for allocation and warm-up).

`run_rung` runs `scaledl.ladder.pipeline` once through `scaledl.workshop.rungs.run` and also reads back every
forward and backward each stage ran, with its start and end (pipeline_events.json, `scaledl.pipeline_events`).

`one_f_one_b` draws 1F1B in time slots, as the lesson draws it by hand before its Exercise 4.
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


def one_f_one_b(stages: int, microbatches: int) -> str:
    """1F1B drawn in time slots, one slot for each forward or backward, as lesson 11 draws it by hand (`.` is idle).
    Stage s runs min(S - s - 1, M) forwards first, then one forward and one backward in turn while forwards are
    left, then the backwards left.  Each call starts in the first slot where its stage is free and its input is
    ready: a forward after the previous stage's forward of the same micro batch, a backward after the next
    stage's backward (on the last stage, after its own forward)."""
    orders = []
    for stage in range(stages):
        warm_up = min(stages - stage - 1, microbatches)
        order, forwards = [("F", m) for m in range(warm_up)], warm_up
        for backward in range(microbatches):
            if forwards < microbatches:
                order.append(("F", forwards))
                forwards += 1
            order.append(("B", backward))
        orders.append(order)
    ends, free, rows = {}, [0] * stages, [{} for _ in range(stages)]
    while any(orders):
        progressed = False
        for stage, order in enumerate(orders):
            if not order:
                continue
            kind, micro = order[0]
            needs = ("F", stage - 1, micro) if kind == "F" and stage > 0 else (
                ("B", stage + 1, micro) if kind == "B" and stage < stages - 1 else None)
            if needs is not None and needs not in ends:
                continue
            slot = max(free[stage], ends[needs] if needs else 0)
            rows[stage][slot] = f"{kind}{micro}"
            free[stage] = ends[(kind, stage, micro)] = slot + 1
            order.pop(0)
            progressed = True
        if not progressed:
            raise ValueError("the schedule waits on itself")
    width = max(free)
    lines = ["slot:".ljust(10) + "".join(str(slot + 1).ljust(4) for slot in range(width))]
    lines += [f"stage {stage}:".ljust(10) + "".join(row.get(slot, ".").ljust(4) for slot in range(width))
              for stage, row in enumerate(rows)]
    return "\n".join(line.rstrip() for line in lines)
