"""Lesson 8's recording of a DeepSpeed engine's accumulation windows: when each call ran, and every
all-reduce the engine made, with its bytes and the call it came from.

`record_windows` trains a few windows of micro batches through the engine's three calls
(`engine(x)`, `engine.backward(loss)`, `engine.step()`) and reads the rank's clock around each.
To see the communication it wraps `deepspeed.comm.all_reduce` for the length of the recording and
puts it back after: DeepSpeed's engine sends its gradient reductions at stages 0-2 through that
function, looked up on the module at each call (engine.py's `allreduce_bucket`, stage_1_and_2.py's
`average_tensor`: `dist.all_reduce`, `dist` being `deepspeed.comm`), so the wrapper sees every one
of them with the buffer it was given.  A profiler (lesson 6's traces) would show the same
all-reduces as gloo or NCCL ops, without the bytes the engine handed over or which of its calls
issued them, and those two are what lesson 8 predicts and checks.

What the wrapper does not see: at stage 3 the gradients travel by `reduce_scatter_fn`, and the
all-gathers of the updated parameters after a step (stages 1 and 2) by DeepSpeed's all-gather
functions; neither is wrapped.  The recording runs on each live rank (a `%%px` cell); the
lesson's figure and checks read its two lists off the ranks.

`call_timings`, `timing_table` and `sorted_calls_figure` turn timed calls from several ranks into
lesson 8's table and figure: each call at its shortest over the ranks, then every call against the
prediction (the fastest, the median, how many within twice the prediction).
"""
from __future__ import annotations

import time


def record_windows(engine, device, generator, windows: int = 2, micro_batch_size: int = 8, comm=None):
    """Run `windows` accumulation windows of `engine` on random MNIST-shaped micro batches drawn
    from `generator`, and return `(events, reduced)` on this rank's clock, in ms from the start:

    * `events`: `(kind, start, end)` for every "forward", "backward", "all-reduce", and `step()`
      call: "optimizer step" where the call applied the optimizer, else "step()";
    * `reduced`: `(micro_step, call, bytes, ms)` for every all-reduce, `call` being the engine's
      call it came from ("forward", "backward" or "step") and `bytes` the size of the buffer given.

    Every clock reading waits for the device first, so on a GPU a bar is when the work ran, not
    when it was queued.  `comm` is the module whose `all_reduce` the engine calls, wrapped for the
    recording and restored after it, even when a call fails (default: `deepspeed.comm`)."""
    import torch
    import torch.nn.functional as F

    from scaledl import timing

    if comm is None:
        from deepspeed import comm
    events, reduced, origin, all_reduce = [], [], time.perf_counter(), comm.all_reduce
    now = {"call": "forward", "micro_step": 0}

    def ms():
        timing.synchronize(device)
        return (time.perf_counter() - origin) * 1e3

    def timed_all_reduce(*args, **kwargs):  # the engine's all-reduces, with their start, end and bytes
        tensor = args[0] if args else kwargs["tensor"]
        start = ms()
        result = all_reduce(*args, **kwargs)
        events.append(("all-reduce", start, ms()))
        reduced.append((now["micro_step"], now["call"], tensor.numel() * tensor.element_size(), events[-1][2] - start))
        return result

    comm.all_reduce = timed_all_reduce
    try:
        for micro_step in range(windows * engine.gradient_accumulation_steps()):
            x = torch.randn(micro_batch_size, 1, 28, 28, generator=generator)
            y = torch.randint(0, 10, (micro_batch_size,), generator=generator)
            now.update(call="forward", micro_step=micro_step)
            start = ms()
            loss = F.cross_entropy(engine(x.to(device)), y.to(device))
            events.append(("forward", start, ms()))
            now["call"], start = "backward", ms()
            engine.backward(loss)
            events.append(("backward", start, ms()))
            now["call"], start, steps_before = "step", ms(), engine.global_steps
            engine.step()
            events.append(("optimizer step" if engine.global_steps > steps_before else "step()", start, ms()))
    finally:
        comm.all_reduce = all_reduce
    return events, reduced


def first_quartile(times: list[float]) -> float:
    """The first quartile of `times`: a quarter of them are shorter.  On shared cores a call that
    waited for a core is longer than the call itself, never shorter, so this statistic ignores the
    stretched calls as long as at least a quarter were not stretched."""
    import statistics

    return statistics.quantiles(times, n=4)[0]


def call_timings(calls_by_name: dict, predicted_ms: float) -> dict:
    """Lesson 8's timing of the whole gradient's all-reduce, for each named list of per-rank records
    (`(micro_step, call, bytes, ms)` per all-reduce, as `record_windows` keeps): each call the
    shortest over the ranks (the rank that joined last waited for no one), then, over the calls,
    {"calls", "fastest", "median" (ms), "fast" (calls within twice `predicted_ms`), "sorted" (every
    call's ms, fastest first)}."""
    import statistics

    from scaledl.perf import comm_estimate

    timings = {}
    for name, reduced_by_rank in calls_by_name.items():
        shortest = comm_estimate.shortest_per_call(reduced_by_rank)
        timings[name] = {"calls": len(shortest), "fastest": min(shortest), "median": statistics.median(shortest),
                         "fast": sum(ms <= 2 * predicted_ms for ms in shortest), "sorted": sorted(shortest)}
    return timings


def timing_table(timings: dict, predicted_ms: float) -> str:
    """`call_timings`' rows as one text table, in ms, with the prediction beside each row."""
    width = max(len(name) for name in timings)
    calls = max(row["calls"] for row in timings.values())
    within = f"calls within 2x (of {calls})"
    lines = [f"{'':{width}}  calls  predicted  fastest  median  {within}"]
    for name, row in timings.items():
        lines.append(f"{name:{width}}  {row['calls']:5}  {predicted_ms:9.2f}  {row['fastest']:7.2f}  "
                     f"{row['median']:6.2f}  {row['fast']:{len(within)}}")
    return "\n".join(lines)


def sorted_calls_figure(timings: dict, predicted_ms: float, title: str = ""):
    """Every timed call of each row of `call_timings`, fastest first, in ms on a log axis, against
    the prediction (a line) and twice the prediction (dashed): the calls near the line ran
    undisturbed, the ones far above it waited for a core."""
    from matplotlib.figure import Figure  # no pyplot: leaves a notebook's backend alone
    from matplotlib.ticker import FormatStrFormatter

    fig = Figure(figsize=(7, 3.2), layout="constrained")
    ax = fig.subplots()
    for (name, row), marker in zip(timings.items(), "os^v"):
        ax.plot(range(1, row["calls"] + 1), row["sorted"], marker=marker, linestyle="-", ms=5, label=name)
    ax.axhline(predicted_ms, color="black", linewidth=1, label=f"predicted, {predicted_ms:.2f} ms")
    ax.axhline(2 * predicted_ms, color="black", linewidth=1, linestyle="--", label="twice the prediction")
    ax.set(yscale="log", xlabel="calls, fastest first", ylabel="ms (shortest over the ranks)")
    ax.set_title(title, fontsize=10)
    for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):  # 0.5, 2, not 5x10^-1
        axis(FormatStrFormatter("%g"))
    ax.legend(fontsize=8, frameon=False)
    return fig


def probe_all_reduces(model, device, generator, sizes: list[int], calls: int = 15, micro_batch_size: int = 8,
                      all_reduce=None, whole_all_reduce=None, barrier=None):
    """Lesson 8's probe: all-reduces timed right after a backward, where the DeepSpeed engine makes its call.

    For each size in `sizes` (floats), one untimed warm-up, then `calls` times: a backward of `model` on
    a random micro batch from `generator`, then one timed all-reduce of a buffer of that size; a barrier
    ends each size.  Then `calls` more backwards, each followed by a timed all-reduce of a buffer as
    large as the whole gradient, through `whole_all_reduce` (default: `deepspeed.comm.all_reduce`, the
    function the DeepSpeed engine calls).  Every clock reading waits for the device first.

    Returns `(laps, whole)`: `laps[size]` is this rank's `calls` times in seconds; `whole` holds one
    `(call, "backward", bytes, ms)` per call, as `record_windows` keeps the engine's calls."""
    import torch
    import torch.nn.functional as F

    from scaledl import timing

    all_reduce = all_reduce or torch.distributed.all_reduce
    barrier = barrier or torch.distributed.barrier
    if whole_all_reduce is None:
        from deepspeed import comm

        whole_all_reduce = comm.all_reduce

    def timed(buffer, reduce):
        timing.synchronize(device)  # nothing queued before the clock starts
        start = time.perf_counter()
        reduce(buffer)
        timing.synchronize(device)  # a GPU collective returns before it has finished
        return time.perf_counter() - start

    def backward():
        x = torch.randn(micro_batch_size, 1, 28, 28, generator=generator)
        y = torch.randint(0, 10, (micro_batch_size,), generator=generator)
        F.cross_entropy(model(x.to(device)), y.to(device)).backward()

    laps = []
    for n in sizes:
        buffer = torch.ones(n, device=device)
        all_reduce(buffer)  # warm-up, not timed
        after_backward = []
        for _ in range(calls):
            backward()
            after_backward.append(timed(buffer, all_reduce))
        barrier()
        laps.append(after_backward)
    gradient = torch.ones(sum(param.numel() for param in model.parameters()), device=device)
    whole = []
    for call in range(calls):
        backward()
        whole.append((call, "backward", gradient.numel() * gradient.element_size(),
                      timed(gradient, whole_all_reduce) * 1e3))
    return laps, whole
