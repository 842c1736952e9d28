"""Lesson 9's checks: ZeRO's memory formula, the engine's bytes counted, and FSDP2's resharding."""
from __future__ import annotations

import math

from scaledl.workshop.checks.common import _unfinished, _verdict

_PARTITIONED = {0: (), 1: ("optimizer",), 2: ("optimizer", "grads"), 3: ("optimizer", "grads", "params")}
_NAMES = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer states"}



def check_zero_formula(bytes_per_rank, world_size: int = 8) -> bool:
    """`bytes_per_rank(num_params, world_size, stage) -> {"params", "grads", "optimizer"}` for
    mixed-precision Adam (2 + 2 + 12 bytes per parameter), checked part by part, so that
    partitioning the parameters where the gradients belong (same total) fails too."""
    from scaledl import zero_memory

    if bytes_per_rank is None:
        return _unfinished("bytes_per_rank")
    num_params = 7_500_000_000  # the paper's 7.5B-parameter example
    for stage in range(4):
        try:
            got = bytes_per_rank(num_params, world_size, stage)
        except NotImplementedError:
            return _verdict(False, "bytes_per_rank still raises NotImplementedError: finish the exercise cell")
        want = zero_memory.predict(num_params, world_size, stage, 2, 2, 12)
        if not isinstance(got, dict) or set(got) < {"params", "grads", "optimizer"}:
            return _verdict(False, "return a dict with the bytes of \"params\", \"grads\" and \"optimizer\"")
        for key in ("params", "grads", "optimizer"):
            if math.isclose(got[key], want[key], rel_tol=1e-6):
                continue
            full = want[key] if key not in _PARTITIONED[stage] else want[key] * world_size
            if key in _PARTITIONED[stage] and math.isclose(got[key], full, rel_tol=1e-3):
                return _verdict(False, f"stage {stage}: {_NAMES[key]} are partitioned from stage "
                                       f"{min(s for s in _PARTITIONED if key in _PARTITIONED[s])} on: "
                                       f"divide them by world_size")
            if key not in _PARTITIONED[stage] and math.isclose(got[key], want[key] / world_size, rel_tol=1e-3):
                return _verdict(False, f"stage {stage}: every rank still holds all the {_NAMES[key]} "
                                       f"({want[key] / 1e9:g} GB): stage {stage} partitions only "
                                       f"{', '.join(_NAMES[k] for k in _PARTITIONED[stage]) or 'nothing'}")
            return _verdict(False, f"stage {stage}: {_NAMES[key]} {got[key] / 1e9:g} GB, expected "
                                   f"{want[key] / 1e9:g} GB: params and grads are 2 bytes (fp16), Adam's states 12")
    return _verdict(True, "all four stages match the paper, part by part: 16 bytes per parameter, partitioned "
                          "optimizer states, then gradients, then parameters")


# After backward, before the optimizer step, where `zero_memory.measure` counts: stages 1 and 2 have both reduced the
# gradients by then and keep only their own part (stage 1 held them all during backward).
_AFTER_BACKWARD = {0: (), 1: ("optimizer", "grads"), 2: ("optimizer", "grads"), 3: ("optimizer", "grads", "params")}


def check_engine_bytes(engine_bytes_per_rank, world_size: int = 4) -> bool:
    """`engine_bytes_per_rank(num_params, world_size, stage)` for lesson 9's live engine, counted after
    backward and before the optimizer step: fp32 parameters and gradients (4 + 4 bytes), SGD's momentum
    (4), and from stage 1 on DeepSpeed's fp32 master copy of the rank's partition (4 more); from stage 1
    on, each rank keeps only its part of the reduced gradients.  Checked part by part on a parameter
    count that `world_size` does not divide (DeepSpeed pads partitions: rounding either way passes)."""
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
        want = {key: (4 if key != "optimizer" or stage == 0 else 8) * (shard if key in parted else num_params)
                for key in ("params", "grads", "optimizer")}
        for key in ("params", "grads", "optimizer"):
            if close(got[key], want[key]):
                continue
            full = num_params if key not in parted else shard
            if key in ("params", "grads") and close(got[key], 2 * full):
                return _verdict(False, f"stage {stage}: {_NAMES[key]} at 2 bytes: this engine trains in fp32, 4 bytes "
                                       "per parameter (the paper's 2 are fp16)")
            if key == "grads" and stage == 1 and close(got[key], 4 * num_params):
                return _verdict(False, "stage 1: the count is taken after backward, when stage 1 has reduced the "
                                       "gradients and kept only this rank's part: divide them by world_size (during "
                                       "backward it holds them all, the paper's count)")
            if key == "optimizer" and stage == 0 and close(got[key], 8 * num_params):
                return _verdict(False, "stage 0: the engine steps your own optimizer as it is, momentum only: "
                                       "DeepSpeed keeps no copy of the weights below stage 1")
            if key == "optimizer" and stage >= 1 and close(got[key], 4 * shard):
                return _verdict(False, f"stage {stage}: momentum alone is not all: from stage 1 on DeepSpeed also "
                                       "keeps an fp32 copy of the weights it updates, even when they are fp32 already")
            if key == "optimizer" and stage >= 1 and close(got[key], 4 * shard + 4 * num_params):
                return _verdict(False, f"stage {stage}: the fp32 copy of the weights is of this rank's partition "
                                       "only: each rank updates its own part")
            if key == "optimizer" and close(got[key], 12 * full):
                return _verdict(False, f"stage {stage}: 12 bytes of optimizer state is Adam's: this engine runs SGD "
                                       "with momentum")
            if key in parted and close(got[key], want[key] * world_size):
                first = min(s for s in _AFTER_BACKWARD if key in _AFTER_BACKWARD[s])
                return _verdict(False, f"stage {stage}: after backward the {_NAMES[key]} are partitioned from stage "
                                       f"{first} on: divide them by world_size")
            if key not in parted and close(got[key] * world_size, want[key]):
                kept = ", ".join(_NAMES[k] for k in parted) or "nothing"
                return _verdict(False, f"stage {stage}: every rank still holds all the {_NAMES[key]}: stage {stage} "
                                       f"partitions only {kept}")
            return _verdict(False, f"stage {stage}: {_NAMES[key]} {got[key]:,.0f} bytes, expected {want[key]:,.0f}")
    return _verdict(True, "the live engine's four stages after backward, part by part: fp32 weights, gradients and "
                          "momentum, from stage 1 the fp32 copy of the rank's partition and only its part of the "
                          "reduced gradients")



def check_fsdp_reshard(reports_by_rank: list) -> bool:
    """FSDP2 with every layer's parameters kept gathered from its forward to its backward.

    Each rank reports, per layer with parameters ({name: bool}): "own_group" (the layer is an
    FSDPModule of its own), "at_rest" (its registered parameters are sharded DTensors before
    forward), "after_forward" (still sharded after forward: it gave them back, so backward
    all-gathers them again) and "after_backward" (sharded again once backward is done); and
    "loss" (the same on every rank's identical batch).  fully_shard's docstring, torch 2.13:
    the registered parameters after forward are the sharded ones if reshard_after_forward is
    True, the unsharded ones if False."""
    if reports_by_rank is None:
        return False
    if len(reports_by_rank) < 2:
        return _verdict(False, "one rank has nothing to shard over: start 2 or more (WORLD_SIZE = 2)")
    if any(r is None for r in reports_by_rank):
        return _verdict(False, "the FSDP cells did not finish on every rank: finish the exercise and run both cells")
    report = reports_by_rank[0]
    for name, own in report["own_group"].items():
        if not report["at_rest"][name]:
            return _verdict(False, f"{name}'s parameters are whole on every rank before forward: shard the model "
                                   "with FSDP2, every layer and then the whole model")
        if not own:
            return _verdict(False, f"{name} is not sharded on its own: one group for the whole model gathers all of "
                                   "it at once, with nothing to overlap: shard each layer, then the whole model")
    given_back = [name for name, sharded in report["after_forward"].items() if sharded]
    if given_back:
        return _verdict(False, f"{given_back[0]} gives its parameters back after forward (FSDP2's default for every "
                               "layer but the root), so backward all-gathers them again: keep them until backward")
    kept = [name for name, sharded in report["after_backward"].items() if not sharded]
    if kept:
        return _verdict(False, f"{kept[0]} stays gathered after backward: at rest every layer must be sharded again")
    losses = {round(r["loss"], 5) for r in reports_by_rank}
    if len(losses) > 1:
        return _verdict(False, f"the ranks computed different losses on the same batch ({sorted(losses)}): every "
                               "rank must run the same sharded model")
    return _verdict(True, f"each of {len(report['own_group'])} layers is sharded at rest and stays gathered from its "
                          "forward to its backward: one all-gather per layer per step fewer, at the memory of "
                          "holding every layer whole at the end of forward")
