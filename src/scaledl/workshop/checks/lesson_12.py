"""Lesson 12's checks: a tensor-parallel MLP, split by hand, the all-reduces a block makes, the rank groups of a
(dp, tp) grid (a (pp, dp, tp) grid in the stretch), and which of its tp groups cross a node boundary."""
from __future__ import annotations

from scaledl.workshop.checks.common import _attempt, _FAILED, _unfinished, _verdict

# (world_size, tp, pp) grids the groups are checked on: 2D (pp 1) and 3D, from all dp to all pp.
GRIDS = ((8, 1, 1), (8, 4, 1), (8, 2, 2), (16, 4, 2), (12, 2, 3), (8, 1, 2), (24, 4, 2), (6, 3, 1), (8, 8, 1),
         (8, 1, 8))


def _grid(world_size: int, tp: int, pp: int = 1) -> dict:
    """init_device_mesh's layout of the shape (pp, dp, tp), row-major: rank = (stage x dp + replica) x tp + slice
    (torch/distributed/device_mesh.py, the identity rank map over sizes with contiguous strides); a group along one
    dimension varies that coordinate and holds the other two."""
    dp = world_size // (tp * pp)

    def rank(stage: int, replica: int, piece: int) -> int:
        return (stage * dp + replica) * tp + piece

    return {"tp": [[rank(s, r, p) for p in range(tp)] for s in range(pp) for r in range(dp)],
            "dp": [[rank(s, r, p) for r in range(dp)] for s in range(pp) for p in range(tp)],
            "pp": [[rank(s, r, p) for s in range(pp)] for r in range(dp) for p in range(tp)]}


def _rank_groups_wrong(rank_groups, world_size: int, tp: int, pp: int, quiet: bool = False):
    """None when `rank_groups` gives the grid's groups, else the FAIL text (False after a FAIL already printed by
    `_attempt`; `quiet`: an error is the text, nothing printed).  With pp = 1 it is called as
    `rank_groups(world_size, tp)`, the exercise, and a "pp" key is optional; with pp > 1 as
    `rank_groups(world_size, tp, pp)`, the stretch."""
    args = (world_size, tp) if pp == 1 else (world_size, tp, pp)
    call = f"rank_groups{args}"
    if quiet:
        try:
            got = rank_groups(*args)
        except Exception as error:  # the stretch left out: any error says so
            return f"{call} raised {type(error).__name__}"
    else:
        got = _attempt("rank_groups", call, lambda: rank_groups(*args))
        if got is _FAILED:
            return False
    want = _grid(world_size, tp, pp)
    names = ("tp", "dp", "pp") if pp > 1 else ("tp", "dp")
    if not isinstance(got, dict) or not set(names) <= set(got) or not set(got) <= {"tp", "dp", "pp"}:
        keys = '"tp", "dp" and "pp"' if pp > 1 else '"tp" and "dp"'
        return f"{call} must return a dict with the keys {keys}, each a list of groups"
    for name in names + (("pp",) if pp == 1 and "pp" in got else ()):
        try:
            groups = sorted(sorted(int(rank) for rank in group) for group in got[name])
        except TypeError:
            return f"{call}[\"{name}\"] must be a list of groups, each a list of ranks"
        if groups != sorted(want[name]):
            size = len(want[name][0])
            return (f"{call}[\"{name}\"] is not the grid's {name} groups: expect {len(want[name])} groups of {size} "
                    f"rank{'s' if size > 1 else ''} (dp = {world_size // (tp * pp)}); the mesh numbers "
                    f"{'(pp, dp, tp)' if pp > 1 else '(dp, tp)'} with the last coordinate fastest, and a {name} group "
                    f"varies the {name} coordinate, holding the other{' two' if pp > 1 else ' one'}")
    return None


def _takes_pp(rank_groups) -> bool:
    """Whether `rank_groups` takes a third argument, pp: the stretch tried."""
    import inspect

    try:
        inspect.signature(rank_groups).bind(8, 2, 2)
    except TypeError:
        return False
    except ValueError:  # no signature to read: try it
        return True
    return True


def check_rank_groups(rank_groups, ranks_per_node: int = 4) -> bool:
    """`rank_groups(world_size, tp)`: {"tp": [...], "dp": [...]}, the ranks of each group of the (dp, tp) grid
    along each dimension (groups and the ranks in them in any order), graded on the grids of GRIDS with pp = 1.
    The stretch, `rank_groups(world_size, tp, pp)` with a "pp" key, the (pp, dp, tp) grid, is tried on the other
    grids only when the function takes a third argument: wrong there, the verdict is still a PASS that says what the
    stretch lacks.  The PASS reads Polaris' 2-node grid against its nodes of `ranks_per_node` GPUs.  A FAIL names
    the grid and the dimension, the groups' count and size, never the groups."""
    if rank_groups is None:
        return _unfinished("rank_groups")
    if not callable(rank_groups):
        return _verdict(False, "`rank_groups` must be a function of (world_size, tp)")
    flat = [grid for grid in GRIDS if grid[2] == 1]
    for world_size, tp, pp in flat:
        wrong = _rank_groups_wrong(rank_groups, world_size, tp, pp)
        if wrong is not None:
            return wrong if wrong is False else _verdict(False, wrong)
    if not _takes_pp(rank_groups):
        polaris = _grid(8, 2)
        crossing = sorted({rank // ranks_per_node for rank in polaris["dp"][0]})
        return _verdict(True, f"every (dp, tp) grid right ({len(flat)} grids); on 2 Polaris nodes (8 ranks, tp 2) "
                              f"every tp group ({polaris['tp']}) stays inside a node, and each dp group, e.g. "
                              f"{polaris['dp'][0]}, spans nodes {crossing}; the stretch (optional) takes pp as a "
                              "third argument")
    for world_size, tp, pp in (grid for grid in GRIDS if grid[2] > 1):
        wrong = _rank_groups_wrong(rank_groups, world_size, tp, pp, quiet=True)
        if wrong is not None:
            return _verdict(True, f"every (dp, tp) grid right ({len(flat)} grids); the stretch, a pipeline, not "
                                  f"yet: {wrong}")
    polaris = _grid(8, 2, 2)
    crossing = sorted({rank // ranks_per_node for rank in polaris["pp"][0]})
    return _verdict(True, f"on 2 Polaris nodes (8 ranks: pp 2, dp 2, tp 2) every tp group ({polaris['tp']}) and "
                          f"every dp group ({polaris['dp']}) stays inside a node; each pp group, e.g. "
                          f"{polaris['pp'][0]}, spans nodes {crossing}: only the pipeline's sends cross")


# (world_size, tp, ranks_per_node): grids whose tp does or does not divide a node's ranks, on Polaris (4 GPUs a
# node) and Aurora (12 tiles a node).
CROSSING_CASES = ((8, 4, 4), (12, 3, 4), (16, 8, 4), (12, 6, 4), (8, 2, 4), (24, 8, 12), (24, 4, 12), (24, 12, 12),
                  (36, 9, 12))


def _crossing(world_size: int, tp: int, ranks_per_node: int) -> list[list[int]]:
    """The tp groups (rows of the grid) whose ranks lie on more than one node: a node holds ranks_per_node
    consecutive ranks (torchrun numbers the workers node by node)."""
    return [row for row in _grid(world_size, tp, 1)["tp"] if len({rank // ranks_per_node for rank in row}) > 1]


def check_crossing_groups(crossing_tp_groups) -> bool:
    """`crossing_tp_groups(world_size, tp, ranks_per_node)`: the tensor-parallel groups of the (dp, tp) grid whose
    ranks sit on more than one node, on every case of CROSSING_CASES (tp dividing a node's ranks or not).  A wrong
    answer is told which case and how many groups cross, not which."""
    if crossing_tp_groups is None:
        return _unfinished("crossing_tp_groups")
    if not callable(crossing_tp_groups):
        return _verdict(False, "`crossing_tp_groups` must be a function of (world_size, tp, ranks_per_node)")
    for world_size, tp, per_node in CROSSING_CASES:
        call = f"crossing_tp_groups({world_size}, {tp}, {per_node})"
        got = _attempt("crossing_tp_groups", call, lambda: crossing_tp_groups(world_size, tp, per_node))
        if got is _FAILED:
            return False
        want = _crossing(world_size, tp, per_node)
        try:
            found = sorted(sorted(int(rank) for rank in group) for group in got)
        except TypeError:
            return _verdict(False, f"{call} must return a list of groups, each a list of ranks, got {got!r}")
        if found != want:
            return _verdict(False, f"{call} gives {len(found)} group(s), and {len(want)} of the {world_size // tp} "
                                   f"tp groups are not all on one node: a node holds {per_node} consecutive ranks "
                                   f"(rank // {per_node} is its node); a tp group is a row of the grid")
    polaris, aurora = _crossing(12, 3, 4), _crossing(24, 8, 12)
    return _verdict(True, f"tp 3 on 3 Polaris nodes: {len(polaris)} of 4 tp groups cross a node boundary "
                          f"({polaris}); tp 8 on 2 Aurora nodes: {len(aurora)} of 3 ({aurora}); a tp that divides "
                          "the ranks a node holds keeps every group inside one node")


def check_tensor_parallel_mlp(ys, w1s, w2s, mlp, x, tolerance: float = 1e-4) -> bool:
    """Megatron-LM's split of an MLP `Linear(d, h), GELU, Linear(h, d)` over N ranks (Shoeybi et al.
    2019, section 3): rank r holds rows r*h/N.. of the first weight (its output features: column
    parallel) as `w1` and the matching columns of the second (its input features: row parallel) as
    `w2`; its product is a partial sum, and after the all-reduce (and the second bias, added once)
    every rank's `y` is the whole MLP's output on `x`.  Tensors on the CPU, one per rank."""
    import torch

    world_size, hidden = len(ys), mlp[0].out_features
    if any(y is None for y in ys):
        return _verdict(False, f"rank {[y is None for y in ys].index(True)} has no `y`: finish the exercise cell "
                               "above (w1, w2 and y on every rank)")
    share = hidden // world_size
    for rank, (w1, w2) in enumerate(zip(w1s, w2s)):
        rows = slice(rank * share, (rank + 1) * share)
        if w1 is None or tuple(w1.shape) != (share, mlp[0].in_features) or not w1.equal(mlp[0].weight[rows]):
            found = "no `w1`" if w1 is None else f"`w1` of shape {tuple(w1.shape)}"
            return _verdict(False, f"rank {rank} has {found}: it must hold rows {rows.start}-{rows.stop - 1} of the "
                                   f"first layer's weight, shape ({share}, {mlp[0].in_features}): its own output "
                                   "features (a Linear's weight is out x in)")
        if w2 is None or tuple(w2.shape) != (mlp[2].out_features, share) or not w2.equal(mlp[2].weight[:, rows]):
            found = "no `w2`" if w2 is None else f"`w2` of shape {tuple(w2.shape)}"
            return _verdict(False, f"rank {rank} has {found}: it must hold columns {rows.start}-{rows.stop - 1} of "
                                   f"the second layer's weight, shape ({mlp[2].out_features}, {share}): the input "
                                   "features that match its slice of the hidden layer")
    with torch.no_grad():
        expected, bias = mlp(x), mlp[2].bias
    errors = [(y - expected).abs().max().item() for y in ys]
    if max(errors) < tolerance:
        return _verdict(True, f"each of the {world_size} ranks holds 1/{world_size} of both layers, and after the "
                              "all-reduce every rank has the whole MLP's output")
    if (sum(ys) - (world_size - 1) * bias - expected).abs().max().item() < tolerance:
        return _verdict(False, "each rank's `y` is only its partial sum (they add up to the MLP's output): the "
                               "row-parallel layer's products must be summed across the ranks (an all-reduce) "
                               "before they are the output")
    if all((y - expected - (world_size - 1) * bias).abs().max().item() < tolerance for y in ys):
        return _verdict(False, f"the second layer's bias is in the sum {world_size} times: add it once, after the "
                               "ranks' partial products are summed")
    return _verdict(False, f"rank {errors.index(max(errors))}'s `y` differs from the whole MLP's (max error "
                           f"{max(errors):.2g}): GELU between the two layers, each rank on its own slices")


def check_allreduce_count(predicted, counted) -> bool:
    """`predicted`: {"forward": n, "backward": n, "fused_qkv": n}, the all-reduces one block of the tensor-parallel
    rung makes in one forward and in one backward (q, k and v three column-wise layers, as `models.COLUMNWISE`
    lists them), and a block's forward plus backward with q, k and v fused into one column-wise layer
    (Megatron-LM's), against `counted`, one (forward, backward, depth) per rank from CommDebugMode over one step of
    a `depth`-block model.  A FAIL names the pass to recount, never the number."""
    from scaledl import models

    if predicted is None:
        return _unfinished("allreduces_per_block")
    keys = {"forward", "backward", "fused_qkv"}
    if not isinstance(predicted, dict) or set(predicted) != keys:
        return _verdict(False, f"`allreduces_per_block` is a dict with the keys \"forward\", \"backward\" and "
                               f"\"fused_qkv\", got {predicted!r}")
    for name, value in predicted.items():
        if isinstance(value, bool) or not isinstance(value, int):
            return _verdict(False, f"`allreduces_per_block[\"{name}\"]` is {value!r}: give a whole number")
    if not counted or any(count is None for count in counted):
        return _verdict(False, "a rank has no count: run the CommDebugMode cell above on every rank")
    per_block = {(forward / depth, backward / depth) for forward, backward, depth in counted}
    if len(per_block) != 1:
        return _verdict(False, f"the ranks counted different all-reduces ({sorted(per_block)}): run the cell above "
                               "again on every rank")
    forward, backward = per_block.pop()
    if predicted["forward"] != forward:
        return _verdict(False, "`allreduces_per_block[\"forward\"]` is not what CommDebugMode counted: in forward, "
                               "only a layer whose output is a partial sum waits on an all-reduce; which of the "
                               "block's split layers are those?")
    if predicted["backward"] != backward:
        why = ("that is Megatron-LM's count, with q, k and v fused into one layer; the rung's plan splits them as "
               "three layers, each with its own input gradient" if predicted["backward"] == forward else
               "in backward, ask which layers' input gradient is a partial sum over the ranks, as the MLP's first "
               "layer's was, and count those layers in the block")
        return _verdict(False, f"`allreduces_per_block[\"backward\"]` is not what CommDebugMode counted: {why}")
    fused = forward + backward - (len([name for name in models.COLUMNWISE if "attention" in name]) - 1)
    if predicted["fused_qkv"] != fused:
        return _verdict(False, "`allreduces_per_block[\"fused_qkv\"]` is not right: with q, k and v fused into one "
                               "column-wise layer, forward is unchanged; how many column-wise layers' input gradients "
                               "are left in backward? Give forward plus backward")
    return _verdict(True, f"{forward:.0f} all-reduces a block in forward and {backward:.0f} in backward, as "
                          f"CommDebugMode counted on each of the {len(counted)} ranks: one after each row-wise layer, "
                          f"one into each column-wise layer's input gradient (q, k and v three of them); {fused:.0f} "
                          "a block with q, k and v fused, Megatron-LM's count")
