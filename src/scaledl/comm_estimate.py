"""The communication arithmetic lessons 6 and 8 do before they measure, and the reading of the measurement.

* `ddp_buckets`: the buckets DDP builds for a model, from its parameters alone.  DDP records the order
  in which gradients become ready in its first iteration and rebuilds its buckets in that order
  (`Reducer::rebuild_buckets`, torch/csrc/distributed/c10d/reducer.cpp, torch 2.13); for a model whose
  layers run one after another that is the reverse of the parameters' order.  A bucket takes tensors
  until its bytes reach its cap, so it may exceed the cap by one tensor (`compute_bucket_assignment_by_size`
  in the same file); the first bucket's cap is `torch.distributed._DEFAULT_FIRST_BUCKET_BYTES` (1 MiB)
  when `bucket_cap_mb` is left at its default, else the same as the others (`_BucketCapacityConfig`,
  torch/nn/parallel/distributed.py).
* `ddp_measured`: what a DDP timeline (`scaledl.traces.ddp_events`) shows per rank: each bucket's
  all-reduce, the end of backward, and the tail of communication after it.
* `reductions_per_window`, `shortest_per_call`: the all-reduces a DeepSpeed engine made per
  accumulation window, and each call's time over the ranks, from a record of each call.
* `check_window_prediction`: lesson 8's exercise, a prediction checked against the ranks' measurement.
* `prediction_figure`: predicted against measured, one pair of bars per quantity, each rank a dot.
"""
from __future__ import annotations

import math

from scaledl.grader import _unfinished, _verdict
from scaledl.predict import DDP_BUCKET_BYTES

MIB = 2**20
FIRST_BUCKET_BYTES = MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES (torch 2.13)


def ddp_buckets(model, bucket_cap_mb: float | None = None) -> list[dict]:
    """DDP's buckets after its rebuild, predicted from `model`: [{"names", "bytes", "cap"}] in the
    order they are all-reduced.  The parameters that need a gradient are taken in reverse order (the
    order their gradients become ready when the layers run one after another); each (dtype, device)
    fills buckets of its own, as torch's reducer keeps them apart."""
    cap = DDP_BUCKET_BYTES if bucket_cap_mb is None else int(bucket_cap_mb * MIB)
    limits = [FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap, cap]
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad][::-1]
    closed, filling, done_per_key = [], {}, {}
    for name, param in params:
        key = (param.dtype, param.device)
        bucket = filling.setdefault(key, {"names": [], "bytes": 0,
                                          "cap": limits[min(done_per_key.get(key, 0), len(limits) - 1)]})
        bucket["names"].append(name)
        bucket["bytes"] += param.numel() * param.element_size()
        if bucket["bytes"] >= bucket["cap"]:  # closes once it reaches its cap, past it by this tensor
            closed.append(filling.pop(key))
            done_per_key[key] = done_per_key.get(key, 0) + 1
    return closed + list(filling.values())


def ddp_measured(events_by_rank: list) -> list[dict]:
    """Per rank, from `scaledl.traces.ddp_events` rows (row, label, start_s, end_s): "buckets_s", each
    all-reduce's duration in launch order; "backward_s", when its last backward op ended; "exposed_s",
    how long the communication went on after that (0 when it ended first)."""
    out = []
    for events in events_by_rank:
        backward_end = max(end for row, _, _, end in events if row == "backward")
        reductions = sorted((start, end) for row, _, start, end in events if row == "all-reduce")
        last_end = max((end for _, end in reductions), default=backward_end)
        out.append({"buckets_s": [end - start for start, end in reductions], "backward_s": backward_end,
                    "exposed_s": max(0.0, last_end - backward_end)})
    return out


def reductions_per_window(reduced: list, accumulation_steps: int, phase: str = "backward") -> list[dict]:
    """The all-reduces of each finished accumulation window, from `reduced`, one (micro_step, phase,
    bytes, ms) per call: [{"all_reduces", "bytes", "ms"}] counting the calls made in `phase` only
    ("backward" or "step")."""
    if accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be at least 1, got {accumulation_steps}")
    windows = 1 + max((micro_step for micro_step, *_ in reduced), default=-1) // accumulation_steps
    out = [{"all_reduces": 0, "bytes": 0, "ms": 0.0} for _ in range(windows)]
    for micro_step, where, nbytes, ms in reduced:
        if where == phase:
            window = out[micro_step // accumulation_steps]
            window["all_reduces"] += 1
            window["bytes"] += nbytes
            window["ms"] += ms
    return out


def shortest_per_call(reduced_by_rank: list, phase: str = "backward") -> list[float]:
    """Each all-reduce made in `phase`, matched across the ranks by its place in their records (every
    rank makes the same collectives in the same order): the shortest time over the ranks, in ms.
    The rank that joined a call last waited for no one, so its time is about the call's own."""
    calls = [[ms for _, where, _, ms in reduced if where == phase] for reduced in reduced_by_rank]
    if len({len(each) for each in calls}) > 1:
        raise ValueError(f"the ranks recorded different numbers of all-reduces: {[len(each) for each in calls]}")
    return [min(times) for times in zip(*calls)]


def check_window_prediction(predicted, measured, grad_bytes: int, world_size: int, accumulation_steps: int) -> bool:
    """Lesson 8: `predicted` = {"all_reduces": n, "bytes": b}, what ZeRO stage 2's backwards all-reduce in
    one accumulation window, against `measured` (the same keys, from the live ranks).  It passes only on
    the measurement; the hints name the usual wrong models of stage 2 (`grad_bytes` of gradients,
    all-reduced whole per backward by DeepSpeed 0.19.8's default `use_multi_rank_bucket_allreduce`)."""
    if predicted is None:
        return _unfinished("stage2_window")
    if not isinstance(predicted, dict) or not {"all_reduces", "bytes"} <= set(predicted):
        return _verdict(False, "`stage2_window` needs two keys: {\"all_reduces\": ..., \"bytes\": ...}")
    if not measured:
        return _verdict(False, "no measurement: run the stage-2 cell above on the ranks first")
    calls, nbytes = predicted["all_reduces"], predicted["bytes"]
    want_calls, want_bytes = measured["all_reduces"], measured["bytes"]
    if calls != want_calls:
        if calls == 1:
            hint = "one per window is stages 0 and 1; stage 2 keeps no whole gradient between backwards"
        elif calls > accumulation_steps:
            hint = "the engine flattens a bucket's gradients into one buffer: one call per bucket, not per tensor"
        else:
            hint = "count the backwards in a window that reduce"
        return _verdict(False, f"{calls} all-reduces, the ranks made {want_calls}: {hint}")
    if math.isclose(nbytes, want_bytes):
        return _verdict(True, f"{want_calls} all-reduces in a window's backwards, {want_bytes:,} bytes in all, "
                              f"as the ranks measured")
    p, a = world_size, accumulation_steps
    wrong = [(a * grad_bytes / p, "each rank keeps 1/world_size of the sum, but the call carries the whole bucket"),
             (2 * (p - 1) / p * a * grad_bytes, "that is what the ring sends per rank: count the buffer all-reduced"),
             (grad_bytes, "those are one backward's bytes: add up the window"),
             (8 * a * grad_bytes, "that counts bits: count bytes, 4 for each fp32 gradient"),
             (a * grad_bytes / 4, "that counts gradients: each fp32 gradient is 4 bytes")]
    hint = next((text for value, text in wrong if math.isclose(nbytes, value)),
                "the gradients of the whole model, in fp32, in every backward of the window")
    return _verdict(False, f"{nbytes:,} bytes, the ranks all-reduced {want_bytes:,}: {hint}")


def prediction_figure(labels: list[str], predicted_s: list[float], measured_s_by_rank: list[list[float]],
                      title: str):
    """Predicted (light bar) against measured (dark bar: the shortest over the ranks; a dot per rank)
    for each quantity in `labels`, in ms.  `measured_s_by_rank[rank][i]` is rank's value of labels[i].
    The shortest is the rank that waited least: the longer ones also waited for a slower rank.  The
    axis ends at 1.5 times the longest bar; a rank beyond it is a triangle at the edge, with its value."""
    from matplotlib.figure import Figure  # no pyplot: leaves a notebook's backend alone

    fig = Figure(figsize=(7, 1.2 + 0.7 * len(labels)), layout="constrained")
    ax = fig.subplots()
    values = [[rank[i] * 1e3 for rank in measured_s_by_rank if i < len(rank)] for i in range(len(labels))]
    right = 1.5 * max([t * 1e3 for t in predicted_s] + [min(v) for v in values if v] + [1e-3])
    for i, label in enumerate(labels):
        ax.barh(i - 0.18, predicted_s[i] * 1e3, height=0.34, color="#E8B4B5", edgecolor="black", linewidth=0.5,
                label="predicted" if i == 0 else None)
        if not values[i]:
            continue
        ax.barh(i + 0.18, min(values[i]), height=0.34, color="#C44E52", edgecolor="black", linewidth=0.5,
                label="measured, shortest over the ranks" if i == 0 else None)
        inside = [v for v in values[i] if v <= right]
        ax.plot(inside, [i + 0.18] * len(inside), "o", color="black", ms=4,
                label="measured, each rank" if i == 0 else None)
        for v in (v for v in values[i] if v > right):  # a rank that waited long: at the edge, with its value
            ax.plot(right, i + 0.18, ">", color="black", ms=5)
            ax.annotate(f"{v:.3g} ms", (right, i + 0.18), xytext=(-4, 5), textcoords="offset points", ha="right",
                        fontsize=7)
    ax.set(yticks=range(len(labels)), yticklabels=labels, xlabel="ms", title=title, ylim=(len(labels) - 0.5, -0.5),
           xlim=(0, right * 1.02))
    handles, names = ax.get_legend_handles_labels()
    order = [names.index(name) for name in ("predicted", "measured, shortest over the ranks", "measured, each rank")
             if name in names]
    fig.legend([handles[i] for i in order], [names[i] for i in order], loc="outside lower center", ncols=3,
               fontsize=7, frameon=False)
    return fig
