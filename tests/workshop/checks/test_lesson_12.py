"""Lesson 12's check (the tensor-parallel MLP): it passes the solution, FAILs on what an untouched exercise
leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one line."""

import torch

from conftest import fails, verdict
from scaledl.workshop import checks


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


# ---------------------------------------------------------------- the rank groups of a dp x tp grid

def rank_groups(world_size, tp, pp=1):
    """The stretch's answer: init_device_mesh's (pp, dp, tp) grid, row-major."""
    dp = world_size // (tp * pp)

    def rank(stage, replica, piece):
        return (stage * dp + replica) * tp + piece

    return {"tp": [[rank(s, r, p) for p in range(tp)] for s in range(pp) for r in range(dp)],
            "dp": [[rank(s, r, p) for r in range(dp)] for s in range(pp) for p in range(tp)],
            "pp": [[rank(s, r, p) for s in range(pp)] for r in range(dp) for p in range(tp)]}


def flat_groups(world_size, tp):
    """The exercise's answer: the (dp, tp) grid, two arguments and two keys."""
    groups = rank_groups(world_size, tp)
    return {"tp": groups["tp"], "dp": groups["dp"]}


def test_rank_groups(capsys):
    # The exercise alone: two arguments, the stretch not tried, read on Polaris' 2 nodes at tp 2.
    assert checks.check_rank_groups(flat_groups)
    line = verdict(capsys)
    assert "every (dp, tp) grid right (4 grids)" in line and "every tp group ([[0, 1], [2, 3], [4, 5], [6, 7]])" in line
    assert "e.g. [0, 2, 4, 6], spans nodes [0, 1]" in line and "the stretch (optional)" in line, line
    # The stretch as well: a third argument, pp, and a "pp" key.
    assert checks.check_rank_groups(rank_groups)
    line = verdict(capsys)
    assert "every tp group ([[0, 1], [2, 3], [4, 5], [6, 7]])" in line and "e.g. [0, 4], spans nodes [0, 1]" in line
    # Groups, and the ranks in them, listed in another order are the same groups.
    assert checks.check_rank_groups(lambda n, tp, pp=1: {key: [group[::-1] for group in value[::-1]]
                                                         for key, value in rank_groups(n, tp, pp).items()})
    verdict(capsys)
    fails(capsys, checks.check_rank_groups(None), "`rank_groups` is not set")
    fails(capsys, checks.check_rank_groups([[0, 1]]), "must be a function")
    fails(capsys, checks.check_rank_groups(lambda n, tp: (flat_groups(n, tp)["tp"], flat_groups(n, tp)["dp"])),
          "must return a dict")
    fails(capsys, checks.check_rank_groups(lambda n, tp: {"tp": flat_groups(n, tp)["tp"]}),
          "with the keys \"tp\" and \"dp\"")
    # The stretch tried without a "pp" key: the exercise is right, so a PASS that says what the stretch lacks.
    assert checks.check_rank_groups(lambda n, tp, pp=1: {k: v for k, v in rank_groups(n, tp, pp).items() if k != "pp"})
    assert "with the keys \"tp\", \"dp\" and \"pp\"" in verdict(capsys)
    # The grid numbered column by column (dp fastest): tp groups strided, dp groups consecutive.
    fails(capsys, checks.check_rank_groups(lambda n, tp: {"tp": rank_groups(n, n // tp)["dp"],
                                                          "dp": rank_groups(n, n // tp)["tp"]}),
          "rank_groups(8, 4)[\"tp\"] is not the grid's tp groups", "2 groups of 4 ranks")
    # pp and dp swapped, (dp, pp, tp): right on every 2D grid, wrong once there are stages, the stretch.  The
    # exercise is the (dp, tp) grid, so the verdict is a PASS that says what the stretch lacks.
    def dp_outermost(n, tp, pp=1):
        groups = rank_groups(n, tp, n // (tp * pp))
        return {"tp": groups["tp"], "dp": groups["pp"], "pp": groups["dp"]}
    assert checks.check_rank_groups(dp_outermost)
    line = verdict(capsys)
    assert "the stretch, a pipeline, not yet" in line and "rank_groups(8, 2, 2)[\"dp\"]" in line, line
    assert "last coordinate fastest" in line, line

    def flat_only(n, tp, pp=1):  # the stretch begun, not finished
        if pp > 1:
            raise NotImplementedError("the stretch")
        return flat_groups(n, tp)
    assert checks.check_rank_groups(flat_only)
    assert "rank_groups(8, 2, 2) raised NotImplementedError" in verdict(capsys)
    fails(capsys, checks.check_rank_groups(lambda n, tp: {"tp": [list(range(n))], "dp": [[r] for r in range(n)]}),
          "rank_groups(8, 1)")
    fails(capsys, checks.check_rank_groups(lambda n, tp: 1 / 0), "raised ZeroDivisionError")


# ---------------------------------------------------------------- tp groups that cross a node boundary

def crossing_tp_groups(world_size, tp, ranks_per_node):
    """The exercise's answer: the rows whose ranks lie on more than one node (a node's ranks are consecutive)."""
    return [row for row in rank_groups(world_size, tp)["tp"] if len({rank // ranks_per_node for rank in row}) > 1]


def test_crossing_groups(capsys):
    assert checks.check_crossing_groups(crossing_tp_groups)
    line = verdict(capsys)
    assert "tp 3 on 3 Polaris nodes: 2 of 4 tp groups" in line and "[[8, 9, 10, 11, 12, 13, 14, 15]]" in line
    fails(capsys, checks.check_crossing_groups(None), "`crossing_tp_groups` is not set")
    fails(capsys, checks.check_crossing_groups(3), "must be a function")
    # The rule of thumb alone: every group crosses when tp does not divide a node's ranks. Wrong for tp 3.
    fails(capsys, checks.check_crossing_groups(
        lambda n, tp, per_node: rank_groups(n, tp, 1)["tp"] if per_node % tp else []),
        "crossing_tp_groups(12, 3, 4) gives 4 group(s), and 2 of the 4")
    # Only groups larger than a node counted.
    fails(capsys, checks.check_crossing_groups(
        lambda n, tp, per_node: rank_groups(n, tp, 1)["tp"] if tp > per_node else []), "crossing_tp_groups(12, 3, 4)")
    # The dp groups (columns) taken for the tp groups.
    fails(capsys, checks.check_crossing_groups(
        lambda n, tp, per_node: [g for g in rank_groups(n, tp, 1)["dp"] if len({r // per_node for r in g}) > 1]),
        "crossing_tp_groups(8, 4, 4) gives 4 group(s), and 0 of the 2")
    fails(capsys, checks.check_crossing_groups(lambda n, tp, per_node: 5), "must return a list of groups")


# ---------------------------------------------------------------- the all-reduces a block makes

COUNTED = [(4, 8, 2), (4, 8, 2)]  # CommDebugMode on 2 ranks, a 2-block model: forward, backward, depth


def test_allreduce_count(capsys):
    def count(forward=2, backward=4, fused_qkv=4):
        return {"forward": forward, "backward": backward, "fused_qkv": fused_qkv}

    assert checks.check_allreduce_count(count(), COUNTED)
    assert "2 all-reduces a block in forward and 4 in backward" in verdict(capsys)
    # Megatron-LM's count, q, k and v fused: the rung's plan does not fuse them.
    fails(capsys, checks.check_allreduce_count(count(backward=2), COUNTED), "Megatron-LM's count")
    fails(capsys, checks.check_allreduce_count(count(forward=4), COUNTED), "[\"forward\"]")
    fails(capsys, checks.check_allreduce_count(count(backward=6), COUNTED), "input gradient is a partial sum")
    # The fused count: forward unchanged, backward one column-wise layer for q, k and v (2 + 2), not the rung's 6.
    fails(capsys, checks.check_allreduce_count(count(fused_qkv=6), COUNTED), "[\"fused_qkv\"]")
    fails(capsys, checks.check_allreduce_count(count(fused_qkv=2), COUNTED), "forward plus backward")
    # A FAIL names the pass, never the number.
    line = fails(capsys, checks.check_allreduce_count(count(forward=6), COUNTED), "partial sum")
    assert not any(character.isdigit() for character in line), line
    fails(capsys, checks.check_allreduce_count(count(forward=2.0), COUNTED), "whole number")
    fails(capsys, checks.check_allreduce_count({"forward": 2, "backward": 4}, COUNTED), "keys")
    fails(capsys, checks.check_allreduce_count({"fwd": 2, "bwd": 4}, COUNTED), "keys")
    fails(capsys, checks.check_allreduce_count(None, COUNTED), "is not set")
    fails(capsys, checks.check_allreduce_count(count(), [None, None]), "no count")
    fails(capsys, checks.check_allreduce_count(count(), [(4, 8, 2), (2, 4, 2)]), "different")
