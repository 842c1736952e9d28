"""Lesson 2's profile of a training step, read two ways.

`profile_steps` runs a step a few times under `torch.profiler`, prints the operators sorted by
self time, then their self time summed by kind (convolutions, pooling, matrix multiplies, the
optimizer's step). Only the operators' rows ("aten::...", "Optimizer....") are summed: a GPU
kernel's row holds the same time again. `gap_split` prints that sum per step beside the table's own total
(which also counts the rows that are not operators, such as autograd's `...Backward0`) and beside
the stopwatch's step without the profiler (which also times the work between operators, and none of
the profiler's recording), in one short line. It then divides the sum into the operators that do the
counted FLOPs (convolutions and matrix multiplies) and the rest, and says which part of the profiled step's
gap over its FLOP floor is larger. `rest_growth` prints one verdict on how that gap, the rest of the step, grew
with the batch over repeated stopwatch runs, with the range the runs allow. `a100_ceiling` divides the
step's FLOPs, by kind, by NVIDIA's published A100 peaks (not measured) at the precision this torch
allows for each kind.
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

# Published peaks (NVIDIA A100 datasheet), not measured.
A100_PEAK = {"FP32": 19.5e12, "TF32 tensor cores": 156e12}

KINDS = {
    "convolutions (forward and backward)": lambda key: "conv" in key,
    "pooling": lambda key: "pool" in key,
    "matrix multiplies": lambda key: key.endswith("mm"),
    "optimizer step": lambda key: key.startswith("Optimizer.step"),
}
FLOP_KINDS = ("convolutions (forward and backward)", "matrix multiplies")  # the kinds with a FLOP formula


@dataclass
class StepProfile:
    events: object  # the profiler's key_averages()
    sort_by: str  # "self_device_time_total" on a GPU, else "self_cpu_time_total"
    total_us: float  # the operators' self time, summed, in microseconds
    share: dict  # kind -> its fraction of total_us
    num_steps: int
    table_us: float | None = None  # the total the table prints under its rows, in microseconds


def self_time_by_kind(events, sort_by: str) -> tuple[float, dict]:
    """The operators' summed self time (microseconds) and each kind's share of it."""
    operators = [event for event in events if event.key.startswith(("aten::", "Optimizer."))]
    total = sum(getattr(event, sort_by) for event in operators)
    share = {kind: sum(getattr(event, sort_by) for event in operators if match(event.key)) / total
             for kind, match in KINDS.items()}
    return total, share


def table_total(events, sort_by: str) -> float:
    """The total the profiler's table prints under its rows (torch/autograd/profiler_util.py,
    `_build_table`): every row's self CPU time, or on a GPU the self time of the device's rows (the
    kernels)."""
    if sort_by == "self_cpu_time_total":
        return sum(event.self_cpu_time_total for event in events)
    from torch.autograd import DeviceType

    return sum(event.self_device_time_total for event in events if event.device_type != DeviceType.CPU)


def profile_steps(step, device, num_steps: int = 5, row_limit: int = 8, show: bool = True) -> StepProfile:
    """Profile `num_steps` calls of `step()` (synchronized at the end), print the table and the
    self time by kind (unless `show` is false), and return both."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # keeps Kineto's start and stop lines off stderr
    from torch.profiler import ProfilerActivity, profile

    from scaledl import timing

    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as profiler:
        for _ in range(num_steps):
            step()
        timing.synchronize(device)
    sort_by = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    events = profiler.key_averages()
    total, share = self_time_by_kind(events, sort_by)
    if show:
        print(events.table(sort_by=sort_by, row_limit=row_limit))
        print(f"operators' {'GPU' if on_gpu else 'CPU'} self time by kind: "
              + ", ".join(f"{kind} {value:.0%}" for kind, value in sorted(share.items(), key=lambda item: -item[1])))
    return StepProfile(events, sort_by, total, share, num_steps, table_total(events, sort_by))


def gap_split(profile: StepProfile, flops: float, throughput: float, predicted_s: float,
              measured_s: float | None = None) -> dict:
    """Print and return the seconds a step spends in the operators with counted FLOPs and in the
    rest, the first part's rate, and which part holds more of the gap over `predicted_s`. Given the
    stopwatch's step without the profiler, `measured_s`, first set the operators' sum beside it."""
    flop_share = sum(profile.share[kind] for kind in FLOP_KINDS)
    operators_s = profile.total_us / 1e6 / profile.num_steps  # the operators' rows, per step
    on_cpu = profile.sort_by == "self_cpu_time_total"
    flop_ops_s = flop_share * operators_s
    other_s = (1 - flop_share) * operators_s
    rate = flops / flop_ops_s
    # Three short lines. Why the readings differ is the lesson's to say: the table also counts rows that are not
    # operators (autograd's `...Backward0`); on a CPU the stopwatch times the Python between operators but not the
    # profiler's recording; on a GPU the rows are kernel time, and the stopwatch adds the device's waits.
    readings = [f"per step: the {'operators' if on_cpu else 'kernels'}' rows {operators_s * 1e3:.2f} ms"]
    if profile.table_us is not None:
        readings.append(f"the table's total {profile.table_us / 1e3 / profile.num_steps:.2f} ms")
    if measured_s is not None:
        readings.append(f"the stopwatch without the profiler {measured_s * 1e3:.2f} ms")
    print(", ".join(readings))
    print(f"convolutions and matrix multiplies: {flop_ops_s * 1e3:.2f} ms per step at {rate / 1e9:,.1f} GFLOP/s, "
          f"{rate / throughput:.0%} of the large matmul's rate")
    others_larger = other_s > flop_ops_s - predicted_s  # the gap: the products' time over the floor, and the rest
    # Read against the profiled step, which the two parts sum to: the stopwatch's step, without the profiler, differs.
    print(f"all other operators: {other_s * 1e3:.2f} ms of the profiled step's {operators_s * 1e3:.2f} ms, "
          "for 0 counted FLOPs" + (": the larger part of its gap" if others_larger
                                  else "; the products, slower than the large matmul, hold more of its gap"))
    return {"flop_ops_s": flop_ops_s, "other_s": other_s, "rate": rate}


def rest_growth(rests_small, rests_large, scale: float, where: str = "this device") -> dict:
    """Print one line on how the rest of a step (its time outside the FLOP floor) grew from one batch to a
    batch `scale` times larger, and return the numbers.  `rests_small` and `rests_large` hold one rest per
    run of the stopwatch, in seconds.

    The growth is the ratio of the two medians.  A ratio of two timings moves by the spread of both, so the
    range the runs allow runs from the fastest large-batch run over the slowest small-batch one to the
    slowest over the fastest.  The verdict reads where that range lies against 1x (a fixed cost per step)
    and `scale` (work per sample); a range that holds both cannot tell them apart."""
    if min(rests_small) <= 0 or min(rests_large) <= 0:
        print(f"a run on {where} took no longer than its floor: no rest to compare")
        return {"growth": None, "low": None, "high": None, "verdict": "no rest"}
    growth = statistics.median(rests_large) / statistics.median(rests_small)
    low, high = min(rests_large) / max(rests_small), max(rests_large) / min(rests_small)
    if low <= 1 and high >= scale:
        verdict = "too noisy to tell a fixed cost from work per sample"
    elif low <= 1:
        verdict = "a fixed cost per step: the hypothesis holds"
    elif high < scale:
        verdict = "partly fixed, partly per sample: the hypothesis holds in part"
    elif low <= scale:
        verdict = "work per sample: the hypothesis fails"
    else:
        verdict = "work per sample, slower at the larger batch: the hypothesis fails"
    print(f"the rest grew {growth:.1f}x for {scale:g}x the batch (the runs allow {low:.1f}x to {high:.1f}x): "
          f"on {where}, {verdict}")
    return {"growth": growth, "low": low, "high": high, "verdict": verdict}


def a100_ceiling(flop_counts: dict, batch_size: int, tf32: dict) -> float:
    """Print the step's FLOPs by kind at the A100 peak that `tf32` allows for it ({"convolutions":
    bool, "matrix multiplies": bool}), and return the step's seconds at those peaks.
    `flop_counts` is FlopCounterMode's count by operator; what is not a convolution is a matrix
    multiply (the only two kinds with a FLOP formula in this model)."""
    flops = sum(flop_counts.values())
    kind_flops = {"convolutions": sum(count for op, count in flop_counts.items() if "convolution" in str(op))}
    kind_flops["matrix multiplies"] = flops - kind_flops["convolutions"]
    print("TF32 allowed in this torch: " + ", ".join(f"{kind} {allowed}" for kind, allowed in tf32.items()))
    at_peak_s = 0.0
    for kind, kind_flop in kind_flops.items():
        peak = "TF32 tensor cores" if tf32[kind] else "FP32"
        at_peak_s += kind_flop / A100_PEAK[peak]
        print(f"{kind}: {kind_flop / 1e9:.4f} GFLOP ({kind_flop / flops:.0%} of the step) at the {peak} peak: "
              f"{kind_flop / A100_PEAK[peak] * 1e6:.1f} us")
    print(f"the step at those peaks: {at_peak_s * 1e6:.1f} us, "
          f"a ceiling of about {batch_size / at_peak_s / 1e6:.2g} M samples/s "
          f"(all FP32: {flops / A100_PEAK['FP32'] * 1e6:.1f} us; all TF32: "
          f"{flops / A100_PEAK['TF32 tensor cores'] * 1e6:.1f} us)")
    return at_peak_s
