"""Lesson 1's checks: training memory, training days, and which parallelism a model needs."""
from __future__ import annotations

import math

from scaledl.workshop.checks.common import _unfinished, _verdict


def check_training_memory(memory, num_params: int) -> bool:
    """Bytes to train `num_params` parameters in fp32 with Adam: parameters, gradients and
    Adam's two states (momentum and variance), 4 bytes each: 16 bytes per parameter."""
    if memory is None:
        return _unfinished("memory")
    want = {"params": 4 * num_params, "grads": 4 * num_params, "optimizer": 8 * num_params}
    missing = [key for key in want if key not in memory]
    if missing:
        return _verdict(False, f"`memory` has no {missing[0]!r}: give bytes for params, grads and optimizer")
    for key, name in (("params", "parameters"), ("grads", "gradients")):
        got = memory[key]
        if math.isclose(got, want[key] * 8):
            return _verdict(False, f"{name}: {got:.3g} is in bits: count bytes, 4 for each fp32 number")
        if math.isclose(got, want[key] / 2):
            return _verdict(False, f"{name}: {got:.3g} bytes counts 2 bytes a number: this model trains in fp32, 4")
        if math.isclose(got, want[key] / 1e9):
            return _verdict(False, f"{name}: {got:.3g} looks like GB: give bytes (the check divides by 1e9 itself)")
        if not math.isclose(got, want[key]):
            return _verdict(False, f"{name}: {got:.3g} bytes, expected {want[key]:.3g}: one fp32 number per parameter")
    got = memory["optimizer"]
    if math.isclose(got, 12 * num_params):
        return _verdict(False, "optimizer: 12 bytes a parameter is mixed precision's count (an fp32 master copy "
                               "plus two states): in fp32 the parameters are the master copy: Adam adds two numbers")
    if math.isclose(got, 4 * num_params):
        return _verdict(False, "optimizer: that is one state per parameter: Adam keeps two (momentum and variance)")
    if math.isclose(got, 0):
        return _verdict(False, "optimizer: Adam's states are memory too: two fp32 numbers per parameter")
    if not math.isclose(got, want["optimizer"]):
        return _verdict(False, f"optimizer: {got:.3g} bytes, expected {want['optimizer']:.3g}: "
                               "Adam keeps two fp32 numbers per parameter")
    total = sum(want.values())
    return _verdict(True, f"{total / 1e9:.0f} GB of model states before a single activation: 16 bytes a parameter")


def check_training_days(days, num_params: float, num_tokens: float, peak_flops: float, utilization: float,
                        num_gpus: int) -> bool:
    """Days to train: 6 x parameters x tokens FLOPs (2 forward + 4 backward), at the sustained
    rate utilization x peak per GPU, over num_gpus GPUs."""
    if days is None:
        return _unfinished("days")
    seconds = 6 * num_params * num_tokens / (peak_flops * utilization * num_gpus)
    want = seconds / 86400
    if math.isclose(days, want, rel_tol=1e-3):
        return _verdict(True, f"{want:,.1f} days on {num_gpus} GPUs: 6 N T FLOPs at {utilization:.0%} of peak")
    for factor, message in ((1 / 3, "you counted the forward pass only (2 N T): backward costs twice the forward"),
                            (utilization, "that assumes the GPUs run at their peak: multiply peak by the utilization"),
                            (num_gpus, "that is one GPU's time: the work divides over all the GPUs"),
                            (86400, "that is in seconds: a day has 86,400"),
                            (24, "that is in hours: divide by 24")):
        if math.isclose(days, want * factor, rel_tol=1e-3):
            return _verdict(False, f"{days:,.3g} days: {message}")
    return _verdict(False, f"{days:,.3g} days, expected {want:,.1f}: FLOPs = 6 x parameters x tokens, "
                           "divided by the sustained FLOP/s of all GPUs")


PARALLELISM_ANSWERS = {"data": "data", "sharded": "sharded", "zero": "sharded", "fsdp": "sharded", "model": "model"}


def _parallelism_rule(num_params, activation_bytes, device_bytes, world_size) -> str:
    state = 16 * num_params  # parameters, gradients and Adam's states, in fp32 or mixed precision alike
    if state + activation_bytes <= device_bytes:
        return "data"
    if state / world_size + activation_bytes <= device_bytes:
        return "sharded"
    return "model"


# (parameters, activations in bytes, device bytes, GPUs): each case is one that a common wrong rule
# gets wrong; _PARALLELISM_WHY says what the right rule saw there.
_PARALLELISM_CASES = [
    (1.0e9, 10e9, 40e9, 8),   # 16 + 10 GB fit: data
    (2.0e9, 10e9, 40e9, 8),   # 32 + 10 > 40 (4 bytes a parameter would say data), 4 + 10 fit: sharded
    (1.5e9, 20e9, 40e9, 8),   # 24 GB of states fit alone; with 20 GB of activations they do not: sharded
    (7.0e9, 10e9, 40e9, 8),   # 112 GB of states, 14 + 10 sharded over 8: sharded
    (15e9, 15e9, 40e9, 8),    # 240 GB of states: 30 + 15 sharded over 8 do not fit, the model split does: model
    (70e9, 10e9, 40e9, 64),   # over 64 ranks 17.5 + 10 fit: sharded
    (1.0e9, 50e9, 40e9, 8),   # the activations alone exceed the device; ZeRO does not split them: model
]


def check_parallelism_choice(choose) -> bool:
    """`choose(num_params, activation_bytes, device_bytes, world_size)` -> "data", "sharded" or
    "model", run on cases where the usual slips (4 bytes a parameter, no activations, states not
    divided over the ranks, activations divided too, sharding first) each give another answer."""
    if choose is None:
        return _unfinished("choose")
    for num_params, activations, device, world_size in _PARALLELISM_CASES:
        case = (f"{num_params / 1e9:g}B parameters, {activations / 1e9:g} GB of activations, {world_size} GPUs of "
                f"{device / 1e9:g} GB")
        try:
            got = choose(num_params, activations, device, world_size)
        except NotImplementedError:
            return _verdict(False, "choose still raises NotImplementedError: finish the exercise cell")
        except Exception as error:  # a learner's error, reported in one line
            return _verdict(False, f"{case}: choose raised {type(error).__name__}: "
                                   f"{(str(error).splitlines() or [''])[0]}")
        answer = PARALLELISM_ANSWERS.get(str(got).strip().lower())
        if answer is None:
            return _verdict(False, f"{case}: choose returned {got!r}: return \"data\", \"sharded\" or \"model\"")
        want = _parallelism_rule(num_params, activations, device, world_size)
        if answer == want:
            continue
        state_gb, act_gb, device_gb = 16 * num_params / 1e9, activations / 1e9, device / 1e9
        if want == "data":
            why = (f"{state_gb:g} GB of model states + {act_gb:g} GB of activations fit one GPU: plain data "
                   "parallelism is enough (sharding would only add communication)")
        elif want == "sharded" and answer == "data":
            why = (f"{state_gb:g} GB of model states (16 bytes a parameter) + {act_gb:g} GB of activations do not fit "
                   f"{device_gb:g} GB: count every byte training keeps")
        elif want == "sharded":
            why = (f"sharded over {world_size} ranks the states take {state_gb / world_size:g} GB, + {act_gb:g} GB of "
                   "activations: that fits, so ZeRO-3/FSDP is enough without splitting the model")
        elif answer == "data":
            why = f"{state_gb:g} GB of states + {act_gb:g} GB of activations cannot fit {device_gb:g} GB"
        else:
            too_big = ("the sharded states alone are" if state_gb / world_size > device_gb
                       else "together they are")
            why = (f"sharding divides the {state_gb:g} GB of states over {world_size} ranks "
                   f"({state_gb / world_size:g} GB) and each rank still keeps its own {act_gb:g} GB of activations: "
                   f"{too_big} over {device_gb:g} GB, so the model itself must be split")
        return _verdict(False, f"{case}: you said {answer}, the answer is {want}: {why}")
    return _verdict(True, f"all {len(_PARALLELISM_CASES)} cases: states (16 bytes a parameter) plus activations "
                          "decide data, sharded (1/world_size of the states) or model parallelism")
