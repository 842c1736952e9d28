"""Lesson 6's checks: DDP keeps ranks in sync, accumulates without extra all-reduces, and buckets."""
from __future__ import annotations

import math

from scaledl.workshop.checks.common import _attempt, _FAILED, _unfinished, _verdict

_IN_SYNC_FIXES = {
    "ddp": "wrap the model in DDP before the first step (it broadcasts rank 0's weights and averages gradients)",
    "deepspeed": "train through the engine deepspeed.initialize returned: engine(x), engine.backward, engine.step",
}


def check_in_sync(fingerprints_by_rank: list, framework: str = "ddp") -> bool:
    """After a data-parallel step every rank must hold bit-identical parameters."""
    if fingerprints_by_rank is None:
        return False
    if len(fingerprints_by_rank) < 2:  # one rank agrees with itself whatever the code does
        return _verdict(False, "one rank has nobody to agree with: start 2 or more (WORLD_SIZE = 2)")
    if any(f is None for f in fingerprints_by_rank):
        return _verdict(False, "the training cell did not finish on every rank: finish the exercise and run it")
    if len(set(fingerprints_by_rank)) == 1:
        return _verdict(True, f"all {len(fingerprints_by_rank)} ranks hold identical parameters")
    differing = [rank for rank, f in enumerate(fingerprints_by_rank) if f != fingerprints_by_rank[0]]
    return _verdict(False, f"rank {differing[0]} holds different parameters than rank 0: {_IN_SYNC_FIXES[framework]}")


def _every_rank_ran(by_rank: list | None, what: str) -> bool:
    """Whether `what` left a value on every rank, of 2 or more; if not, the FAIL line that says so."""
    if by_rank is None or any(value is None for value in by_rank):
        return _verdict(False, f"{what} did not run on every rank: run it, then this check")
    if len(by_rank) < 2:  # one rank agrees with itself whatever DDP does
        return _verdict(False, "one rank has nobody to agree with: start 2 or more (WORLD_SIZE = 2)")
    return True


def check_wrap_prediction(predicted, wrapped_by_rank: list, before_by_rank: list) -> bool:
    """Exercise 1b: whose weights each rank holds right after `DDP(model)`.  `predicted` lists, in rank order,
    one rank number per rank (the rank whose weights it then holds); fingerprints, as the ranks print them, are
    taken too.  Each rank number becomes that rank's fingerprint from before the wrap, to be compared with
    what the ranks print after it.  DDP's constructor broadcasts rank 0's parameters (and buffers), so every
    rank then holds rank 0's: `[0] * world_size`."""
    if predicted is None:
        return _unfinished("after_wrap")
    if not _every_rank_ran(wrapped_by_rank, "the wrap cell"):
        return False
    if isinstance(predicted, (str, int)) or not hasattr(predicted, "__len__"):
        return _verdict(False, f"`after_wrap` is {predicted!r}: give a list, one rank number per rank, in rank order")
    wrapped, before = [str(f)[:12] for f in wrapped_by_rank], [str(f)[:12] for f in before_by_rank]
    if len(predicted) != len(wrapped):
        return _verdict(False, f"give one entry per rank: your list has {len(predicted)} for {len(wrapped)} ranks")
    as_fingerprints = []
    for entry in predicted:
        if isinstance(entry, int) and not isinstance(entry, bool):
            if not 0 <= entry < len(before):
                return _verdict(False, f"your list names rank {entry}, but the ranks are 0 to {len(before) - 1}")
            as_fingerprints.append(before[entry])
        else:
            as_fingerprints.append(str(entry)[:12])
    predicted = as_fingerprints
    if predicted == wrapped:
        return _verdict(True, f"right after the wrap every rank holds rank 0's weights ({wrapped[0]}): DDP's "
                              "constructor broadcast them, so that every copy starts equal")
    if predicted == before:
        return _verdict(False, "in your list each rank keeps its own weights: the copies would then train apart; "
                               "what does DDP's constructor send so that they start equal?")
    if len(set(predicted)) == 1 and predicted[0] in before:
        return _verdict(False, f"every rank holds rank {before.index(predicted[0])}'s weights in your list: "
                               "which rank's does the constructor broadcast?")
    return _verdict(False, "your list is not what the ranks print: after the wrap each rank holds the weights "
                           "that one of the ranks built")


def check_uneven_step(predicted, measured_by_rank: list, tolerance: float = 0.02) -> bool:
    """Exercise 1b's second answer: after a DDP step in which rank 0's plain SGD uses lr and the other ranks'
    use 2 lr, rank 1's weights minus rank 0's are k x g, with g the gradient rank 0 holds after the step's
    backward.  `predicted` is k.  Each rank gives {"lr": its learning rate, "grads": a fingerprint of its .grad,
    "grad": its .grad flattened, "step": its weights after the step minus before, flattened}.  DDP averages the
    gradients in every backward and sends the weights only at construction, so the ranks start the step equal,
    hold the same g, and rank 1 moves (2 lr - lr) x g further than rank 0: k = -lr, -0.1 at the lesson's lr."""
    import numpy as np

    if predicted is None:
        return _unfinished("weight_gap")
    if not _every_rank_ran(measured_by_rank, "the uneven step"):
        return False
    if isinstance(predicted, bool) or not isinstance(predicted, (int, float)) or not math.isfinite(predicted):
        return _verdict(False, f"`weight_gap` is {predicted!r}: give one number, k in k x g")
    if len({m["grads"] for m in measured_by_rank}) != 1:
        return _verdict(False, "the ranks hold different gradients after the uneven step's backward: run the cells "
                               "from the wrap on, in order, so that the model is wrapped in DDP")
    first, second = measured_by_rank[0], measured_by_rank[1]
    lr, further = first["lr"], second["lr"] - first["lr"]  # rank 0's learning rate, and rank 1's extra one
    gradient = np.asarray(first["grad"], dtype=np.float64)
    gap = np.asarray(second["step"], dtype=np.float64) - np.asarray(first["step"], dtype=np.float64)
    measured = float(gap @ gradient / (gradient @ gradient))
    scale = max(abs(measured), lr)  # the tolerance is relative to the gap, or to lr where the gap is 0
    if abs(predicted - measured) <= tolerance * scale:
        return _verdict(True, f"rank 1's weights minus rank 0's are {measured:.3f} x g: both ranks held the same "
                              f"averaged g and the same weights before the step, and rank 1's optimizer moved its "
                              f"copy a further {further:g} x g against g. DDP sends the weights only at "
                              "construction, so nothing pulls that copy back")
    if predicted == 0:
        hint = ("you predicted equal weights: does DDP send anything after its constructor other than the "
                "gradients, and what does each rank's optimizer then do with them?")
    elif (predicted > 0) != (measured > 0):
        hint = "look at the sign: each rank steps against g, and the rank with the larger learning rate goes further"
    elif abs(predicted * lr - measured) <= tolerance * scale:
        hint = (f"that is the gap in units of {lr:g} x g: give it as a multiple of g itself, so multiply by {lr:g}")
    else:
        hint = ("not what the ranks hold: start from the weights every rank holds before the uneven step, and take "
                "each rank's step with its own learning rate and the gradient it holds after backward")
    return _verdict(False, f"you predicted {predicted:g} x g: {hint}")


# (local rank, the GPUs its process sees, as CUDA_VISIBLE_DEVICES lists them, what the case is,
#  the device it must compute on, the GPU number behind that device)
_RANK_DEVICE_CASES = [
    (0, [2, 3], "local rank 0 of 2, started with CUDA_VISIBLE_DEVICES=2,3 on a 4-GPU node", "cuda:0", 2),
    (1, [2, 3], "local rank 1 of 2, started with CUDA_VISIBLE_DEVICES=2,3 on a 4-GPU node", "cuda:1", 3),
    (1, [2], "local rank 1 under the Polaris job's wrapper, which sets CUDA_VISIBLE_DEVICES=2 for it", "cuda:0", 2),
    (2, [0, 1, 2, 3], "local rank 2 on a 4-GPU node where every rank sees all 4 GPUs", "cuda:2", 2),
    (1, [], "local rank 1 on a machine without a GPU", "cpu", None),
]


def check_rank_device(rank_device) -> bool:
    """`rank_device(local_rank, visible) -> (torch.device, gpu)`: the device a rank computes on, and the GPU
    number (as CUDA_VISIBLE_DEVICES names the node's GPUs) behind it.  `visible` lists the GPUs the rank's
    process sees, in CUDA_VISIBLE_DEVICES' order.  CUDA numbers the GPUs a process sees from 0 in that order, so
    the device is cuda:<local_rank % len(visible)> and the GPU is visible[local_rank % len(visible)]; with none,
    the CPU and None (`scaledl.setup` takes cuda:<local_rank % visible>)."""
    import torch

    if rank_device is None:
        return _unfinished("rank_device")
    for local_rank, visible, case, want, want_gpu in _RANK_DEVICE_CASES:
        got = _attempt("rank_device", case, lambda: rank_device(local_rank, list(visible)))
        if got is _FAILED:
            return False
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return _verdict(False, f"{case}: rank_device returned {got!r}: return a pair (device, GPU number), "
                                   "such as (torch.device('cuda', 0), 3) or (torch.device('cpu'), None)")
        try:
            device = torch.device(got[0])
        except (TypeError, RuntimeError):
            return _verdict(False, f"{case}: rank_device returned the device {got[0]!r}: return a torch.device, "
                                   "such as torch.device('cuda', 0) or torch.device('cpu')")
        gpu = got[1]
        right_device = (device.type, device.index if device.type == "cuda" else None) == (
            torch.device(want).type, torch.device(want).index)
        if right_device and gpu == want_gpu and (gpu is None) == (want_gpu is None):
            continue
        if not right_device:
            if want == "cpu":
                hint = "a rank that sees no GPU computes on the CPU"
            elif device.type == "cuda" and device.index is None:
                hint = "name the GPU's index: a bare 'cuda' is whichever GPU is current, not this rank's own"
            elif device.type != "cuda":
                hint = "this rank sees a GPU: it computes on one, not on the CPU"
            elif device.index >= len(visible):
                hint = (f"this process sees {len(visible)} GPU(s), and CUDA numbers those from 0: "
                        f"cuda:{device.index} does not exist in it")
            else:
                hint = "the local ranks share out the GPUs they see, one each: which one is this rank's?"
            return _verdict(False, f"{case}: rank_device gave the device {device}, which is wrong: {hint}")
        if want_gpu is None:
            hint = "on the CPU there is no GPU behind the device: give None"
        else:
            hint = ("cuda:i inside a process is not the node's GPU i: which of the GPUs that CUDA_VISIBLE_DEVICES "
                    "names does the process call cuda:i?")
        return _verdict(False, f"{case}: the device is right, but the GPU behind it is not {gpu!r}: {hint}")
    return _verdict(True, f"all {len(_RANK_DEVICE_CASES)} ranks on the right device and GPU: a process numbers the "
                          "GPUs it sees from 0, in the order CUDA_VISIBLE_DEVICES lists them")


def check_accumulation(reports_by_rank: list, accumulation_steps: int, tolerance: float = 1e-5) -> bool:
    """DDP gradient accumulation.  Each rank reports {"max_error": largest difference of its
    weights from one SGD step on the big batch (all ranks' micro batches), "all_reduces": bucket
    all-reduces in the window, "buckets": all-reduces one synchronized backward makes}, and
    optionally the same difference from a step of accumulation_steps x lr ("error_unscaled": the
    micro losses were not divided) and of lr / world_size ("error_over_ranks": divided by the
    ranks too, which DDP's average already does), and "predicted": the learner's all-reduces per
    window (None: not set; absent: not asked)."""
    if reports_by_rank is None:
        return False
    if len(reports_by_rank) < 2:  # one rank: no all-reduce to skip, no other rank's samples to match
        return _verdict(False, "one rank has nothing to synchronize with: start 2 or more (WORLD_SIZE = 2)")
    if any(r is None for r in reports_by_rank):
        return _verdict(False, "the accumulation cell did not finish on every rank: finish the exercise and run it")
    buckets = reports_by_rank[0]["buckets"]
    calls = max(r["all_reduces"] for r in reports_by_rank)
    if min(r["all_reduces"] for r in reports_by_rank) == 0:
        return _verdict(False, "no gradient was all-reduced in the window: the last micro batch's backward must "
                               "synchronize, or the ranks drift apart")
    if calls > buckets:
        return _verdict(False, f"{calls} all-reduces in a window of {accumulation_steps} micro batches, "
                               f"{calls / buckets:g} backwards' worth: skip the synchronization on all but the last "
                               "micro batch (DDP has a context manager for it; the forward belongs inside it too)")
    worst = max(reports_by_rank, key=lambda r: r["max_error"])
    error = worst["max_error"]
    if not error < tolerance:
        world_size = len(reports_by_rank)
        if worst.get("error_unscaled", math.inf) < tolerance:
            hint = (f"the step is {accumulation_steps}x too large: divide each micro batch's loss by "
                    f"{accumulation_steps}, so that the window's gradient is the mean over its samples")
        elif worst.get("error_over_ranks", math.inf) < tolerance:
            hint = (f"the step is {world_size}x too small: DDP already averages over the ranks, so divide each "
                    f"micro batch's loss by the accumulation steps ({accumulation_steps}) only")
        else:
            hint = ("one all-reduce, but not of the whole window: the synchronized backward must be the last, "
                    f"after the other micro batches accumulated; each loss divided by {accumulation_steps}, "
                    "one optimizer step per window")
        return _verdict(False, f"the weights differ from one big-batch step by {error:.2g}: {hint}")
    if "predicted" in reports_by_rank[0]:  # the learner's count, when the cell reports one
        predicted = reports_by_rank[0]["predicted"]
        if predicted is None:
            return _verdict(False, "the loop is right; now set predicted_all_reduces to the all-reduces you expect "
                                   "in one window")
        if predicted != buckets:
            return _verdict(False, f"the loop is right, but you predicted {predicted} all-reduce(s) a window and DDP "
                                   f"made {calls}: one per bucket, in the last backward only, and this model's "
                                   f"gradients fill {buckets} bucket{'s' * (buckets != 1)} (the rules: order, caps, "
                                   "close)")
    return _verdict(True, f"one all-reduce per window ({buckets} bucket{'s' * (buckets != 1)}) and the same weights "
                          f"as one step on the {accumulation_steps}x larger batch of all {len(reports_by_rank)} ranks")


def _bucket_models() -> list:
    """(description, model, bucket_cap_mb) cases where the usual wrong rules give other buckets than DDP's:
    a bucket that reaches its cap exactly, caps in MiB that 10**6 bytes do not reach, the default caps
    (a 1 MiB first bucket, 25 MiB after it) on a model of 8 MB, and a frozen layer."""
    import torch.nn as nn

    from scaledl import models

    def linears(*sizes, bias=True):
        return nn.Sequential(*[nn.Linear(n_in, n_out, bias=bias) for n_in, n_out in zip(sizes, sizes[1:])])

    frozen = models.torch_cnn(width=16)
    frozen[0].requires_grad_(False)
    return [("the lesson's CNN (width 64) with bucket_cap_mb=1", models.torch_cnn(width=64), 1),
            ("3 bias-free 512x512 layers (1 MiB each) with bucket_cap_mb=1",
             linears(512, 512, 512, 512, bias=False), 1),
            ("2 bias-free 500x500 layers (10**6 B each) with bucket_cap_mb=1", linears(500, 500, 500, bias=False), 1),
            ("layers 1000-1000-1000-10 with the default caps", linears(1000, 1000, 1000, 10), None),
            ("the CNN (width 16) with its first layer frozen, bucket_cap_mb=0.1", frozen, 0.1)]


def _buckets_by_rule(model, bucket_cap_mb, order=-1, first_cap=True, reach=True, unit=2**20, frozen=False,
                     element_bytes=True, fit_before=False) -> list[list[str]]:
    """DDP's bucketing with one rule changed, to name the rule a wrong answer broke."""
    cap = int((25 if bucket_cap_mb is None else bucket_cap_mb) * unit)
    caps = [2**20 if bucket_cap_mb is None and first_cap else cap, cap]
    buckets, names, size = [], [], 0
    for name, param in list(model.named_parameters())[::order]:
        if not (param.requires_grad or frozen):
            continue
        nbytes = param.numel() * (param.element_size() if element_bytes else 1)
        limit = caps[min(len(buckets), 1)]
        if fit_before and names and size + nbytes > limit:
            buckets.append(names)
            names, size = [], 0
            limit = caps[min(len(buckets), 1)]
        names.append(name)
        size += nbytes
        if not fit_before and (size >= limit if reach else size > limit):
            buckets.append(names)
            names, size = [], 0
    return buckets + ([names] if names else [])


_BUCKET_HINTS = [
    ({"order": 1}, "DDP fills its buckets in the order the gradients become ready: backward reaches the last "
                   "layer first, so walk the parameters from last to first"),
    ({"frozen": True}, "a parameter with requires_grad=False gets no gradient and joins no bucket"),
    ({"reach": False}, "a bucket closes as soon as its bytes reach the cap (at or past it), not only once it is past"),
    ({"unit": 10**6}, "bucket_cap_mb counts MiB: multiply by 1024 * 1024, not 10**6"),
    ({"fit_before": True}, "a bucket takes the tensor that brings it to its cap or past it, then closes: the "
                           "tensor does not move on to the next bucket (that is Horovod's fusion, not DDP's)"),
    ({"first_cap": False}, "with the default caps the first bucket is smaller: 1 MiB, so that the first "
                           "all-reduce starts early; the others take 25 MiB"),
    ({"element_bytes": False}, "the cap is in bytes: a float32 parameter takes 4 bytes per element"),
]


def _shown(buckets: list) -> str:
    return " | ".join(", ".join(bucket) for bucket in buckets)


def _same_buckets(got: list, want: list) -> bool:
    """The same buckets in the same order, each holding the same parameters in any order: inside a layer
    the gradients' ready order is autograd's (a convolution's weight before its bias), which DDP records in
    its first iteration; the model's parameters reversed put the bias first.  Both fill the same buckets
    unless a bucket closes between a layer's weight and its bias."""
    return [sorted(bucket) for bucket in got] == [sorted(bucket) for bucket in want]


def check_ddp_buckets(predict) -> bool:
    """`predict(model, bucket_cap_mb)` -> DDP's buckets, a list of lists of parameter names in the
    order they are all-reduced, against `scaledl.perf.comm_estimate.ddp_buckets` (torch's own
    `_compute_bucket_assignment_by_size`, checked in tests/test_comm_estimate.py); the order inside a
    bucket is not graded (`_same_buckets`)."""
    from scaledl.perf import comm_estimate

    if predict is None:
        return _unfinished("predict_buckets")
    cases = _bucket_models()
    for case, model, bucket_cap_mb in cases:
        got = _attempt("predict_buckets", case, lambda: [list(bucket) for bucket in predict(model, bucket_cap_mb)])
        if got is _FAILED:
            return False
        want = [bucket["names"] for bucket in comm_estimate.ddp_buckets(model, bucket_cap_mb)]
        if _same_buckets(got, want):
            continue
        hints = [hint for change, hint in _BUCKET_HINTS
                 if _same_buckets(got, _buckets_by_rule(model, bucket_cap_mb, **change))]
        hint = hints[0] if hints else ("each parameter that needs a gradient goes in exactly one bucket, last layer "
                                       "first; a bucket closes once its bytes reach its cap")
        return _verdict(False, f"{case}: you made [{_shown(got)}], DDP makes [{_shown(want)}]: {hint}")
    return _verdict(True, f"all {len(cases)} models bucketed as DDP buckets them: last layer first, each bucket "
                          "closed once it reaches its cap, the first one 1 MiB by default")


def _recorded_bytes(recorded) -> list[int] | None:
    """DDP's record of its buckets' bytes (`rebuilt_bucket_sizes`: "3216936, 297984", or a list), as ints."""
    if recorded is None:
        return None
    parts = recorded.split(",") if isinstance(recorded, str) else list(recorded)
    try:
        return [int(part) for part in parts if str(part).strip()]
    except (TypeError, ValueError):
        return None


def check_bucket_record(predict, model, bucket_cap_mb, recorded, events_by_rank, device_type: str = "cpu") -> bool:
    """Lesson 6, on the live ranks: `predict(model, bucket_cap_mb)` (Exercise 2) against what DDP did with
    that model.  `recorded` is DDP's own record of its buckets' bytes after the rebuild
    (`scaledl.workshop.traces.ddp_bucket_bytes(model)["rebuilt"]`), in bucket index order, the order DDP launches
    their all-reduces; `events_by_rank` holds each rank's `scaledl.workshop.traces.ddp_events` rows of one
    profiled backward.  It passes when the predicted buckets carry DDP's bytes, bucket by bucket; every
    rank made one all-reduce per bucket; the last bucket's all-reduce (the first layers' gradients)
    started only after the last backward op had ended; and, where the profile's backward ops and
    all-reduces share the host's clock (`device_type` "cpu"), the first one (the last layers') started
    while backward was still running.  These are what 2 CPU cores show exactly: bytes and order, not
    how long anything took."""
    if predict is None:
        return _unfinished("predict_buckets")
    got = _attempt("predict_buckets", "the timeline's model", lambda: [list(b) for b in predict(model, bucket_cap_mb)])
    if got is _FAILED:
        return False
    want = _recorded_bytes(recorded)
    if not want or not events_by_rank or any(events is None for events in events_by_rank):
        return _verdict(False, "no record of DDP's buckets from every rank: run the profiled backward above first")
    sizes = {name: param.numel() * param.element_size() for name, param in model.named_parameters()}
    unknown = [name for bucket in got for name in bucket if name not in sizes]
    if unknown:
        return _verdict(False, f"predict_buckets names {unknown[0]!r}, which is not a parameter of the model: "
                               "use the names model.named_parameters() gives")
    predicted = [sum(sizes[name] for name in bucket) for bucket in got]
    if predicted != want:
        shown = ", ".join(f"{n:,}" for n in predicted)
        hint = ("the same buckets in the opposite order: DDP's first bucket holds the gradients ready first, "
                "the last layers'" if predicted == want[::-1] else
                "Exercise 2's check names the rule your buckets break: make it pass first")
        return _verdict(False, f"your buckets carry {shown} bytes, DDP recorded {', '.join(f'{n:,}' for n in want)}: "
                               f"{hint}")
    for rank, events in enumerate(events_by_rank):
        ops = [(start, end) for row, _, start, end in events if row == "backward"]
        reductions = sorted((start, end) for row, _, start, end in events if row == "all-reduce")
        if not ops or len(reductions) != len(want):
            return _verdict(False, f"rank {rank} made {len(reductions)} all-reduce(s) in the profiled backward, "
                                   f"DDP recorded {len(want)} buckets: profile a backward after the first two "
                                   "(DDP rebuilds its buckets after the first)")
        backward_end = max(end for _, end in ops)
        if reductions[-1][0] < backward_end:
            return _verdict(False, f"rank {rank}: the last bucket's all-reduce started before backward's last op "
                                   "ended: its gradients (the first layer's) cannot exist yet; profile the whole "
                                   "backward, with the all-reduces still in flight")
        if device_type == "cpu" and len(want) > 1 and reductions[0][0] >= backward_end:
            return _verdict(False, f"rank {rank}: the first bucket's all-reduce started only after backward ended: "
                                   "DDP starts a bucket as soon as its gradients are ready")
    during = " the first during backward," if device_type == "cpu" and len(want) > 1 else ""
    return _verdict(True, f"your {len(want)} bucket(s) carry DDP's {', '.join(f'{n:,}' for n in want)} bytes, and "
                          f"on all {len(events_by_rank)} ranks the all-reduces went out last layers first:{during} "
                          "the last one after backward's last op")
