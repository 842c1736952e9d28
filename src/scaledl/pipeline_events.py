"""What a pipeline schedule did, from the stages' own clocks: each micro batch's forward and backward
on each stage, when it started and ended, and what follows from them (the bubble, the activations
each stage held at most).  Imports nothing heavy; the pipeline rung records, any process reads.

An event is `[step, rank, stage, kind, micro_batch, start_s, end_s]`, kind "F" or "B" (a rank holds
two stages under the interleaved schedule), the times on the
host's monotonic clock (CLOCK_MONOTONIC on Linux: one clock for every process of a node, so the
stages' rows line up in a figure).  `Clock.watch(stage)` records the forwards and backwards a
`torch.distributed.pipelining.PipelineStage` runs (its `forward_one_chunk` and `backward_one_chunk`,
which GPipe, 1F1B and interleaved 1F1B call; the zero-bubble schedules also split off
`backward_weight_one_chunk`, not timed here).  Receiving and sending are not inside them, nor is the
loss, which the schedule computes on the last stage after its forward: a stage's busy time is its
forward and backward only, and the rest shows as idle.
"""
from __future__ import annotations

import json
import statistics
import time


class Clock:
    def __init__(self, rank: int):
        self.rank = rank
        self.events: list[list] = []
        self.step = 0  # the rung sets it before each schedule.step

    def watch(self, stage) -> None:
        """Record `stage`'s forwards and backwards (its `stage_index` names its row)."""
        for kind, name in (("F", "forward_one_chunk"), ("B", "backward_one_chunk")):
            setattr(stage, name, self._timed(getattr(stage, name), stage.stage_index, kind))

    def _timed(self, run, stage_index: int, kind: str):
        def timed(chunk, *args, **kwargs):
            start = time.monotonic()
            try:
                return run(chunk, *args, **kwargs)
            finally:
                self.events.append([self.step, self.rank, stage_index, kind, chunk, start, time.monotonic()])
        return timed


def peak_in_flight(events: list, stage: int) -> int:
    """The most micro batches whose forward had run on `stage` and whose backward had not, in any step:
    the activations a stage holds at most, in micro batches (GPipe: all m; 1F1B: at most p - stage)."""
    peak = 0
    for step in sorted({e[0] for e in events}):
        held = 0
        for event in sorted((e for e in events if e[0] == step and e[2] == stage), key=lambda e: e[5]):
            held += 1 if event[3] == "F" else -1
            peak = max(peak, held)
    return peak


def bubble(events: list, skip_first: bool = True) -> float:
    """The share of each step the ranks sat idle, averaged over ranks and steps: each step's span runs
    from its first forward's start to its last backward's end, on any rank (the first step, which
    includes the schedule's set-up, is left out when there are more)."""
    steps = sorted({e[0] for e in events})
    if skip_first and len(steps) > 1:
        steps = steps[1:]
    shares = []
    for step in steps:
        mine = [e for e in events if e[0] == step]
        span = max(e[6] for e in mine) - min(e[5] for e in mine)
        for rank in sorted({e[1] for e in mine}):
            busy = sum(e[6] - e[5] for e in mine if e[1] == rank)
            shares.append(1 - busy / span if span > 0 else 0.0)
    return sum(shares) / len(shares) if shares else float("nan")


def compute_only(events: list) -> list:
    """The same events replayed with free sends and no loss: each rank runs its forwards and backwards in the
    order it ran them, each as long as it was measured, and starts each as soon as the rank is free and its
    input is ready (a forward after the previous stage's forward of the same micro batch ends, a backward after
    the next stage's backward, or on the last stage after its own forward).  `bubble` of the result is the
    schedule's bubble from the stages' compute alone: what is left when the waits for sends are removed."""
    last = max(e[2] for e in events)
    replayed = []
    for step in sorted({e[0] for e in events}):
        mine = sorted((e for e in events if e[0] == step), key=lambda e: e[5])
        queues = {rank: [e for e in mine if e[1] == rank] for rank in sorted({e[1] for e in mine})}
        done, free = {}, dict.fromkeys(queues, 0.0)  # (kind, stage, micro batch) -> end; rank -> free from
        while any(queues.values()):
            progressed = False
            for rank, queue in queues.items():
                if not queue:
                    continue
                _, _, stage, kind, micro, start, end = queue[0]
                needs = (("F", stage - 1, micro) if kind == "F" and stage > 0 else ("F", stage, micro)
                         if kind == "B" and stage == last else ("B", stage + 1, micro) if kind == "B" else None)
                if needs is not None and needs not in done:
                    continue  # its input comes from a rank that has not run it yet
                begin = max(free[rank], done[needs] if needs else 0.0)
                free[rank] = done[(kind, stage, micro)] = begin + (end - start)
                replayed.append([step, rank, stage, kind, micro, begin, free[rank]])
                queue.pop(0)
                progressed = True
            if not progressed:
                raise ValueError(f"step {step}: the recorded order waits on itself; not a pipeline schedule")
    return replayed


def _timed_steps(events: list, skip_first: bool) -> list:
    steps = sorted({e[0] for e in events})
    return steps[1:] if skip_first and len(steps) > 1 else steps


def step_seconds(events: list, skip_first: bool = True) -> float:
    """The median step, from its first forward's start to its last backward's end on any rank (the first step
    left out when there are more, as in `bubble`)."""
    spans = []
    for step in _timed_steps(events, skip_first):
        mine = [e for e in events if e[0] == step]
        spans.append(max(e[6] for e in mine) - min(e[5] for e in mine))
    return statistics.median(spans)


def handoff_seconds(events: list, skip_first: bool = True) -> float:
    """The time a step spends passing tensors between ranks, from the stages' own clocks.  A forward or backward
    whose input comes from another rank could start once that input was computed there and its own rank's
    previous call had ended; the hand-off is the time from then to its start (the send, the receive and the
    schedule's work around them).  Summed per rank in each step: the median over steps of the larger rank's sum.
    `compute_only`'s replay has none of it."""
    last = max(e[2] for e in events)
    per_step = []
    for step in _timed_steps(events, skip_first):
        mine = sorted((e for e in events if e[0] == step), key=lambda e: e[5])
        ends = {(e[3], e[2], e[4]): (e[6], e[1]) for e in mine}  # (kind, stage, micro batch) -> (end, rank)
        previous_end, handed = {}, {}
        for _, rank, stage, kind, micro, start, end in mine:
            needs = ("F", stage - 1, micro) if kind == "F" and stage > 0 else (
                ("B", stage + 1, micro) if kind == "B" and stage < last else None)
            if needs in ends and ends[needs][1] != rank:
                ready = max(ends[needs][0], previous_end.get(rank, ends[needs][0]))
                handed[rank] = handed.get(rank, 0.0) + max(0.0, start - ready)
            previous_end[rank] = end
        per_step.append(max(handed.values(), default=0.0))
    return statistics.median(per_step)


def predicted_bubble(stages: int, micro_batches: int, chunks_per_rank: int = 1) -> float:
    """(p - 1) / (v·m + p - 1) of the step: GPipe and 1F1B (v = 1), interleaved with v chunks a rank, for p
    ranks, m micro batches and equal stages.  Narayanan et al. 2021 (arXiv:2104.04473, sections 2.2.1 and
    2.2.2) give the bubble against the ideal time, (p - 1)/m and (p - 1)/(v·m); as a share of the whole
    step, idle / (ideal + idle), it is this."""
    return (stages - 1) / (chunks_per_rank * micro_batches + stages - 1)


def save(events: list, path) -> None:
    """The events as JSON (`scaledl.workshop.plots.pipeline_timeline` draws them)."""
    with open(path, "w") as f:
        json.dump({"fields": ["step", "rank", "stage", "kind", "micro_batch", "start_s", "end_s"], "events": events}, f)
