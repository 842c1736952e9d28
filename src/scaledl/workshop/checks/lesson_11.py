"""Lesson 11's checks: a pipeline's hand-off, its gradient sent back, its bubble and what its schedules hold."""
from __future__ import annotations

from scaledl.workshop.checks.common import _FAILED, _attempt, _unfinished, _verdict


def check_pipeline(received, logits, first_stage_output, full_logits, tolerance: float = 1e-4) -> bool:
    """Rank 1's received buffer must hold rank 0's stage output, and its logits (its stage on
    that buffer) must equal the whole model's on the same batch.  Tensors on the CPU."""
    if received is None:
        return _verdict(False, "rank 1 has no `activations`: receive rank 0's output into a buffer of that name")
    if tuple(received.shape) != tuple(first_stage_output.shape):
        # The shape is what the learner derives: say which way it is off, never the answer.
        off = ("holds another number of elements than" if received.numel() != first_stage_output.numel()
               else "holds as many elements, in another shape, as")
        return _verdict(False, f"rank 1's buffer has shape {tuple(received.shape)}: it {off} rank 0's stage output. "
                               "Follow the batch through rank 0's layers (channels, padding, pooling) to the shape "
                               "the classifier reads")
    if not (received - first_stage_output).abs().max().item() < tolerance:
        return _verdict(False, "rank 1's buffer does not hold rank 0's output: rank 0 must send it and rank 1 "
                               "receive into the buffer before using it")
    if logits is None:
        return _verdict(False, "rank 1 has no `logits`: run its stage on the activations it received")
    error = (logits - full_logits).abs().max().item()
    if not error < tolerance:
        return _verdict(False, f"rank 1's logits differ from the whole model's (max error {error:.2g}): "
                               "run rank 1's own stage on the received activations")
    return _verdict(True, "rank 1 received rank 0's activations, and the two stages compute what the whole model does")


def check_pipeline_backward(received, stage_grads, whole, x, labels, tolerance: float = 1e-4) -> bool:
    """The backward half of the hand pipeline: rank 1 computes the loss on its stage's output, sends
    the gradient of the loss with respect to the activations it received back to rank 0, and rank 0
    calls backward on its own output with that gradient.  `received` is rank 1's
    `(activations.requires_grad, activations.grad)`, `stage_grads` each rank's list of its stage's
    parameter gradients (None where unset), and `whole`, `x`, `labels` what the ranks built: the
    whole CNN (not modified), the batch and its labels.  Tensors on the CPU."""
    import copy

    import torch
    import torch.nn.functional as F

    if received is None:
        return _verdict(False, "rank 1 has no `activations`: run the exercise cell above, which receives them")
    requires_grad, activations_grad = received
    ranks = list(stage_grads) if stage_grads is not None else []
    first, second = (ranks + [None, None])[:2]

    def run(upstream=None):
        """The whole model's backward on a copy: the two stages' gradients and the activations'."""
        model = copy.deepcopy(whole)
        model.zero_grad(set_to_none=True)
        out = model[:6](x)
        if upstream is not None:
            out.backward(upstream(out.detach()))
            return [p.grad for p in model[:6].parameters()], None, None
        activations = out.detach().requires_grad_()
        F.cross_entropy(model[6:](activations), labels).backward()
        out.backward(activations.grad)
        return ([p.grad for p in model[:6].parameters()], [p.grad for p in model[6:].parameters()],
                activations.grad)

    def same(got, want) -> bool:
        return (got is not None and len(got) == len(want) and all(
            g is not None and g.shape == w.shape and torch.allclose(g, w, rtol=tolerance, atol=tolerance * 1e-2)
            for g, w in zip(got, want)))

    want_first, want_second, want_activations = run()
    if second is None or all(g is None for g in second):
        return _verdict(False, "rank 1's layers have no gradients: compute the loss on rank 1 from its stage's output "
                               "and call backward on it (finish the exercise cell above)")
    if not requires_grad:
        return _verdict(False, "rank 1's `activations` does not require grad, so backward leaves `activations.grad` "
                               "at None and there is nothing to send back: a received buffer is a fresh tensor that "
                               "autograd tracks only when told to (`activations.requires_grad_()`), before rank 1's "
                               "stage runs on it")
    if activations_grad is None:
        return _verdict(False, "rank 1's `activations` requires grad but has no gradient: mark it before rank 1's "
                               "stage runs on it, then call backward on the loss")
    if not same(second, want_second) or not same([activations_grad], [want_activations]):
        return _verdict(False, "rank 1's gradients differ from the whole model's: its loss is "
                               "`F.cross_entropy(logits, labels)` on its stage's output, and backward runs once")
    if first is None or all(g is None for g in first):
        return _verdict(False, "rank 0's layers have no gradients: receive the gradient rank 1 sends into a buffer "
                               "shaped like `out` and call `out.backward(gradient)` with it")
    if same(first, want_first):
        return _verdict(True, "rank 1 sent back the gradient of the loss with respect to the activations, and rank 0's "
                              "backward from it gives both stages the whole model's gradients")
    if same(first, run(lambda out: out)[0]):
        return _verdict(False, "rank 0's backward started from the activations themselves: rank 1 must send their "
                               "gradient, `activations.grad`, not `activations`")
    if same(first, run(torch.ones_like)[0]) or same(first, run(lambda out: torch.ones_like(out) / out.numel())[0]):
        return _verdict(False, "rank 0's gradients are those of `out.sum().backward()` (or `.mean()`): rank 0 has no "
                               "loss, so its backward must start from the gradient rank 1 sends, "
                               "`out.backward(gradient)`")
    error = max((g - w).abs().max().item() for g, w in zip(first, want_first) if g is not None)
    return _verdict(False, f"rank 0's gradients differ from the whole model's (max error {error:.2g}): call backward "
                           "on rank 0's output `out` with the gradient received from rank 1")


def _gpipe_bubble(forward_s, backward_s, microbatches: int) -> float:
    """The idle fraction of the GPipe schedule `plots.pipeline_schedule` draws: all forwards, then all
    backwards, each stage starting a micro batch when it is free and the stage before (forward) or
    after (backward) has finished it."""
    stages = len(forward_s)
    free = [0.0] * stages
    done = [[0.0] * microbatches for _ in range(stages)]
    for m in range(microbatches):
        for s in range(stages):
            free[s] = done[s][m] = max(free[s], done[s - 1][m] if s else 0.0) + forward_s[s]
    last = done[stages - 1][microbatches - 1]
    back = [[0.0] * microbatches for _ in range(stages)]
    for m in reversed(range(microbatches)):
        for s in reversed(range(stages)):
            ready = last if s == stages - 1 else back[s + 1][m]
            free[s] = back[s][m] = max(free[s], ready) + backward_s[s]
    busy = sum(microbatches * (f + b) for f, b in zip(forward_s, backward_s))
    return 1 - busy / (stages * max(free))


# (forward_s, backward_s, microbatches): equal stages first, then stages where one is the slowest both ways.
_EQUAL_STAGES = [((1.0, 1.0), (2.0, 2.0), 4), ((1.0,) * 4, (2.0,) * 4, 4), ((1.0,) * 4, (2.0,) * 4, 16)]
_UNEQUAL_STAGES = [((0.84, 0.09), (0.64, 0.22), 4), ((0.84, 0.09), (0.64, 0.22), 1), ((0.1, 0.5), (0.2, 1.0), 4),
                   ((0.2, 0.6, 0.1), (0.3, 1.2, 0.2), 8)]


def check_bubble(bubble, forward_s, backward_s, microbatches: int) -> bool:
    """`bubble(forward_s, backward_s, microbatches)`: the idle fraction of one GPipe step for stages of any
    cost where one stage is the slowest both forward and backward, checked against the schedule
    `plots.pipeline_schedule` draws: on equal stages it must give (S - 1) / (M + S - 1), on unequal ones
    the slowest stage's M micro batches plus one micro batch of every other stage.  `forward_s` and
    `backward_s` are the stages' measured times, which the verdict reports against the formula."""
    import math

    if bubble is None:
        return _unfinished("bubble")
    close = lambda a, b: math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)  # noqa: E731
    for forward, backward, m in _EQUAL_STAGES + _UNEQUAL_STAGES:
        stages = len(forward)
        try:
            got = bubble(list(forward), list(backward), m)
        except NotImplementedError:
            return _verdict(False, "bubble still raises NotImplementedError: finish the exercise cell")
        want, formula = _gpipe_bubble(forward, backward, m), (stages - 1) / (m + stages - 1)
        if not isinstance(got, (int, float)) and not hasattr(got, "__float__"):
            return _verdict(False, f"return the idle fraction as a number, got {type(got).__name__}")
        got = float(got)
        if close(got, want):
            continue
        if got > 1 and close(got / 100, want):
            return _verdict(False, f"return a fraction between 0 and 1, not a percentage ({got:g})")
        equal = (forward, backward, m) in _EQUAL_STAGES
        where = (f"{stages} stages taking {', '.join(f'{f:g}' for f in forward)} forward and "
                 f"{', '.join(f'{b:g}' for b in backward)} backward, {m} micro batches")
        if close(got, 1 - 1 / stages):
            return _verdict(False, f"{where}: {got:.0%} is a step with no overlap at all, one micro batch through "
                                   "every stage after another; in a pipeline the stages work at once on different "
                                   "micro batches")
        if equal and close(got, 0.0):
            return _verdict(False, f"{where}: no bubble at all? A step of only M times the slowest stage's time "
                                   "leaves out filling and draining the pipeline, when some stages wait")
        if equal:
            return _verdict(False, f"{where}: equal stages idle (S - 1) / (M + S - 1) = {want:.0%} of the time, yours "
                                   f"{got:.0%}")
        if close(got, formula):
            return _verdict(False, f"{where}: yours is the equal-stage formula's {formula:.0%}, the schedule idles "
                                   f"{want:.0%}: the slowest stage sets the pace, and the others wait for it")
        return _verdict(False, f"{where}: the schedule idles {want:.0%}, yours {got:.0%}: the step is the slowest "
                               "stage's M forwards and backwards plus the forward and backward of one micro batch on "
                               "every other stage, which it waits for")
    stages = len(forward_s)
    formula = (stages - 1) / (microbatches + stages - 1)
    # The verdict line stays the same on every run (a notebook compares it): the measured stages' bubble,
    # which moves from run to run, is the next cell's to print.
    float(bubble(list(forward_s), list(backward_s), microbatches))  # runs on the measured stages too
    return _verdict(True, "your bubble matches the schedule on equal and unequal stages: the slowest stage sets the "
                          f"pace, and with unequal stages the bubble is more than the equal-stage formula's "
                          f"{formula:.0%}")


def check_peak_in_flight(peak_in_flight) -> bool:
    """`peak_in_flight(schedule, stages, microbatches) -> list`: the most micro batches each stage holds the
    activations of, under "gpipe" (all forwards first: every stage holds all M) and "1f1b" (stage s runs
    min(M, S - s) forwards before its first backward, then one of each: it holds at most that many)."""
    if peak_in_flight is None:
        return _unfinished("peak_in_flight")
    for schedule, stages, microbatches in (("gpipe", 2, 8), ("1f1b", 2, 8), ("1f1b", 4, 8), ("1f1b", 4, 2),
                                           ("gpipe", 4, 3)):
        want = [microbatches] * stages if schedule == "gpipe" else [min(microbatches, stages - s)
                                                                     for s in range(stages)]
        where = f"{schedule}, {stages} stages, {microbatches} micro batches"
        got = _attempt("peak_in_flight", where, lambda: peak_in_flight(schedule, stages, microbatches))
        if got is _FAILED:
            return False
        try:
            got = [int(n) for n in got]
        except (TypeError, ValueError):
            return _verdict(False, f"{where}: return a list of whole numbers, one a stage, got {got!r}")
        if got == want:
            continue
        if len(got) != stages:
            return _verdict(False, f"{where}: {got} has {len(got)} entries: give one a stage ({stages})")
        if schedule == "1f1b" and got == [microbatches] * stages:
            return _verdict(False, f"{where}: {got} is GPipe's, every micro batch held; 1F1B starts backwards "
                                   "as soon as the pipeline is full, and frees a micro batch with each")
        if schedule == "1f1b" and got == [min(microbatches, stages)] * stages:
            return _verdict(False, f"{where}: {got} holds as many on every stage; a later stage gets its first "
                                   "backward sooner (the last at once), so it runs fewer forwards before it")
        if schedule == "1f1b" and got == [stages - s for s in range(stages)]:
            return _verdict(False, f"{where}: {got}: with fewer micro batches than stages, a stage cannot hold "
                                   "more micro batches than there are")
        if schedule == "gpipe" and got == [stages - s for s in range(stages)]:
            return _verdict(False, f"{where}: {got} is 1F1B's; GPipe runs every forward before any backward")
        return _verdict(False, f"{where}: got {got}, want {want}")
    return _verdict(True, "GPipe holds all M micro batches on every stage; 1F1B holds min(M, S - s) on stage s, "
                          "the first stage most")


def check_interleaved_bubble(interleaved_bubble) -> bool:
    """`interleaved_bubble(stages, microbatches, chunks) -> float`: the idle share of a step of interleaved 1F1B
    with `chunks` model chunks a rank, equal stages and free sends, (S - 1) / (v·M + S - 1).  Narayanan et al.
    2021 (arXiv:2104.04473, section 2.2.2) give the idle time against the ideal step, (S - 1) / (v·M); as a
    share of the whole step, idle / (ideal + idle), it is the formula above.  chunks = 1 is GPipe's and 1F1B's."""
    import math

    if interleaved_bubble is None:
        return _unfinished("interleaved_bubble")
    for stages, m, v in ((2, 8, 1), (2, 8, 2), (4, 8, 2), (4, 4, 4), (8, 32, 2)):
        want = (stages - 1) / (v * m + stages - 1)
        where = f"{stages} stages, {m} micro batches, {v} chunk{'s' if v > 1 else ''} a rank"
        got = _attempt("interleaved_bubble", where, lambda: interleaved_bubble(stages, m, v))
        if got is _FAILED:
            return False
        try:
            got = float(got)
        except (TypeError, ValueError):
            return _verdict(False, f"{where}: return the idle share as a number, got {got!r}")
        if math.isclose(got, want, rel_tol=1e-9):
            continue
        if math.isclose(got, 100 * want, rel_tol=1e-9):
            return _verdict(False, f"{where}: return a fraction between 0 and 1, not a percentage ({got:g})")
        if math.isclose(got, (stages - 1) / (v * m), rel_tol=1e-9):
            return _verdict(False, f"{where}: {got:.1%} is the idle time against the ideal step, (S - 1) / (v·M); "
                                   "as a share of the whole step divide the idle time by ideal + idle")
        if math.isclose(got, (stages - 1) / (m + stages - 1), rel_tol=1e-9):
            return _verdict(False, f"{where}: {got:.1%} is the plain 1F1B bubble: with v chunks a rank each stage "
                                   "is v times shorter, so filling and draining the pipeline takes 1/v of the time")
        if math.isclose(got, (stages - 1) / (m + stages - 1) / v, rel_tol=1e-9):
            return _verdict(False, f"{where}: dividing the whole share by v shrinks the work too; only the idle "
                                   "time shrinks by v, the ideal step stays the same")
        return _verdict(False, f"{where}: got {got:.1%}, want (S - 1) / (v·M + S - 1) = {want:.1%}")
    return _verdict(True, "interleaving v chunks a rank cuts the fill and drain v times: (S - 1) / (v·M + S - 1), "
                          "1/17 = 5.9% for 2 stages, 8 micro batches and 2 chunks, against 1F1B's 1/9 = 11%")
