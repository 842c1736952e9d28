"""Lesson 9's checks: ZeRO's memory formula, the engine's bytes counted, and FSDP2's resharding."""
from __future__ import annotations

import math

from scaledl.perf.choose import HEADROOM
from scaledl.workshop.checks.common import _attempt, _FAILED, _unfinished, _verdict

_NOT_GIVEN = object()  # a check called without the live count: the cases alone

_PARTITIONED = {0: (), 1: ("optimizer",), 2: ("optimizer", "grads"), 3: ("optimizer", "grads", "params")}
_NAMES = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer states"}



# (bytes per parameter of the parameters, the gradients, the optimizer states): the paper's mixed-precision Adam,
# then the variant the lesson's text does not give, gradients kept in fp32 for the optimizer (DeepSpeed's 18 bytes:
# its Memory Requirements page and `estimate_zero3_model_states_mem_needs`).
_BYTE_CASES = [(2, 2, 12), (2, 4, 12)]


# Exercise 1's case the text does not work: 7.5B parameters at 18 bytes on 16 ranks (4 Polaris nodes), fitting by
# the path's one rule, in 90% of an A100's 40 GiB (choose.HEADROOM).  The paper's 16 bytes would fit at stage 1.
_FIT_PARAMS, _FIT_RANKS, _FIT_BYTES, _FIT_SIZES = 7_500_000_000, 16, (1 - HEADROOM) * 40 * 2**30, (2, 4, 12)


def check_zero_formula(bytes_per_rank, world_size: int = 8, first_fit=_NOT_GIVEN) -> bool:
    """`bytes_per_rank(num_params, world_size, stage, params=2, grads=2, optimizer=12) -> {"params", "grads",
    "optimizer"}`, counted during backward as the paper counts them, for the bytes per parameter given:
    checked part by part for the paper's mixed-precision Adam (2 + 2 + 12) and for fp32 gradients
    (2 + 4 + 12 = 18), so that partitioning the parameters where the gradients belong fails, and so does a
    function that ignores the bytes it is given. Then, when given, `first_fit`: the lowest stage at which
    7.5B parameters at 18 bytes fit on 16 ranks, in 90% of 40 GiB (1 with the paper's 16 bytes, 2 with 18)."""
    from scaledl import zero_memory

    if bytes_per_rank is None:
        return _unfinished("bytes_per_rank")
    if first_fit is None:
        return _unfinished("first_fit")
    num_params = 7_500_000_000  # the paper's 7.5B-parameter example
    for sizes in _BYTE_CASES:
        label = f"{' + '.join(map(str, sizes))} = {sum(sizes)} bytes per parameter"
        for stage in range(4):
            got = _attempt("bytes_per_rank", f"{label}, stage {stage}",
                           lambda: bytes_per_rank(num_params, world_size, stage, *sizes))
            if got is _FAILED:
                return False
            want = zero_memory.predict(num_params, world_size, stage, *sizes)
            if not isinstance(got, dict) or not {"params", "grads", "optimizer"} <= set(got):
                return _verdict(False, "return a dict with the bytes of \"params\", \"grads\" and \"optimizer\"")
            for key, per_param in zip(("params", "grads", "optimizer"), sizes):
                if math.isclose(got[key], want[key], rel_tol=1e-6):
                    continue
                full = want[key] if key not in _PARTITIONED[stage] else want[key] * world_size
                if key in _PARTITIONED[stage] and math.isclose(got[key], full, rel_tol=1e-3):
                    return _verdict(False, f"{label}, stage {stage}: {_NAMES[key]} are partitioned from stage "
                                           f"{min(s for s in _PARTITIONED if key in _PARTITIONED[s])} on: "
                                           f"divide them by world_size")
                if key not in _PARTITIONED[stage] and math.isclose(got[key], want[key] / world_size, rel_tol=1e-3):
                    return _verdict(False, f"{label}, stage {stage}: every rank still holds all the {_NAMES[key]} "
                                           f"({want[key] / 1e9:g} GB): stage {stage} partitions only "
                                           f"{', '.join(_NAMES[k] for k in _PARTITIONED[stage]) or 'nothing'}")
                return _verdict(False, f"{label}, stage {stage}: {_NAMES[key]} {got[key] / 1e9:g} GB, expected "
                                       f"{want[key] / 1e9:g} GB: {per_param} bytes per parameter, the argument "
                                       f"`{key}`, times the parameters this rank keeps")
    passed = ("all four stages, part by part, for the paper's 16 bytes per parameter and for 18 with fp32 gradients: "
              "partitioned optimizer states, then gradients, then parameters")
    if first_fit is _NOT_GIVEN:
        return _verdict(True, passed)
    per_stage = [zero_memory.predict(_FIT_PARAMS, _FIT_RANKS, stage, *_FIT_SIZES)["total"] for stage in range(4)]
    want = min(stage for stage in range(4) if per_stage[stage] <= _FIT_BYTES)
    limit = f"{_FIT_BYTES / 1e9:.1f} GB ({1 - HEADROOM:.0%} of 40 GiB)"
    if first_fit == want:
        return _verdict(True, f"{passed}; and 18 bytes per parameter first fit at stage {want}: "
                              f"{per_stage[want] / 1e9:.1f} GB a rank, against {per_stage[want - 1] / 1e9:.1f} GB "
                              f"at stage {want - 1}, in {limit}")
    if first_fit not in range(4):
        return _verdict(False, f"first_fit = {first_fit!r}: give a stage, 0 to 3")
    if first_fit < want:
        return _verdict(False, f"first_fit = {first_fit}: at stage {first_fit} a rank keeps "
                               f"{per_stage[first_fit] / 1e9:.1f} GB, more than {limit}; count the gradients at "
                               f"4 bytes, not 2")
    return _verdict(False, f"first_fit = {first_fit}: stage {want} already fits, with "
                           f"{per_stage[want] / 1e9:.1f} GB a rank in {limit}")


# After backward, before the optimizer step, where `zero_memory.measure` counts: stages 1 and 2 have both reduced the
# gradients by then and keep only their own part (stage 1 held them all during backward).
_AFTER_BACKWARD = {0: (), 1: ("optimizer", "grads"), 2: ("optimizer", "grads"), 3: ("optimizer", "grads", "params")}


def check_engine_bytes(engine_bytes_per_rank, world_size: int = 4) -> bool:
    """`engine_bytes_per_rank(num_params, world_size, stage)` for lesson 9's live engine by the paper's rule,
    counted after backward and before the optimizer step: fp32 parameters and gradients (4 + 4 bytes) and
    SGD's momentum (4); from stage 1 on, each rank keeps only its part of the reduced gradients.  DeepSpeed's
    extra fp32 copy of the weights is not asked for: the lesson adds it to the learner's numbers after the check.
    Checked part by part on a parameter count that `world_size` does not divide (DeepSpeed pads partitions:
    rounding either way passes)."""
    if engine_bytes_per_rank is None:
        return _unfinished("engine_bytes_per_rank")
    num_params = 206_922  # the CNN's
    close = lambda a, b: math.isclose(a, b, rel_tol=1e-4)  # noqa: E731
    shard = num_params / world_size
    for stage in range(4):
        try:
            got = engine_bytes_per_rank(num_params, world_size, stage)
        except NotImplementedError:
            return _verdict(False, "engine_bytes_per_rank still raises NotImplementedError: finish the exercise cell")
        if not isinstance(got, dict) or set(got) < {"params", "grads", "optimizer"}:
            return _verdict(False, "return a dict with the bytes of \"params\", \"grads\" and \"optimizer\"")
        parted = _AFTER_BACKWARD[stage]
        want = {key: 4 * (shard if key in parted else num_params) for key in ("params", "grads", "optimizer")}
        for key in ("params", "grads", "optimizer"):
            if close(got[key], want[key]):
                continue
            full = num_params if key not in parted else shard
            if key in ("params", "grads") and close(got[key], 2 * full):
                return _verdict(False, f"stage {stage}: {_NAMES[key]} at 2 bytes: the DeepSpeed engine trains in "
                                       "fp32, 4 bytes per parameter (the paper's 2 are fp16)")
            if key == "grads" and stage == 1 and close(got[key], 4 * num_params):
                return _verdict(False, "stage 1: the count is taken after backward, when stage 1 has reduced the "
                                       "gradients and kept only this rank's part: divide them by world_size (during "
                                       "backward it holds them all, the paper's count)")
            if key == "optimizer" and close(got[key], 8 * full):
                return _verdict(False, f"stage {stage}: SGD with momentum keeps 4 bytes per parameter. An fp32 copy "
                                       "of the weights on top is DeepSpeed's own, not the paper's rule: leave it out, "
                                       "the table after this check adds it to your numbers")
            if key == "optimizer" and close(got[key], 12 * full):
                return _verdict(False, f"stage {stage}: 12 bytes of optimizer state is Adam's: the DeepSpeed engine "
                                       "runs SGD with momentum")
            if key in parted and close(got[key], want[key] * world_size):
                first = min(s for s in _AFTER_BACKWARD if key in _AFTER_BACKWARD[s])
                return _verdict(False, f"stage {stage}: after backward the {_NAMES[key]} are partitioned from stage "
                                       f"{first} on: divide them by world_size")
            if key not in parted and close(got[key] * world_size, want[key]):
                kept = ", ".join(_NAMES[k] for k in parted) or "nothing"
                return _verdict(False, f"stage {stage}: every rank still holds all the {_NAMES[key]}: stage {stage} "
                                       f"partitions only {kept}")
            return _verdict(False, f"stage {stage}: {_NAMES[key]} {got[key]:,.0f} bytes, expected {want[key]:,.0f}")
    return _verdict(True, "the paper's four stages with the live engine's bytes after backward, part by part: fp32 "
                          "weights, gradients and momentum, and from stage 1 only this rank's part of the reduced "
                          "gradients")


def check_fsdp_collectives(fsdp2_collectives, counted_by_rank=_NOT_GIVEN) -> bool:
    """`fsdp2_collectives(num_layers, root_holds_params, reshard_after_forward=None) -> {"all_gathers",
    "reduce_scatters"}`: what FSDP2 issues on each rank in one forward and backward of a model whose
    `num_layers` layers are each sharded on their own (one parameter group each: one all-gather brings a
    layer's weight and bias whole, one reduce-scatter sends its gradients), under a root `fully_shard` that
    holds parameters of its own (one more group) or none, every `fully_shard` given the same
    `reshard_after_forward`.  A group that reshards after forward is all-gathered again for its backward;
    None, the default, means True for every group but the root's, which stays gathered (torch 2.13,
    `fully_shard` and `FSDPState._lazy_init`).  Checked on cases, then against `counted_by_rank`: per rank,
    {str(reshard_after_forward): {"all_gathers", "reduce_scatters", "layers", "root_holds_params",
    "whole_after_forward"}}, counted with CommDebugMode on the live ranks (string keys: ipyparallel sorts the
    keys of a dict it sends, and None does not sort with True and False)."""
    if fsdp2_collectives is None:
        return _unfinished("fsdp2_collectives")
    for layers, root, reshard in _FSDP2_CASES:
        case = (f"{layers} layers, a root {'with' if root else 'without'} parameters of its own, "
                f"reshard_after_forward={reshard}")
        got = _attempt("fsdp2_collectives", case, lambda: fsdp2_collectives(layers, root, reshard))
        if got is _FAILED:
            return False
        if not isinstance(got, dict) or not {"all_gathers", "reduce_scatters"} <= set(got):
            return _verdict(False, "fsdp2_collectives returns a dict with two keys: "
                                   "{\"all_gathers\": ..., \"reduce_scatters\": ...}")
        want = _fsdp2_answer(layers, root, reshard)
        gathers, scatters = got["all_gathers"], got["reduce_scatters"]
        if gathers != want["all_gathers"]:
            hint = _fsdp2_gathers_hint(gathers, layers, root, reshard)
            return _verdict(False, f"{case}: {gathers} all-gathers, FSDP2 issues {want['all_gathers']}: {hint}")
        if scatters != want["reduce_scatters"]:
            wrong = [(0, "backward reduce-scatters each group's gradients, whatever reshard_after_forward says"),
                     (2 * want["reduce_scatters"], "a group's gradients leave once a step, weight and bias in one "
                                                   "reduce-scatter"),
                     (layers + (not root), "the root here holds no parameters of its own: no gradients to send"
                      if not root else None),
                     (layers, "the root's own parameters are a group too: their gradients leave in one more "
                              "reduce-scatter" if root else None)]
            hint = next((text for value, text in wrong if text and scatters == value),
                        "one reduce-scatter per group that holds parameters, in its backward")
            return _verdict(False, f"{case}: {scatters} reduce-scatters, FSDP2 issues {want['reduce_scatters']}: "
                                   f"{hint}")
    said = f"all {len(_FSDP2_CASES)} cases"
    if counted_by_rank is _NOT_GIVEN:
        return _verdict(True, said)
    if not counted_by_rank or any(counted is None for counted in counted_by_rank):
        return _verdict(False, f"{said}, but no count from every live rank: run the counting cell above")
    first = counted_by_rank[0]
    if any(counted != first for counted in counted_by_rank):
        return _verdict(False, "the ranks counted different collectives: every rank must run the same sharded model")
    said_live = []
    settings = {"None": None, "True": True, "False": False}  # the keys as strings: ipyparallel sorts a dict's keys
    for key in sorted(first, key=lambda setting: list(settings).index(str(setting)) if str(setting) in settings
                      else 3):
        counted, reshard = first[key], settings.get(str(key), key)
        predicted = fsdp2_collectives(counted["layers"], counted["root_holds_params"], reshard)
        for key, name in (("all_gathers", "all-gathers"), ("reduce_scatters", "reduce-scatters")):
            if predicted[key] != counted[key]:
                return _verdict(False, f"{said}, but with reshard_after_forward={reshard} the live ranks counted "
                                       f"{counted[key]} {name} for the CNN's {counted['layers']} sharded layers "
                                       f"and its root, you predicted {predicted[key]}")
        said_live.append(f"{counted['all_gathers']} all-gathers and {counted['reduce_scatters']} reduce-scatters "
                         f"with reshard_after_forward={reshard} ({counted['whole_after_forward']} of "
                         f"{counted['layers']} layers whole after forward)")
    return _verdict(True, f"{said}; on the live ranks, as CommDebugMode counted: " + "; ".join(said_live))


def _fsdp2_gathers_hint(gathers, layers: int, root: bool, reshard) -> str:
    """Why a count of all-gathers differs from FSDP2's, for the usual slips."""
    layer_gathers = (1 if reshard is False else 2) * layers
    root_gathers = (2 if reshard is True else 1) if root else 0
    wrong = [(layers + root_gathers, "a layer that reshards after forward gives its gathered weights back, so its "
                                     "backward all-gathers them again" if reshard is not False else None),
             (2 * layers + root_gathers, "a layer that keeps its weights until backward is gathered once a step"
                                         if reshard is False else None),
             (layer_gathers, "the root's own parameters are a group too: they are all-gathered before forward"
                             if root else None),
             (layer_gathers + 1, "the root here holds no parameters of its own: it gathers nothing"
                                 if not root else "with reshard_after_forward=True the root gives its parameters "
                                                  "back too: only the default (None) keeps the root gathered"
                                 if reshard is True else None),
             (layer_gathers + 2, "by default (None) the root keeps its parameters from forward to backward: it is "
                                 "gathered once" if root and reshard is None else None),
             (2 * (layer_gathers + root_gathers), "one all-gather brings a group's weight and bias together: count "
                                                  "groups, not tensors")]
    return next((text for value, text in wrong if text and gathers == value),
                "count one group's all-gathers: before its forward, and before its backward unless it kept its "
                "weights")


# (layers, root_holds_params, reshard_after_forward): a root without parameters, as in the lesson's first model,
# with one layer and four; a root that holds parameters (the CNN's linear layers left to it) under each setting;
# a deep model both ways.
_FSDP2_CASES = [(1, False, None), (4, False, None), (4, False, False), (4, False, True), (2, True, None),
                (2, True, True), (2, True, False), (24, True, None), (24, True, False)]


def _fsdp2_answer(layers: int, root: bool, reshard) -> dict:
    layer_gathers = 1 if reshard is False else 2  # None: the layers reshard
    root_gathers = (2 if reshard is True else 1) if root else 0  # None: the root stays gathered
    return {"all_gathers": layer_gathers * layers + root_gathers, "reduce_scatters": layers + bool(root)}
