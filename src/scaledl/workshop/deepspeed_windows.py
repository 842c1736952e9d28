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

