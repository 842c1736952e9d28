"""What torch.profiler saw of a DDP backward, as rows for `plots.ddp_timeline`.

The profiler records every autograd op of backward ("autograd::engine::evaluate_function: <Op>")
on the host, and the collectives where they run: Gloo's all-reduce in its worker threads
("gloo:all_reduce", ProcessGroupGloo's profiling title), NCCL's and oneCCL's as kernels on the
device (with `ProfilerActivity.CUDA` or `.XPU`).  The launch on the host ("c10d::allreduce_") is
left out: it returns at once, and the time that matters is when the reduction ran.  The same
profile exported with `export_chrome_trace` opens in https://ui.perfetto.dev with every thread
and stream.
"""
from __future__ import annotations

BACKWARD_PREFIX = "autograd::engine::evaluate_function: "


def activities(device) -> list:
    """The profiler activities for `device`: the host always, and the accelerator's own timeline.

    Also quiets Kineto, the profiler's engine, which at its default log level prints a start and a
    stop marker ("USDT: ... profiler_start") to stderr; it reads KINETO_LOG_LEVEL once, at its
    first use in the process, so call this before the first profile (a value already set wins)."""
    import os

    from torch.profiler import ProfilerActivity

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")

    chosen = [ProfilerActivity.CPU]
    kind = getattr(device, "type", str(device))
    if kind == "cuda":
        chosen.append(ProfilerActivity.CUDA)
    elif kind == "xpu":
        chosen.append(ProfilerActivity.XPU)
    return chosen


def is_allreduce(name: str, on_device: bool) -> bool:
    """An all-reduce where it ran: Gloo's worker op, or an NCCL/oneCCL kernel on the device."""
    lowered = name.lower()
    if on_device:
        return "allreduce" in lowered or "all_reduce" in lowered
    return lowered.startswith("gloo:all_reduce")


def ddp_events(events, min_share: float = 0.05) -> list[tuple[str, str, float, float]]:
    """(row, label, start_s, end_s) from a profile's `events()`: "backward" per autograd op (its
    name without `Backward0`), "all-reduce" per reduction in the order they started ("bucket 0",
    ...), times in seconds from the start of the first backward op.

    Ops shorter than `min_share` of backward that follow one another are drawn as one bar, "small
    ops", so that a figure stays readable; the trace file keeps every one.  Gradient accumulation
    (`torch::autograd::AccumulateGrad`, where DDP's hooks fire) is not an op of the model's and is
    left out."""
    backward, reductions = [], []
    for event in events:
        on_device = str(getattr(event, "device_type", "")).split(".")[-1] not in ("CPU", "")
        span = (event.time_range.start / 1e6, event.time_range.end / 1e6)
        if not on_device and event.name.startswith(BACKWARD_PREFIX):
            op = event.name[len(BACKWARD_PREFIX):]
            if not op.startswith("torch::autograd::"):
                backward.append((op.removesuffix("Backward0").removesuffix("Backward1") or op, *span))
        elif is_allreduce(event.name, on_device):
            reductions.append(span)
    if not backward:
        raise ValueError("no backward ops in this profile: profile the loss.backward() call")
    backward.sort(key=lambda op: op[1])
    zero = backward[0][1]
    short = min_share * (max(end for *_, end in backward) - zero)
    merged = []
    for label, start, end in backward:
        if end - start < short and merged and merged[-1][0] == "small ops" and start - merged[-1][2] <= short:
            merged[-1] = ("small ops", merged[-1][1], max(end, merged[-1][2]))
        else:
            merged.append(("small ops" if end - start < short else label, start, end))
    rows = [("backward", label, start - zero, end - zero) for label, start, end in merged]
    rows += [("all-reduce", f"bucket {index}", start - zero, end - zero)
             for index, (start, end) in enumerate(sorted(reductions))]
    return rows


def ddp_bucket_bytes(model) -> dict:
    """DDP's own record of its buckets' bytes, as strings such as "3216936, 297984", in bucket order:
    {"first": the first iteration's buckets, "rebuilt": the buckets DDP rebuilt after it (None before)}.

    torch has no public call for this record.  It lives in `DistributedDataParallel._get_ddp_logging_data()`
    (torch/nn/parallel/distributed.py; the keys are set in torch/csrc/distributed/c10d/logger.cpp), a
    private method that may change between torch releases.  It is read here, not in a lesson's cell, so
    that a learner's code uses only public calls."""
    data = model._get_ddp_logging_data()
    return {"first": data.get("bucket_sizes"), "rebuilt": data.get("rebuilt_bucket_sizes")}
