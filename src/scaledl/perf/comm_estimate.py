"""The communication arithmetic lessons 6 and 8 do before they measure, and the reading of the measurement.

* `ddp_buckets`: the buckets DDP builds for a model, from its parameters alone.  DDP records the order
  in which gradients become ready in its first iteration and rebuilds its buckets in that order
  (`Reducer::rebuild_buckets`, torch/csrc/distributed/c10d/reducer.cpp, torch 2.13); for a model whose
  layers run one after another that is the reverse of the parameters' order.  A bucket takes tensors
  until its bytes reach its cap, so it may exceed the cap by one tensor (`compute_bucket_assignment_by_size`
  in the same file); the first bucket's cap is `torch.distributed._DEFAULT_FIRST_BUCKET_BYTES` (1 MiB)
  when `bucket_cap_mb` is left at its default, else the same as the others (`_BucketCapacityConfig`,
  torch/nn/parallel/distributed.py).
* `ddp_measured`: what a DDP timeline (`scaledl.workshop.traces.ddp_events`) shows per rank: each bucket's
  all-reduce, the end of backward, and the tail of communication after it.
* `reductions_per_window`: the all-reduces a DeepSpeed engine made per accumulation window, from a
  record of each call.

Lesson 8's exercise on this arithmetic is checked by `scaledl.workshop.checks.lesson_08.check_stage2_window`
(against the live ranks through `check_window_prediction`), and the predicted-against-measured figure is
`scaledl.workshop.plots.prediction_figure`.
"""
from __future__ import annotations

from scaledl.perf.predict import DDP_BUCKET_BYTES

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
    """Per rank, from `scaledl.workshop.traces.ddp_events` rows (row, label, start_s, end_s): "buckets_s", each
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
