"""Lesson 9's checks (ZeRO's formula, the engine's bytes, FSDP2's collectives): each passes the solution, FAILs on
what an untouched exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix
in one line."""
import math

import numpy as np

from conftest import fails, untouched, verdict
from scaledl.workshop import checks


def zero_solution(num_params, world_size, stage, params=2, grads=2, optimizer=12):
    return {"params": params * num_params / (world_size if stage >= 3 else 1),
            "grads": grads * num_params / (world_size if stage >= 2 else 1),
            "optimizer": optimizer * num_params / (world_size if stage >= 1 else 1)}


def test_zero_formula_check(capsys):
    def swapped(num_params, world_size, stage, params=2, grads=2, optimizer=12):  # parameters at 2, gradients at 3
        return {"params": params * num_params / (world_size if stage >= 2 else 1),
                "grads": grads * num_params / (world_size if stage >= 3 else 1),
                "optimizer": optimizer * num_params / (world_size if stage >= 1 else 1)}

    def paper_only(num_params, world_size, stage, params=2, grads=2, optimizer=12):  # the text's 2 + 2 + 12, copied
        return zero_solution(num_params, world_size, stage)

    def forgot_gradients(num_params, world_size, stage, *sizes):
        parts = zero_solution(num_params, world_size, stage, *sizes)
        return {**parts, "grads": parts["grads"] * (world_size if stage >= 2 else 1)}

    def total_only(num_params, world_size, stage, *sizes):
        return sum(zero_solution(num_params, world_size, stage, *sizes).values())

    def stage_off_by_one(num_params, world_size, stage, *sizes):  # `stage > 1` where `stage >= 1` belongs
        return zero_solution(num_params, world_size, stage - 1 if stage else 0, *sizes)

    def padded(num_params, world_size, stage, *sizes):  # unusual but right: whole bytes, rounded up per partition
        return {key: math.ceil(value) for key, value in zero_solution(num_params, world_size, stage, *sizes).items()}

    assert checks.check_zero_formula(zero_solution)
    assert "18 with fp32 gradients" in verdict(capsys)
    assert checks.check_zero_formula(padded, world_size=7)
    verdict(capsys)
    # The paper's bytes hard-coded: right for 16 bytes a parameter, wrong for fp32 gradients.
    fails(capsys, checks.check_zero_formula(paper_only), "2 + 4 + 12 = 18 bytes per parameter", "the argument `grads`")
    fails(capsys, checks.check_zero_formula(stage_off_by_one), "stage 1: optimizer states are partitioned from stage 1")
    assert sum(swapped(7.5e9, 8, 2).values()) == sum(zero_solution(7.5e9, 8, 2).values())
    fails(capsys, checks.check_zero_formula(swapped), "stage 2", "every rank still holds all the parameters")
    fails(capsys, checks.check_zero_formula(forgot_gradients), "stage 2: gradients are partitioned from stage 2")
    fails(capsys, checks.check_zero_formula(total_only), "return a dict")
    fails(capsys, checks.check_zero_formula(lambda n, w, s: zero_solution(n, w, s)), "TypeError")
    fails(capsys, checks.check_zero_formula(untouched), "NotImplementedError")
    fails(capsys, checks.check_zero_formula(None), "not set")
    # first_fit: 18 bytes on 16 ranks fit first at stage 2 in 90% of 40 GiB, 38.7 GB (the paper's 16 bytes would
    # at stage 1, 35.6 GB; on 8 ranks both would first fit at stage 2, and the trap would go unseen).
    fits = lambda sizes: min(s for s in range(4) if sum(zero_solution(7.5e9, 16, s, *sizes).values())  # noqa: E731
                             <= 0.9 * 40 * 2**30)
    assert (fits((2, 2, 12)), fits((2, 4, 12))) == (1, 2)  # the case tells 16 bytes from 18
    assert checks.check_zero_formula(zero_solution, first_fit=2)
    assert "first fit at stage 2: 22.5 GB a rank, against 50.6 GB at stage 1, in 38.7 GB (90% of 40 GiB)" \
        in verdict(capsys)
    fails(capsys, checks.check_zero_formula(zero_solution, first_fit=1), "at stage 1 a rank keeps 50.6 GB",
          "count the gradients at 4 bytes")
    fails(capsys, checks.check_zero_formula(zero_solution, first_fit=3), "stage 2 already fits")
    fails(capsys, checks.check_zero_formula(zero_solution, first_fit="2"), "give a stage")
    fails(capsys, checks.check_zero_formula(zero_solution, first_fit=None), "`first_fit` is not set")


def engine_solution(num_params, world_size, stage):  # the paper's rule, this engine's bytes, after backward
    share = lambda partitioned: num_params / world_size if partitioned else num_params  # noqa: E731
    return {"params": 4 * share(stage >= 3), "grads": 4 * share(stage >= 1), "optimizer": 4 * share(stage >= 1)}


def test_engine_bytes_check(capsys):
    def changed(key, value):  # the solution with one part replaced, from stage 1 on
        return lambda n, w, s: {**engine_solution(n, w, s), **({key: value(n, w, s)} if s >= 1 else {})}

    assert checks.check_engine_bytes(engine_solution)
    assert "after backward" in verdict(capsys)
    # Unusual but right: whole bytes per partition, rounded up as DeepSpeed pads, NumPy integers, a total.
    def padded(num_params, world_size, stage):
        parts = {key: np.int64(math.ceil(value))
                 for key, value in engine_solution(num_params, world_size, stage).items()}
        return {**parts, "total": sum(parts.values())}
    assert checks.check_engine_bytes(padded, world_size=2)
    verdict(capsys)
    # The paper's count, every full gradient at stage 1: the peak during backward, not what is left after it.
    def paper_stages(n, w, s):
        share = lambda partitioned: n / w if partitioned else n  # noqa: E731
        return {"params": 4 * share(s >= 3), "grads": 4 * share(s >= 2), "optimizer": 4 * share(s >= 1)}
    fails(capsys, checks.check_engine_bytes(paper_stages), "stage 1", "after backward", "kept only this rank's part")
    # The paper's mixed-precision Adam, copied from exercise 1.
    fails(capsys, checks.check_engine_bytes(zero_solution), "stage 0", "fp32, 4 bytes")
    # DeepSpeed's fp32 copy encoded from stage 1 on: the table after the check adds it, not the paper's rule.
    fails(capsys, checks.check_engine_bytes(changed("optimizer", lambda n, w, s: 8 * n / w)),
          "stage 1", "DeepSpeed's own", "leave it out")
    # The copy at stage 0 too.
    fails(capsys, checks.check_engine_bytes(lambda n, w, s: {**engine_solution(n, w, s),
                                                             **({"optimizer": 8 * n} if s == 0 else {})}),
          "stage 0", "4 bytes per parameter")
    # Momentum left whole at stage 1.
    fails(capsys, checks.check_engine_bytes(changed("optimizer", lambda n, w, s: 4 * n if s == 1 else 4 * n / w)),
          "stage 1: after backward the optimizer states are partitioned from stage 1 on")
    # Adam's 12 bytes with fp32 weights.
    fails(capsys, checks.check_engine_bytes(lambda n, w, s: {**engine_solution(n, w, s),
                                                             "optimizer": 12 * n / (w if s else 1)}),
          "stage 0", "Adam's")
    # Stage 2 left the gradients whole (stage 1 right).
    fails(capsys, checks.check_engine_bytes(changed("grads", lambda n, w, s: 4 * n if s == 2 else 4 * n / w)),
          "stage 2: after backward the gradients are partitioned from stage 1 on")
    # Stage 0 partitioned the gradients too.
    fails(capsys, checks.check_engine_bytes(lambda n, w, s: {**engine_solution(n, w, s), "grads": 4 * n / w}),
          "stage 0: every rank still holds all the gradients")
    # The parameters partitioned from stage 2 (stage off by one).
    fails(capsys, checks.check_engine_bytes(lambda n, w, s: engine_solution(n, w, min(s + 1, 3) if s else 0)),
          "stage 2: every rank still holds all the parameters")
    fails(capsys, checks.check_engine_bytes(lambda n, w, s: sum(engine_solution(n, w, s).values())), "return a dict")
    fails(capsys, checks.check_engine_bytes(untouched), "NotImplementedError")
    fails(capsys, checks.check_engine_bytes(None), "not set")


# ---------------------------------------------------------------- FSDP2

def fsdp2_solution(num_layers, root_holds_params, reshard_after_forward=None):
    root = (2 if reshard_after_forward is True else 1) if root_holds_params else 0
    return {"all_gathers": (1 if reshard_after_forward is False else 2) * num_layers + root,
            "reduce_scatters": num_layers + bool(root_holds_params)}


# What CommDebugMode counted on 2 gloo ranks of torch 2.13 for torch_cnn with its two convolutions sharded on their
# own and its two linear layers left to the root's fully_shard.
COUNTED = {"None": {"all_gathers": 5, "reduce_scatters": 3, "layers": 2, "root_holds_params": True,
                  "whole_after_forward": 0},
           "True": {"all_gathers": 6, "reduce_scatters": 3, "layers": 2, "root_holds_params": True,
                  "whole_after_forward": 0},
           "False": {"all_gathers": 3, "reduce_scatters": 3, "layers": 2, "root_holds_params": True,
                   "whole_after_forward": 2}}


def test_fsdp_collectives_check(capsys):
    assert checks.check_fsdp_collectives(fsdp2_solution)
    assert "all 9 cases" in verdict(capsys)
    assert checks.check_fsdp_collectives(fsdp2_solution, [COUNTED] * 2)
    assert "5 all-gathers and 3 reduce-scatters with reshard_after_forward=None" in verdict(capsys)
    # Unusual but right: numpy numbers, 4 ranks.
    assert checks.check_fsdp_collectives(lambda n, root, r=None: {
        key: np.int64(value) for key, value in fsdp2_solution(n, root, r).items()}, [COUNTED] * 4)
    verdict(capsys)

    def rule(gathers, scatters=lambda n, root, r: n + bool(root)):
        return lambda n, root, r=None: {"all_gathers": gathers(n, root, r), "reduce_scatters": scatters(n, root, r)}

    right = lambda n, root, r: fsdp2_solution(n, root, r)["all_gathers"]  # noqa: E731
    # The 2n pattern of a root without parameters, copied: the root's own group forgotten.
    fails(capsys, checks.check_fsdp_collectives(rule(lambda n, root, r: (1 if r is False else 2) * n,
                                                     lambda n, root, r: n)),
          "root's own parameters are a group too")
    fails(capsys, checks.check_fsdp_collectives(rule(lambda n, root, r: (1 if r is False else 2) * n)),
          "root's own parameters are a group too: they are all-gathered")
    # The root counted as a layer that reshards, under the default.
    fails(capsys, checks.check_fsdp_collectives(rule(lambda n, root, r: right(n, root, r) + (root and r is None))),
          "the root keeps its parameters")
    # An explicit True taken as the default for the root.
    fails(capsys, checks.check_fsdp_collectives(rule(lambda n, root, r: right(n, root, r) - (root and r is True))),
          "only the default (None) keeps the root gathered")
    # Backward's second gather forgotten, or made where the layer kept its weights.
    fails(capsys, checks.check_fsdp_collectives(rule(lambda n, root, r: n + (1 if root else 0))), "again")
    fails(capsys, checks.check_fsdp_collectives(rule(lambda n, root, r: 2 * n + (1 if root else 0))), "once a step")
    # The root without parameters counted anyway; a collective per tensor (weight and bias).
    fails(capsys, checks.check_fsdp_collectives(rule(lambda n, root, r: right(n, root, r) + (not root))),
          "root here holds no parameters")
    fails(capsys, checks.check_fsdp_collectives(rule(lambda n, root, r: 2 * right(n, root, r))), "not tensors")
    fails(capsys, checks.check_fsdp_collectives(rule(right, lambda n, root, r: 0)),
          "reduce-scatters each group's gradients")
    fails(capsys, checks.check_fsdp_collectives(rule(right, lambda n, root, r: 2 * (n + bool(root)))),
          "leave once a step")
    fails(capsys, checks.check_fsdp_collectives(lambda n, root, r=None: (n, n)), "two keys")
    # Right on the cases, but not what the ranks counted (a count that is not this setting's), or no count.
    fails(capsys, checks.check_fsdp_collectives(fsdp2_solution, [{**COUNTED, "None": {**COUNTED["None"],
                                                                                   "all_gathers": 4}}] * 2),
          "live ranks counted 4 all-gathers")
    fails(capsys, checks.check_fsdp_collectives(fsdp2_solution, [COUNTED, {**COUNTED, "False": COUNTED["True"]}]),
          "different collectives")
    fails(capsys, checks.check_fsdp_collectives(fsdp2_solution, [None, None]), "no count")
    fails(capsys, checks.check_fsdp_collectives(untouched), "NotImplementedError")
    fails(capsys, checks.check_fsdp_collectives(None), "not set")


def test_the_live_count_travels_through_ipyparallel():
    """ipyparallel sorts the keys of a dict it sends: the live count keys its settings by strings, which sort."""
    import pytest

    serialize = pytest.importorskip("ipyparallel.serialize")
    assert serialize.deserialize_object(serialize.serialize_object(COUNTED))[0] == COUNTED
    with pytest.raises(TypeError):
        serialize.serialize_object({None: 1, True: 2, False: 3})
