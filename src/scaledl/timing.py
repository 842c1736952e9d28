"""A stopwatch for training steps that tells the truth on accelerators.

GPU work is asynchronous: reading the clock right after launching a step measures the launch,
not the step.  `Stopwatch` synchronizes the device before each reading and ignores the first
`warmup` laps (compilation, allocator growth, cuDNN autotuning).
"""
from __future__ import annotations

import statistics
import time


from scaledl.devices import synchronize  # noqa: E402  (re-exported: the stopwatch's one device call)


class Stopwatch:
    def __init__(self, device="cpu", warmup: int = 5):
        self.device = device
        self.warmup = warmup
        self.laps: list[float] = []
        self._seen = 0
        self._start: float | None = None

    def start(self) -> None:
        synchronize(self.device)
        self._start = time.perf_counter()

    def stop(self) -> float:
        """End a lap and return its length in seconds (warm-up laps are returned, not kept)."""
        if self._start is None:
            raise RuntimeError("Stopwatch.stop() called before start()")
        synchronize(self.device)
        lap = time.perf_counter() - self._start
        self._start = None
        self._seen += 1
        if self._seen > self.warmup:
            self.laps.append(lap)
        return lap

    @property
    def total(self) -> float:
        return sum(self.laps)

    @property
    def median(self) -> float:
        return statistics.median(self.laps) if self.laps else float("nan")

    def percentile(self, q: float) -> float:
        if not self.laps:
            return float("nan")
        ordered = sorted(self.laps)
        return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]
