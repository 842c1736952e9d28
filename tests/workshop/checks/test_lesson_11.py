"""Lesson 11's checks (the pipeline hand-off, its gradient, the bubble, what the schedules hold): each passes
the solution, FAILs on what an untouched exercise leaves, and FAILs on the wrong answers a learner plausibly
writes, naming the fix in one line."""

import torch

from conftest import fails, unattempted, untouched, verdict
from scaledl.workshop import checks


# ---------------------------------------------------------------- pipeline

def pipeline_tensors():
    from scaledl import models

    torch.manual_seed(0)
    whole = models.torch_cnn()
    x = torch.randn(16, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return whole, x, whole[:6](x), whole(x)


def test_pipeline_check(capsys):
    whole, x, first, full = pipeline_tensors()
    with torch.no_grad():
        assert checks.check_pipeline(first.clone(), whole[6:](first), first, full)
        verdict(capsys)
        # Unusual but right: a GPU's kernels round differently, a few ulps off the CPU's numbers.
        nudged = first * (1 + 1e-6)
        assert checks.check_pipeline(nudged, whole[6:](nudged), first, full)
        verdict(capsys)
        # `logits = full_model(x)` on rank 1 and no send/recv: nothing was received.
        fails(capsys, checks.check_pipeline(None, whole(x), first, full), "rank 1 has no `activations`")
        # A buffer received into, but never filled by rank 0 (torch.empty or zeros).
        zeros = torch.zeros_like(first)
        fails(capsys, checks.check_pipeline(zeros, whole[6:](zeros), first, full), "does not hold rank 0's output")
        # A buffer of the wrong shape: one pool forgotten. The FAIL names the learner's shape, never the answer.
        line = fails(capsys, checks.check_pipeline(torch.zeros(16, 32, 14, 14), None, first, full),
                     "shape (16, 32, 14, 14)", "another number of elements", "pooling")
        assert "(16, 32, 7, 7)" not in line
        # As many elements, flattened as the classifier's Flatten would: its logits come out right, the shape not.
        flat = first.reshape(16, -1).clone()
        line = fails(capsys, checks.check_pipeline(flat, whole[6:](flat), first, full), "shape (16, 1568)",
                     "as many elements, in another shape")
        assert "(16, 32, 7, 7)" not in line
        # Received right, then the wrong layers run on it.
        fails(capsys, checks.check_pipeline(first.clone(), None, first, full), "no `logits`")
        fails(capsys, checks.check_pipeline(first.clone(), whole[8:](torch.zeros(16, 128)), first, full),
              "differ from the whole model's")


# ---------------------------------------------------------------- the gradient sent back

def pipeline_backward(requires_grad=True, loss_backward=True, sends="gradient", rank_0="received",
                      loss=None):
    """Both ranks' parts of the backward exercise, run in one process on the CPU: what the check gathers,
    rank 1's `(activations.requires_grad, activations.grad)` and each stage's parameter gradients."""
    import copy

    import torch.nn.functional as F

    whole, x, _, _ = pipeline_tensors()
    labels = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(2))
    first, second = copy.deepcopy(whole[:6]), copy.deepcopy(whole[6:])
    out = first(x)  # rank 0, autograd on
    activations = out.detach().clone()  # rank 1's buffer, received
    if requires_grad == "after forward":
        logits = second(activations)
        activations.requires_grad_()
    else:
        activations.requires_grad_(requires_grad)
        logits = second(activations)
    if loss_backward:
        (loss or F.cross_entropy)(logits, labels).backward()
    sent = {"gradient": activations.grad, "activations": activations.detach()}[sends]
    if rank_0 == "received" and sent is not None:  # (sending None fails on rank 1: rank 0's receive times out)
        out.backward(sent)
    elif rank_0 == "sum":
        out.sum().backward()
    elif rank_0 == "mean":
        out.mean().backward()
    grads = [[None if p.grad is None else p.grad.clone() for p in part.parameters()] for part in (first, second)]
    return (activations.requires_grad, activations.grad), grads, whole, x, labels


def test_pipeline_backward_check(capsys):
    assert checks.check_pipeline_backward(*pipeline_backward())
    assert "PASS: rank 1 sent back the gradient" in verdict(capsys)
    # Rank 1 sends its activations, not their gradient: rank 0's backward starts from the wrong tensor.
    fails(capsys, checks.check_pipeline_backward(*pipeline_backward(sends="activations")),
          "started from the activations themselves", "`activations.grad`")
    # The received buffer never told to require grad: activations.grad stays None, nothing to send.
    fails(capsys, checks.check_pipeline_backward(*pipeline_backward(requires_grad=False)), "does not require grad",
          "before rank 1's stage runs on it")
    # Told too late, after rank 1's stage ran on it: autograd recorded nothing through it.
    fails(capsys, checks.check_pipeline_backward(*pipeline_backward(requires_grad="after forward")),
          "requires grad but has no gradient")
    # Rank 0 runs its own backward without the gradient rank 1 sent.
    fails(capsys, checks.check_pipeline_backward(*pipeline_backward(rank_0="sum")), "`out.sum().backward()`",
          "`out.backward(gradient)`")
    fails(capsys, checks.check_pipeline_backward(*pipeline_backward(rank_0="mean")), "`out.sum().backward()`")
    # Rank 0 received but never called backward (or the receive failed).
    fails(capsys, checks.check_pipeline_backward(*pipeline_backward(rank_0=None)), "rank 0's layers have no gradients")
    # Rank 1's loss is not the model's.
    fails(capsys, checks.check_pipeline_backward(*pipeline_backward(loss=lambda logits, labels: logits.sum())),
          "rank 1's gradients differ", "F.cross_entropy(logits, labels)")
    # The untouched exercise: the forward ran and rank 1 received, then the blank raised.
    received, grads, whole, x, labels = pipeline_backward(requires_grad=False, loss_backward=False, rank_0=None)
    line = fails(capsys, checks.check_pipeline_backward(received, grads, whole, x, labels),
                 "rank 1's layers have no gradients")
    assert "requires_grad" not in line  # the first hint does not give the answer away
    fails(capsys, checks.check_pipeline_backward(None, [None, None], whole, x, labels), "rank 1 has no `activations`")
    fails(capsys, checks.check_pipeline_backward(received, None, whole, x, labels), "rank 1's layers have no gradients")


# ---------------------------------------------------------------- the bubble

def bubble_solution(forward_s, backward_s, microbatches):
    per_micro_batch = [f + b for f, b in zip(forward_s, backward_s)]
    step = (microbatches - 1) * max(per_micro_batch) + sum(per_micro_batch)
    return 1 - microbatches * sum(per_micro_batch) / (len(per_micro_batch) * step)


MEASURED = ([0.84e-3, 0.09e-3], [0.64e-3, 0.22e-3], 4)  # the stored 2-CPU run's stage times


def test_the_checks_schedule_is_the_one_the_figure_draws():
    import matplotlib.pyplot as plt

    from scaledl.workshop import plots
    from scaledl.workshop.checks.lesson_11 import _EQUAL_STAGES, _UNEQUAL_STAGES, _gpipe_bubble

    for forward_s, backward_s, microbatches in _EQUAL_STAGES + _UNEQUAL_STAGES:
        figure = plots.pipeline_schedule(list(forward_s), list(backward_s), microbatches)
        plt.close(figure)
        assert abs(figure.bubble - _gpipe_bubble(forward_s, backward_s, microbatches)) < 1e-12
        assert abs(bubble_solution(forward_s, backward_s, microbatches) - figure.bubble) < 1e-12


def test_bubble_check(capsys):
    from scaledl.workshop.checks.lesson_11 import _gpipe_bubble

    assert checks.check_bubble(bubble_solution, *MEASURED)
    line = verdict(capsys)
    assert "20%" in line and "slowest stage sets the pace" in line
    assert "%" not in line.replace("20%", "")  # nothing measured: the line is the same on every run
    # Unusual but right: the schedule simulated step by step, as the figure draws it.
    assert checks.check_bubble(lambda f, b, m: _gpipe_bubble(f, b, m), *MEASURED)
    verdict(capsys)
    # Measured stages with no one stage slowest both ways: the closed form still passes, with the same line.
    assert checks.check_bubble(bubble_solution, [1.0, 0.5], [0.5, 1.0], 4)
    assert verdict(capsys) == line
    # The equal-stage formula, whatever the stages cost.
    fails(capsys, checks.check_bubble(lambda f, b, m: (len(f) - 1) / (m + len(f) - 1), *MEASURED),
          "equal-stage formula's 20%", "slowest stage sets the pace")
    # No pipelining: one micro batch through every stage after another.
    fails(capsys, checks.check_bubble(lambda f, b, m: 1 - 1 / len(f), *MEASURED), "no overlap")
    # The step as M times the slowest stage alone: no filling and draining.
    def no_fill(f, b, m):
        per = [x + y for x, y in zip(f, b)]
        return 1 - m * sum(per) / (len(per) * m * max(per))
    fails(capsys, checks.check_bubble(no_fill, *MEASURED), "filling and draining")
    # One micro batch too many on the slowest stage.
    def off_by_one(f, b, m):
        per = [x + y for x, y in zip(f, b)]
        return 1 - m * sum(per) / (len(per) * (m * max(per) + sum(per)))
    fails(capsys, checks.check_bubble(off_by_one, *MEASURED), "(S - 1) / (M + S - 1) = 20%", "yours 33%")
    # Forward times only.
    fails(capsys, checks.check_bubble(lambda f, b, m: bubble_solution(f, [0.0] * len(b), m), *MEASURED),
          "the schedule idles 43%", "plus the forward and backward of one micro batch")
    # A percentage.
    fails(capsys, checks.check_bubble(lambda f, b, m: 100 * bubble_solution(f, b, m), *MEASURED), "not a percentage")
    fails(capsys, checks.check_bubble(untouched, *MEASURED), "NotImplementedError")
    unattempted(capsys, checks.check_bubble(None, *MEASURED), "`bubble` is not set")


# ---------------------------------------------------------------- the micro batches a schedule holds
def peak_solution(schedule, stages, microbatches):
    if schedule == "gpipe":
        return [microbatches] * stages
    return [min(microbatches, stages - stage) for stage in range(stages)]


def test_peak_in_flight_check(capsys):
    assert checks.check_peak_in_flight(peak_solution)
    assert "1F1B holds min(M, S - s)" in verdict(capsys)
    fails(capsys, checks.check_peak_in_flight(None), "`peak_in_flight` is not set")
    fails(capsys, checks.check_peak_in_flight(untouched), "NotImplementedError")
    fails(capsys, checks.check_peak_in_flight(lambda schedule, stages, m: [m] * stages), "is GPipe's")
    fails(capsys, checks.check_peak_in_flight(
        lambda schedule, stages, m: [m] * stages if schedule == "gpipe" else [min(m, stages)] * stages),
        "a later stage gets its first backward sooner")
    fails(capsys, checks.check_peak_in_flight(
        lambda schedule, stages, m: [m] * stages if schedule == "gpipe" else [stages - s for s in range(stages)]),
        "cannot hold more micro batches than there are")
    fails(capsys, checks.check_peak_in_flight(lambda schedule, stages, m: [stages - s for s in range(stages)]),
          "is 1F1B's")
    fails(capsys, checks.check_peak_in_flight(lambda schedule, stages, m: "many"), "a list of whole numbers")


# ---------------------------------------------------------------- the interleaved bubble
def test_interleaved_bubble_check(capsys):
    assert checks.check_interleaved_bubble(lambda s, m, v: (s - 1) / (v * m + s - 1))
    assert "1/17 = 5.9%" in verdict(capsys)
    fails(capsys, checks.check_interleaved_bubble(None), "`interleaved_bubble` is not set")
    fails(capsys, checks.check_interleaved_bubble(untouched), "NotImplementedError")
    fails(capsys, checks.check_interleaved_bubble(lambda s, m, v: (s - 1) / (v * m)), "against the ideal step")
    fails(capsys, checks.check_interleaved_bubble(lambda s, m, v: (s - 1) / (m + s - 1)), "the plain 1F1B bubble")
    fails(capsys, checks.check_interleaved_bubble(lambda s, m, v: (s - 1) / (m + s - 1) / v), "only the idle time")
    fails(capsys, checks.check_interleaved_bubble(lambda s, m, v: 100 * (s - 1) / (v * m + s - 1)),
          "not a percentage")
    fails(capsys, checks.check_interleaved_bubble(lambda s, m, v: v * (s - 1) / (v * m + s - 1)),
          "want (S - 1) / (v·M + S - 1)")
    fails(capsys, checks.check_interleaved_bubble(lambda s, m, v: "small"), "as a number")
