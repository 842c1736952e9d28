"""Lesson 9's checks (ZeRO's formula, the engine's bytes, FSDP2's collectives): each passes the solution, FAILs on
what an untouched exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix
in one line."""
import math

import numpy as np

from conftest import fails, untouched, verdict
from scaledl.workshop import checks


def zero_solution(num_params, world_size, stage):
    return {"params": 2 * num_params / (world_size if stage >= 3 else 1),
            "grads": 2 * num_params / (world_size if stage >= 2 else 1),
            "optimizer": 12 * num_params / (world_size if stage >= 1 else 1)}


def test_zero_formula_check(capsys):
    def swapped(num_params, world_size, stage):  # parameters partitioned at stage 2, gradients at 3: same totals
        return {"params": 2 * num_params / (world_size if stage >= 2 else 1),
                "grads": 2 * num_params / (world_size if stage >= 3 else 1),
                "optimizer": 12 * num_params / (world_size if stage >= 1 else 1)}

    def forgot_gradients(num_params, world_size, stage):
        return {**zero_solution(num_params, world_size, stage), "grads": 2 * num_params}

    def total_only(num_params, world_size, stage):
        return sum(zero_solution(num_params, world_size, stage).values())

    def fp32_sizes(num_params, world_size, stage):
        return {key: value * 2 if key != "optimizer" else value for key, value in
                zero_solution(num_params, world_size, stage).items()}

    def stage_off_by_one(num_params, world_size, stage):  # `stage > 1` where `stage >= 1` belongs
        return zero_solution(num_params, world_size, stage - 1 if stage else 0)

    def padded(num_params, world_size, stage):  # unusual but right: whole bytes, rounded up per partition
        return {key: math.ceil(value) for key, value in zero_solution(num_params, world_size, stage).items()}

    assert checks.check_zero_formula(zero_solution)
    verdict(capsys)
    assert checks.check_zero_formula(padded, world_size=7)
    verdict(capsys)
    fails(capsys, checks.check_zero_formula(stage_off_by_one), "stage 1: optimizer states are partitioned from stage 1")
    assert sum(swapped(7.5e9, 8, 2).values()) == sum(zero_solution(7.5e9, 8, 2).values())
    fails(capsys, checks.check_zero_formula(swapped), "stage 2", "every rank still holds all the parameters")
    fails(capsys, checks.check_zero_formula(forgot_gradients), "stage 2: gradients are partitioned from stage 2")
    fails(capsys, checks.check_zero_formula(total_only), "return a dict")
    fails(capsys, checks.check_zero_formula(fp32_sizes), "2 bytes (fp16)")
    fails(capsys, checks.check_zero_formula(untouched), "NotImplementedError")
    fails(capsys, checks.check_zero_formula(None), "not set")


def engine_solution(num_params, world_size, stage):  # after backward, before the step
    share = lambda partitioned: num_params / world_size if partitioned else num_params  # noqa: E731
    return {"params": 4 * share(stage >= 3), "grads": 4 * share(stage >= 1),
            "optimizer": (4 if stage == 0 else 8) * share(stage >= 1)}


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
        return {"params": 4 * share(s >= 3), "grads": 4 * share(s >= 2),
                "optimizer": (4 if s == 0 else 8) * share(s >= 1)}
    fails(capsys, checks.check_engine_bytes(paper_stages), "stage 1", "after backward", "kept only this rank's part")
    # The paper's mixed-precision Adam, copied from exercise 1.
    fails(capsys, checks.check_engine_bytes(zero_solution), "stage 0", "fp32, 4 bytes")
    # Momentum only, no master copy: stage 1 would then save bytes on 2 ranks.
    fails(capsys, checks.check_engine_bytes(changed("optimizer", lambda n, w, s: 4 * n / w)),
          "stage 1", "fp32 copy of the weights")
    # The master copy at stage 0 too.
    fails(capsys, checks.check_engine_bytes(lambda n, w, s: {**engine_solution(n, w, s), "optimizer": 8 * n}),
          "stage 0", "no copy of the weights below stage 1")
    # The master copy of the whole model on every rank.
    fails(capsys, checks.check_engine_bytes(changed("optimizer", lambda n, w, s: 4 * n / w + 4 * n)),
          "stage 1", "partition only")
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

def fsdp2_solution(num_layers, reshard_after_forward=True):
    return {"all_gathers": (2 if reshard_after_forward else 1) * num_layers, "reduce_scatters": num_layers}


# What CommDebugMode counted on 2 gloo ranks of torch 2.13 for torch_cnn's 4 layers, each sharded, then the root.
COUNTED = {True: {"all_gathers": 8, "reduce_scatters": 4, "layers": 4, "whole_after_forward": 0},
           False: {"all_gathers": 4, "reduce_scatters": 4, "layers": 4, "whole_after_forward": 4}}


def test_fsdp_collectives_check(capsys):
    assert checks.check_fsdp_collectives(fsdp2_solution)
    assert "all 6 cases" in verdict(capsys)
    assert checks.check_fsdp_collectives(fsdp2_solution, [COUNTED] * 2)
    assert "8 all-gathers and 4 reduce-scatters with reshard_after_forward=True" in verdict(capsys)
    # Unusual but right: numpy numbers, 4 ranks.
    assert checks.check_fsdp_collectives(lambda n, r=True: {"all_gathers": np.int64(n * (1 + bool(r))),
                                                           "reduce_scatters": np.int64(n)}, [COUNTED] * 4)
    verdict(capsys)

    def rule(gathers, scatters=lambda n, r: n):
        return lambda n, r=True: {"all_gathers": gathers(n, r), "reduce_scatters": scatters(n, r)}

    # Backward's second gather forgotten, or made where the layer kept its weights.
    fails(capsys, checks.check_fsdp_collectives(rule(lambda n, r: n)), "all-gathers them again")
    fails(capsys, checks.check_fsdp_collectives(rule(lambda n, r: 2 * n)), "once a step")
    # The root counted as a layer; a collective per tensor (weight and bias).
    fails(capsys, checks.check_fsdp_collectives(rule(lambda n, r: (2 if r else 1) * n + 1)), "root")
    fails(capsys, checks.check_fsdp_collectives(rule(lambda n, r: 2 * (2 if r else 1) * n)), "not tensors")
    fails(capsys, checks.check_fsdp_collectives(rule(lambda n, r: (2 if r else 1) * n, lambda n, r: 0)),
          "reduce-scatters each layer's gradients")
    fails(capsys, checks.check_fsdp_collectives(rule(lambda n, r: (2 if r else 1) * n, lambda n, r: 2 * n)),
          "leave once a step")
    fails(capsys, checks.check_fsdp_collectives(lambda n, r: (n, n)), "two keys")
    # Right on the cases, but not what the ranks counted (a count that is not this setting's), or no count.
    fails(capsys, checks.check_fsdp_collectives(fsdp2_solution, [{**COUNTED, True: {**COUNTED[True],
                                                                                 "all_gathers": 7}}] * 2),
          "live ranks counted 7 all-gathers")
    fails(capsys, checks.check_fsdp_collectives(fsdp2_solution, [COUNTED, {**COUNTED, False: COUNTED[True]}]),
          "different collectives")
    fails(capsys, checks.check_fsdp_collectives(fsdp2_solution, [None, None]), "no count")
    fails(capsys, checks.check_fsdp_collectives(untouched), "NotImplementedError")
    fails(capsys, checks.check_fsdp_collectives(None), "not set")
