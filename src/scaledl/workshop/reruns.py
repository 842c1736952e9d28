"""How far reruns of one command land apart, and a measured-minus-predicted gap judged against it (lesson 7).

Each world size runs a few times.  A rank's step in each run comes from the run's samples/s.  The slowest run
over the fastest is that world size's spread.  A ratio of two world sizes' medians can move by the sum of their
spreads, and a gap between a measured and a predicted step by the sum of their ranges in ms.
"""
from __future__ import annotations

EDGE = 0.2  # a gap past the summed ranges by less than this share of them is "at the edge": too close to call


def steps_ms(runs: dict[int, list[float]], micro_batch_size: int) -> dict[int, list[float]]:
    """A rank's step in ms in each run, fastest first, from {world_size: [samples/s of each run]} (samples/s
    counts every rank's samples)."""
    return {n: sorted(n * micro_batch_size / rate * 1e3 for rate in rates) for n, rates in runs.items()}


def show_spreads(steps: dict[int, list[float]]) -> dict[int, float]:
    """Print one line per world size, its steps and how far the slowest sits above the fastest; return those
    spreads as fractions."""
    spreads = {n: ms[-1] / ms[0] - 1 for n, ms in steps.items()}
    for n, ms in steps.items():
        print(f"{n} rank{'s' * (n > 1)}, {len(ms)} runs: steps of {', '.join(f'{t:.2f}' for t in ms)} ms, "
              f"the slowest {spreads[n]:.0%} above the fastest")
    return spreads


def gap_verdict(gap_ms: float, steps: dict[int, list[float]]) -> str:
    """The gap (measured minus predicted step, ms) against the summed ranges of every world size's runs:
    inside them, at their edge (past by under EDGE of them), or beyond."""
    spread_ms = sum(ms[-1] - ms[0] for ms in steps.values())
    past_ms = abs(gap_ms) - spread_ms
    if past_ms <= 0:
        return f"inside the runs' spreads ({spread_ms:.2f} ms): noise, as far as this machine can tell"
    if past_ms < EDGE * spread_ms:
        return f"at the edge of the runs' spreads ({spread_ms:.2f} ms), {past_ms:.2f} ms past: too close to call"
    cost = "leaves out a cost" if gap_ms > 0 else "charges more than the run paid"
    return f"beyond the runs' spreads ({spread_ms:.2f} ms) by {past_ms:.2f} ms: the model {cost}"
