"""Lesson 8's checks: DeepSpeed's batch arithmetic and accumulation, and the ranks in sync."""
from __future__ import annotations

import math

from scaledl.workshop.checks.common import _attempt, _FAILED, _unfinished, _verdict
from scaledl.workshop.checks.lesson_06 import check_in_sync  # noqa: F401  (lesson 8 checks the same sync)


def deepspeed_batch(config: dict, world_size: int) -> tuple[int, int, int]:
    """(train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps) as
    DeepSpeed resolves them, or ValueError with DeepSpeed's reason for refusing the config.

    DeepSpeed needs one of train_batch_size and train_micro_batch_size_per_gpu, fills in the
    numbers left out (integer division; accumulation 1 when two are missing), then requires
    train = micro x accumulation x world_size, every one above 0: DeepSpeedConfig's
    `_set_batch_related_parameters` and `_batch_assertion` (deepspeed/runtime/config.py, 0.19.8;
    the same rules in 0.17.6)."""
    train = config.get("train_batch_size")
    micro = config.get("train_micro_batch_size_per_gpu")
    accumulation = config.get("gradient_accumulation_steps")
    for name, value in (("train_batch_size", train), ("train_micro_batch_size_per_gpu", micro),
                        ("gradient_accumulation_steps", accumulation)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{name} is {value!r}: DeepSpeed wants a number")
    if train is not None and micro is not None and accumulation is None:
        accumulation = train // micro // world_size
    elif train is not None and accumulation is not None and micro is None:
        micro = train // world_size // accumulation
    elif micro is not None and accumulation is not None and train is None:
        train = micro * accumulation * world_size
    elif train is not None and micro is None and accumulation is None:
        micro, accumulation = train // world_size, 1
    elif micro is not None and train is None and accumulation is None:
        train, accumulation = micro * world_size, 1
    elif train is None and micro is None:
        raise ValueError("DeepSpeed needs train_batch_size or train_micro_batch_size_per_gpu (or both)")
    for name, value in (("train_batch_size", train), ("train_micro_batch_size_per_gpu", micro),
                        ("gradient_accumulation_steps", accumulation)):
        if value <= 0:
            raise ValueError(f"{name} comes to {value}: DeepSpeed wants every batch number above 0")
    if train != micro * accumulation * world_size:
        raise ValueError(f"train_batch_size {train} != micro batch {micro} x accumulation {accumulation} x "
                         f"world_size {world_size}: DeepSpeed refuses this config; the global batch counts every "
                         "micro batch of every rank")
    return train, micro, accumulation


def check_deepspeed_config(configs_by_rank: list, world_size: int, micro_batch_size: int = 8,
                           accumulation_steps: int = 3, predicted=None, inferred_by_rank: list | None = None) -> bool:
    """A config DeepSpeed accepts (any of the three batch numbers may be left for it to infer:
    `deepspeed_batch`) whose batch is the one the exercise asks for, with clipping off.

    Given `inferred_by_rank` (each rank's `engine.train_batch_size()`), the exercise leaves
    `train_batch_size` out and `predicted` is the learner's number for what DeepSpeed infers.

    The exercise runs on 2 or more ranks with an accumulation that differs from the world size,
    so a global batch that leaves out the ranks and one that leaves out the accumulation come to
    different numbers, both wrong.  Clipping must be off explicitly: DeepSpeed clips the gradient
    norm to 1.0 when the key is missing from 0.19.3 on (constants.py GRADIENT_CLIPPING_DEFAULT,
    DeepSpeed PR 8068), and not at all before (0.17.6 included)."""
    if configs_by_rank is None:
        return False
    if world_size < 2:  # on one rank a global batch without the ranks is right by accident
        return _verdict(False, "one rank cannot tell a global batch from a local one: start 2 or more "
                               "(WORLD_SIZE = 2)")
    config = configs_by_rank[0]
    if not isinstance(config, dict):
        return _verdict(False, f"ds_config is {type(config).__name__}: write the config as a dict")
    if inferred_by_rank is not None and "train_batch_size" in config:
        return _verdict(False, "leave \"train_batch_size\" out of the config: the exercise asks what DeepSpeed "
                               "infers for it")
    try:
        train, micro, accumulation = deepspeed_batch(config, world_size)
    except ValueError as error:
        return _verdict(False, str(error))
    if micro != micro_batch_size:
        hint = (": that is the global batch, every rank's micro batches together" if micro == train
                else f" ({world_size} ranks' worth): the micro batch is one rank's" if micro == micro_batch_size
                * world_size else "")
        return _verdict(False, f"the micro batch per rank comes to {micro}; the exercise asks for "
                               f"{micro_batch_size}{hint}")
    if accumulation != accumulation_steps:
        return _verdict(False, f"gradient accumulation comes to {accumulation} micro batches per optimizer step; "
                               f"the exercise asks for {accumulation_steps}")
    clipping = config.get("gradient_clipping")
    if clipping is None:
        return _verdict(False, "no \"gradient_clipping\": DeepSpeed 0.19.3 and later clip the gradient norm to 1.0 "
                               "by default (older releases do not): set it to 0 so that no release clips")
    if isinstance(clipping, bool) or not isinstance(clipping, (int, float)) or clipping > 0:
        return _verdict(False, f"\"gradient_clipping\" is {clipping!r}: DeepSpeed clips the gradient norm to that; "
                               "the other rungs do not clip, so set 0")
    if inferred_by_rank is not None:
        return _inferred_verdict(predicted, inferred_by_rank, train, micro, accumulation, world_size)
    inferred = [name for name in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                  "gradient_accumulation_steps") if name not in config]
    said = f" (DeepSpeed infers {', '.join(inferred)})" if inferred else ""
    return _verdict(True, f"global batch {train} = micro batch {micro} x accumulation {accumulation} x "
                          f"world_size {world_size}{said}, and nothing is clipped")


def _inferred_verdict(predicted, inferred_by_rank: list, train: int, micro: int, accumulation: int,
                      world_size: int) -> bool:
    """The learner's `predicted_batch` against the train_batch_size the engines resolved."""
    if predicted is None:
        return _unfinished("predicted_batch")
    if isinstance(predicted, bool) or not isinstance(predicted, (int, float)):
        return _verdict(False, f"`predicted_batch` is {predicted!r}: give a number of samples")
    if not inferred_by_rank or any(value is None for value in inferred_by_rank):
        return _verdict(False, "the DeepSpeed engine was not built on every rank: run the exercise cell to the end")
    inferred = inferred_by_rank[0]
    if predicted == inferred:
        return _verdict(True, f"DeepSpeed inferred train_batch_size {inferred} = micro batch {micro} x accumulation "
                              f"{accumulation} x world_size {world_size}, as you predicted, and nothing is clipped")
    if predicted == micro * accumulation:
        why = "one rank's share of a step: the global batch counts every rank's micro batches"
    elif predicted == micro * world_size:
        why = f"one micro batch per rank: a step takes {accumulation} micro batches on each rank"
    elif predicted == micro:
        why = "one rank's micro batch: the global batch is every sample of one optimizer step, on all ranks"
    else:
        why = "not what DeepSpeed inferred: count the samples of one optimizer step, on all ranks"
    return _verdict(False, f"`predicted_batch` {predicted:g} is {why}")


def check_batch_pair(predicted, said, pair: dict, world_size: int) -> bool:
    """Exercise 1's prediction for a config that gives `train_batch_size` and `train_micro_batch_size_per_gpu`
    only: the accumulation steps DeepSpeed infers on `world_size` ranks, or "refused".  `said` is what
    DeepSpeed's own config class made of `pair` on the live ranks: its gradient_accumulation_steps, or
    "refused" (None when the cell did not finish).  DeepSpeed infers train // micro // world_size by integer
    division, then refuses the config unless train = micro x accumulation x world_size (`deepspeed_batch`)."""
    if predicted is None:
        return _unfinished("predicted_steps")
    if said is None:
        return _verdict(False, "DeepSpeed's verdict on the pair was not recorded on every rank: run the exercise "
                               "cell to the end")
    train, micro = pair["train_batch_size"], pair["train_micro_batch_size_per_gpu"]
    inferred = train // micro // world_size
    how = (f"DeepSpeed infers {train} // {micro} // {world_size} = {inferred} accumulation steps, then checks "
           f"{micro} x {inferred} x {world_size} = {micro * inferred * world_size} against {train}")
    if isinstance(predicted, str) and predicted.strip().strip('"').lower() == "refused":
        predicted = "refused"
    elif isinstance(predicted, bool) or not isinstance(predicted, (int, float)):
        return _verdict(False, f"`predicted_steps` is {predicted!r}: give a whole number of steps, or \"refused\"")
    if predicted == said:
        outcome = "refused the pair" if said == "refused" else f"accepted the pair with {said} accumulation steps"
        return _verdict(True, f"DeepSpeed {outcome} on {world_size} ranks, as you predicted: {how}")
    if said == "refused" and predicted != "refused":
        if predicted != int(predicted):
            hint = (f"a rank runs whole micro batches, so {predicted:g} steps cannot be: {how}, and refuses the "
                    "config rather than train another batch")
        elif predicted == inferred:
            hint = (f"it does infer {inferred} steps, but it then checks {micro} x {inferred} x {world_size} = "
                    f"{micro * inferred * world_size} against {train}, and refuses the config rather than train "
                    "another batch")
        else:
            hint = f"{how}, and refuses the config"
        return _verdict(False, f"you predicted {predicted:g} steps, but DeepSpeed refused: {hint}")
    if predicted == "refused":
        return _verdict(False, f"you predicted a refusal, but DeepSpeed accepted {said} steps: {how}, and they agree")
    return _verdict(False, f"you predicted {predicted:g} steps, but DeepSpeed inferred {said}: {how}")


_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def batch_triple_answer(global_batch_size: int, world_size: int, max_micro_batch: int) -> dict | None:
    """The three batch numbers DeepSpeed accepts for `global_batch_size` samples per optimizer step on
    `world_size` ranks, with the fewest accumulation steps: the largest micro batch of at most
    `max_micro_batch` samples that divides a rank's share exactly.  None when no three numbers exist (the
    global batch is not a multiple of world_size: `_batch_assertion` wants train = micro x accumulation x
    world_size)."""
    if global_batch_size % world_size:
        return None
    share = global_batch_size // world_size
    micro = max(m for m in range(1, min(share, max_micro_batch) + 1) if share % m == 0)
    return dict(zip(_BATCH_KEYS, (global_batch_size, micro, share // micro)))


# (global batch, world_size, the largest micro batch that fits): a share per rank that the largest micro
# batch divides; shares it does not divide, where the first guess (the fewest windows that hold the share,
# ceil(share / max), then share // that) is refused; a share smaller than the limit; a prime share; and a
# global batch that no world_size split makes whole.
_TRIPLE_CASES = [(48, 2, 8), (100, 4, 8), (42, 2, 4), (96, 4, 32), (26, 2, 8), (512, 8, 16), (50, 4, 8)]
_NOT_GIVEN = object()


def _refusal_or(batch_triple, *case):
    """The learner's triple for `case`, or the ValueError it raised: an answer, not an error, in this exercise."""
    try:
        return batch_triple(*case)
    except ValueError as error:
        return error


def check_batch_triple(batch_triple, live=_NOT_GIVEN) -> bool:
    """`batch_triple(global_batch_size, world_size, max_micro_batch)` -> a dict of DeepSpeed's three batch
    keys, against `batch_triple_answer` (DeepSpeed's rules: `deepspeed_batch`); ValueError where no triple
    exists.  `live`, when given, is DeepSpeed's own verdict on the learner's triple on the live ranks
    ("accepted: ..." or "refused: <DeepSpeedConfig's assertion>"), None where that cell did not run."""
    import numbers

    if batch_triple is None:
        return _unfinished("batch_triple")
    for global_batch, world_size, largest in _TRIPLE_CASES:
        case = f"a global batch of {global_batch} on {world_size} ranks, at most {largest} samples per forward"
        want = batch_triple_answer(global_batch, world_size, largest)
        got = _attempt("batch_triple", case, lambda: _refusal_or(batch_triple, global_batch, world_size, largest))
        if got is _FAILED:
            return False
        if isinstance(got, ValueError):  # the exercise's way to say that DeepSpeed accepts no triple
            if want is None:
                continue
            return _verdict(False, f"{case}: batch_triple raised ValueError ({got}), but "
                                   f"{want['train_micro_batch_size_per_gpu']} x "
                                   f"{want['gradient_accumulation_steps']} x {world_size} makes it")
        if want is None:
            return _verdict(False, f"{case}: you returned {got!r}, but {global_batch} samples do not split evenly "
                                   f"over {world_size} ranks, and DeepSpeed refuses every such config "
                                   "(train = micro x accumulation x world_size): raise ValueError")
        if not isinstance(got, dict):
            return _verdict(False, f"{case}: batch_triple returned {type(got).__name__}: return a dict of the "
                                   "config's batch keys")
        config = {key: int(value) if isinstance(value, numbers.Integral) else value for key, value in got.items()}
        share = global_batch // world_size
        try:
            train, micro, accumulation = deepspeed_batch(config, world_size)
        except ValueError as error:
            return _verdict(False, f"{case}: DeepSpeed would refuse {config}: {error}; the micro batch must divide "
                                   f"each rank's share, {global_batch} / {world_size} = {share}, exactly")
        if train != global_batch:
            return _verdict(False, f"{case}: that config trains a global batch of {train}: train_batch_size is "
                                   f"every sample of one optimizer step on all ranks, {global_batch}")
        if micro > largest:
            return _verdict(False, f"{case}: a micro batch of {micro} does not fit; at most {largest} samples go "
                                   "through one forward")
        if accumulation != want["gradient_accumulation_steps"]:
            return _verdict(False, f"{case}: DeepSpeed accepts {micro} x {accumulation} x {world_size}, but a micro "
                                   f"batch of {want['train_micro_batch_size_per_gpu']} fits and divides the share of "
                                   f"{share}: {want['gradient_accumulation_steps']} accumulation steps, the fewest")
    said = f"all {len(_TRIPLE_CASES)} cases as DeepSpeed resolves them, the fewest accumulation steps in each"
    if live is _NOT_GIVEN:
        return _verdict(True, said)
    if not isinstance(live, str):
        return _verdict(False, f"{said}, but no verdict from DeepSpeed on the live ranks: run the cell above")
    if not live.startswith("accepted"):
        return _verdict(False, f"{said}, but DeepSpeed on the live ranks {live}")
    return _verdict(True, f"{said}; DeepSpeed on the live ranks {live}")


def check_window_prediction(predicted, measured, grad_bytes: int, world_size: int, accumulation_steps: int) -> bool:
    """Lesson 8: `predicted` = {"all_reduces": n, "bytes": b}, what ZeRO stage 2's backwards all-reduce in
    one accumulation window, against `measured` (the same keys, from the live ranks).  It passes only on
    the measurement; the hints name the usual wrong models of stage 2 (`grad_bytes` of gradients,
    all-reduced whole per backward by DeepSpeed 0.19.8's default `use_multi_rank_bucket_allreduce`)."""
    if predicted is None:
        return _unfinished("stage2_window")
    return _verdict(*_window_verdict(predicted, measured, grad_bytes, world_size, accumulation_steps))


def _window_verdict(predicted, measured, grad_bytes: int, world_size: int, accumulation_steps: int) -> tuple:
    """(ok, message) of `check_window_prediction`."""
    if not isinstance(predicted, dict) or not {"all_reduces", "bytes"} <= set(predicted):
        return False, "`stage2_window` needs two keys: {\"all_reduces\": ..., \"bytes\": ...}"
    if not measured:
        return False, "no measurement: run the stage-2 cell above on the ranks first"
    calls, nbytes = predicted["all_reduces"], predicted["bytes"]
    want_calls, want_bytes = measured["all_reduces"], measured["bytes"]
    if calls != want_calls:
        if calls == 1:
            hint = "one per window is stages 0 and 1; stage 2 keeps no whole gradient between backwards"
        elif calls == accumulation_steps:
            hint = "one call per backward is one bucket: count how many buckets this reduce_bucket_size makes"
        elif calls > want_calls:
            hint = ("the DeepSpeed engine flattens a bucket's gradients into one buffer: one call per bucket, not per "
                    "tensor")
        else:
            hint = "count the buckets of one backward, then the backwards in a window that reduce"
        return False, f"{calls} all-reduces, the ranks made {want_calls}: {hint}"
    if math.isclose(nbytes, want_bytes):
        return True, (f"{want_calls} all-reduces in a window's backwards, {want_bytes:,} bytes in all, as the ranks "
                      "measured")
    p, a = world_size, accumulation_steps
    wrong = [(a * grad_bytes / p, "each rank keeps 1/world_size of the sum, but the call carries the whole bucket"),
             (2 * (p - 1) / p * a * grad_bytes, "that is what the ring sends per rank: count the buffer all-reduced"),
             (grad_bytes, "those are one backward's bytes: add up the window"),
             (8 * a * grad_bytes, "that counts bits: count bytes, 4 for each fp32 gradient"),
             (a * grad_bytes / 4, "that counts gradients: each fp32 gradient is 4 bytes")]
    hint = next((text for value, text in wrong if math.isclose(nbytes, value)),
                "the gradients of the whole model, in fp32, in every backward of the window")
    return False, f"{nbytes:,} bytes, the ranks all-reduced {want_bytes:,}: {hint}"


# (gradient sizes in the order backward produces them, accumulation steps, reduce_bucket_size): three that
# fill the bucket exactly (still one bucket: each wrong count differs from the right one here); gradients
# that overflow the bucket one by one, so that whole gradients leave the buckets part empty (more calls
# than the total over the bucket size, rounded up); a small bucket and a window of one micro step; a
# model far under the default bucket.
_STAGE2_CASES = [([100_000_000, 150_000_000, 250_000_000], 3, 500_000_000),
                 ([260_000_000] * 4, 2, 500_000_000),
                 ([30, 50, 40, 20, 60], 1, 100),
                 ([6_000, 400, 200_000, 500, 1_000, 10], 3, 500_000_000)]


def _bucket_elements(numels: list, bucket: float) -> list:
    """One backward's buckets in elements, as DeepSpeed 0.19.8 fills them: a bucket goes out when the next
    gradient would take it over `bucket` elements, and what is left goes out at the end of backward."""
    buckets, filled = [], 0
    for n in numels:
        if filled and filled + n > bucket:
            buckets.append(filled)
            filled = 0
        filled += n
    return buckets + ([filled] if filled else [])


def _as_numbers(values) -> list | None:
    """`values` as a list of plain numbers, or None where it is not a sequence of numbers."""
    import numbers

    try:
        values = list(values)
    except TypeError:
        return None
    if any(isinstance(v, bool) or not isinstance(v, numbers.Number) for v in values):
        return None
    return [float(v) for v in values]


def _listed(buckets) -> str:
    """Bucket sizes as "808,488 + 19,200" (none: "none")."""
    return " + ".join(f"{b:,.0f}" for b in buckets) or "none"


def _buckets_hint(got: list, want: list, numels: list, bucket: float) -> str:
    """Why the learner's one-backward buckets (bytes) differ from DeepSpeed's, for the usual slips."""
    close = lambda a, b: len(a) == len(b) and all(math.isclose(x, y) for x, y in zip(a, b))  # noqa: E731
    if close(got, [w / 4 for w in want]):
        return "those are elements: a bucket's bytes are 4 per fp32 gradient"
    if close(got, [4 * b for b in _greater_or_equal_buckets(numels, bucket)]):
        return ("a gradient that fills the bucket exactly stays in it: the bucket goes out when the next one would "
                "take it over reduce_bucket_size")
    if close(got, want[:-1]):
        return "what is left in the bucket at the end of a backward goes out too"
    if close(got, [4 * n for n in numels]):
        return "the DeepSpeed engine copies the gradients into a bucket and all-reduces the bucket: one call per bucket"
    if len(got) == len(want) and math.isclose(sum(got), sum(want)):
        return "the same bytes, split elsewhere: fill the bucket gradient by gradient, in backward's order"
    return "fill a bucket gradient by gradient; it goes out when the next gradient would not fit, and at the end"


def check_stage2_window(stage2_window, measured=None, numels: list | None = None, world_size: int = 2,
                        accumulation_steps: int = 3, reduce_bucket_size: int = 500_000_000,
                        measured_buckets: list | None = None) -> bool:
    """`stage2_window(numels, accumulation_steps, reduce_bucket_size) -> {"buckets", "all_reduces", "bytes"}`:
    the bytes of each bucket one backward all-reduces, in order, and what ZeRO stage 2's backwards all-reduce
    in one accumulation window, for fp32 gradients of `numels` elements in the order backward produces them.
    DeepSpeed 0.19.8 (stage_1_and_2.py, `reduce_independent_p_g_buckets_and_remove_grads`) copies each
    gradient into a bucket and all-reduces the bucket in one call when the next gradient would take it over
    `reduce_bucket_size` elements, and what is left at the end of every backward (`scaledl.perf.predict._buckets`
    counts them).  Checked on cases where the bucket splits, then on this lesson's model, at the live config's
    `reduce_bucket_size`: each bucket's bytes against `measured_buckets` (the bytes of the calls one backward
    made on the live ranks), and the window against `measured` (through `check_window_prediction`).  The
    buckets depend on the order of `numels`: the order backward hands the gradients over, recorded, not
    `model.parameters()` reversed (a convolution's weight gradient comes before its bias's)."""
    from scaledl.perf.predict import _buckets

    if stage2_window is None:
        return _unfinished("stage2_window")
    for case_numels, accumulation, bucket in _STAGE2_CASES:
        case = (f"gradients of {', '.join(f'{n:,}' for n in case_numels)} elements, {accumulation} micro steps a "
                f"window, reduce_bucket_size {bucket:,}")
        got = _attempt("stage2_window", case, lambda: stage2_window(list(case_numels), accumulation, bucket))
        if got is _FAILED:
            return False
        if not isinstance(got, dict) or not {"buckets", "all_reduces", "bytes"} <= set(got):
            return _verdict(False, "stage2_window returns a dict with three keys: "
                                   "{\"buckets\": [...], \"all_reduces\": ..., \"bytes\": ...}")
        want_buckets = [4 * n for n in _bucket_elements(case_numels, bucket)]
        got_buckets = _as_numbers(got["buckets"])
        if got_buckets is None:
            return _verdict(False, f"{case}: \"buckets\" is {got['buckets']!r}: give a list of numbers, the bytes "
                                   "of each bucket one backward all-reduces")
        if len(got_buckets) != len(want_buckets) or not all(
                math.isclose(g, w) for g, w in zip(got_buckets, want_buckets)):
            return _verdict(False, f"{case}: one backward's buckets of {_listed(got_buckets)} bytes, "
                                   f"DeepSpeed sends {_listed(want_buckets)}: "
                                   f"{_buckets_hint(got_buckets, want_buckets, case_numels, bucket)}")
        per_backward, total = _buckets(case_numels, bucket), sum(case_numels)
        calls, nbytes = got["all_reduces"], got["bytes"]
        if calls != accumulation * per_backward:
            wrong = [(1, "one call per window is stages 0 and 1; at stage 2 every backward reduces"),
                     (per_backward, "that is one backward's calls: every backward of the window reduces")]
            hint = next((text for value, text in wrong if calls == value and value != accumulation * per_backward),
                        "one call per bucket, in every backward of the window")
            return _verdict(False, f"{case}: {calls} all-reduces, DeepSpeed makes {accumulation * per_backward}: "
                                   f"{hint}")
        want = accumulation * 4 * total
        if not math.isclose(nbytes, want):
            wrong = [(4 * total, "those are one backward's bytes: add up the window"),
                     (accumulation * total, "that counts gradients: each fp32 gradient is 4 bytes"),
                     (8 * want, "that counts bits: count bytes"),
                     (accumulation * 4 * bucket * per_backward, "a call carries the gradients in its bucket, not a "
                                                                "full bucket")]
            hint = next((text for value, text in wrong if math.isclose(nbytes, value)),
                        "every gradient of the model, 4 bytes each, in every backward of the window")
            return _verdict(False, f"{case}: {nbytes:,} bytes, DeepSpeed all-reduces {want:,}: {hint}")
    said = f"all {len(_STAGE2_CASES)} cases as DeepSpeed 0.19.8 fills and sends its buckets"
    if numels is None:
        return _verdict(True, said)
    yours = stage2_window(list(numels), accumulation_steps, reduce_bucket_size)
    if measured_buckets is not None:
        sent = [float(b) for b in measured_buckets]
        got_buckets = _as_numbers(yours.get("buckets", ())) or []
        if len(got_buckets) != len(sent) or not all(math.isclose(g, w) for g, w in zip(got_buckets, sent)):
            hint = ("the same bytes, split elsewhere: the buckets follow the order in which backward hands the "
                    "gradients over, so take `numels` in the recorded order, not model.parameters() reversed"
                    if math.isclose(sum(got_buckets), sum(sent)) else "count this model's gradients, 4 bytes each")
            return _verdict(False, f"on this model: one backward's buckets of {_listed(got_buckets)} bytes, the "
                                   f"ranks all-reduced {_listed(sent)}: {hint}")
    ok, message = _window_verdict(yours, measured, 4 * sum(numels), world_size, accumulation_steps)
    if ok and measured_buckets is not None:
        message = f"buckets of {_listed(measured_buckets)} bytes per backward; " + message
    return _verdict(ok, f"{said}; on this model, " + message if ok else f"on this model: {message}")


def _greater_or_equal_buckets(numels: list, bucket: float):
    """The buckets a rule that sends a bucket once it is full (>=) would make: a wrong reading of DeepSpeed's."""
    filled = 0
    for n in numels:
        if filled and filled + n >= bucket:
            yield filled
            filled = 0
        filled += n
    if filled:
        yield filled
