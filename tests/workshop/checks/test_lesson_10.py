"""Lesson 10's checks (the pipeline hand-off, the tensor-parallel MLP): each passes the solution, FAILs on what
an untouched exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one
line."""

import torch

from conftest import fails, verdict
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
        # A buffer of the wrong shape.
        fails(capsys, checks.check_pipeline(torch.zeros(16, 32, 14, 14), None, first, full),
              "shape (16, 32, 14, 14)", "(16, 32, 7, 7)")
        # Received right, then the wrong layers run on it.
        fails(capsys, checks.check_pipeline(first.clone(), None, first, full), "no `logits`")
        fails(capsys, checks.check_pipeline(first.clone(), whole[8:](torch.zeros(16, 128)), first, full),
              "differ from the whole model's")


# ---------------------------------------------------------------- tensor parallelism

def tensor_parallel_answers(world_size=2, all_reduce=True, bias_once=True):
    """What each rank computes by hand: its slices of the MLP, its partial product, the sum."""
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    share = 64 // world_size
    with torch.no_grad():
        w1s = [mlp[0].weight[r * share:(r + 1) * share] for r in range(world_size)]
        b1s = [mlp[0].bias[r * share:(r + 1) * share] for r in range(world_size)]
        w2s = [mlp[2].weight[:, r * share:(r + 1) * share] for r in range(world_size)]
        partials = [F.linear(F.gelu(F.linear(x, w1, b1)), w2) + (0 if bias_once else mlp[2].bias)
                    for w1, b1, w2 in zip(w1s, b1s, w2s)]
        summed = sum(partials) if all_reduce else None
        ys = [summed + (mlp[2].bias if bias_once else 0) if all_reduce else p + mlp[2].bias for p in partials]
    return ys, w1s, w2s, mlp, x


def test_tensor_parallel_mlp_check(capsys):
    assert checks.check_tensor_parallel_mlp(*tensor_parallel_answers())
    assert "PASS: each of the 2 ranks" in verdict(capsys)
    assert checks.check_tensor_parallel_mlp(*tensor_parallel_answers(world_size=4))
    verdict(capsys)
    # The idea of the exercise: without the all-reduce each rank keeps a partial sum.
    fails(capsys, checks.check_tensor_parallel_mlp(*tensor_parallel_answers(all_reduce=False)),
          "only its partial sum", "all-reduce")
    fails(capsys, checks.check_tensor_parallel_mlp(*tensor_parallel_answers(bias_once=False)),
          "bias is in the sum 2 times")
    ys, w1s, w2s, mlp, x = tensor_parallel_answers()
    # The whole MLP on every rank: the right output, but nothing split.
    fails(capsys, checks.check_tensor_parallel_mlp([mlp(x).detach()] * 2, [mlp[0].weight] * 2, w2s, mlp, x),
          "rank 0 has `w1` of shape (64, 16)", "rows 0-31")
    # The second layer split by its output features (rows), as the first: the wrong dimension.
    fails(capsys, checks.check_tensor_parallel_mlp(ys, w1s, [mlp[2].weight[:8], mlp[2].weight[8:]], mlp, x),
          "columns 0-31 of the second layer's weight")
    fails(capsys, checks.check_tensor_parallel_mlp([None, None], [None, None], [None, None], mlp, x), "has no `y`")
