"""Lesson 1's checks: training memory, the nodes to train in time, and which parallelism a model needs."""
from __future__ import annotations

import math

from scaledl.perf.choose import HEADROOM
from scaledl.workshop.checks.common import _attempt, _FAILED, _unfinished, _verdict


def check_training_memory(memory, num_params: int) -> bool:
    """Bytes to train `num_params` parameters with Adam in mixed precision, as the ZeRO paper
    (section 3.1) and DeepSpeed count it: 16-bit parameters and gradients (2 bytes each), and in
    fp32 the optimizer's master copy of the weights, momentum and variance (4 + 4 + 4): 16 bytes per
    parameter, as many as in fp32."""
    if memory is None:
        return _unfinished("memory")
    want = {"params": 2 * num_params, "grads": 2 * num_params, "optimizer": 12 * num_params}
    missing = [key for key in want if key not in memory]
    if missing:
        return _verdict(False, f"`memory` has no {missing[0]!r}: give bytes for params, grads and optimizer")
    for key, name in (("params", "parameters"), ("grads", "gradients")):
        got = memory[key]
        if math.isclose(got, want[key] * 8):
            return _verdict(False, f"{name}: {got:.3g} is in bits: count bytes, 2 for each 16-bit number")
        if math.isclose(got, want[key] * 2):
            return _verdict(False, f"{name}: {got:.3g} bytes counts 4 bytes per number, fp32: forward and backward "
                                   "work on a 16-bit copy here, 2 bytes per number; an fp32 copy of the weights "
                                   "that only the optimizer uses belongs under \"optimizer\"")
        if math.isclose(got, want[key] / 1e9):
            return _verdict(False, f"{name}: {got:.3g} looks like GB: give bytes (the check divides by 1e9 itself)")
        if not math.isclose(got, want[key]):
            return _verdict(False, f"{name}: {got:.3g} bytes, expected {want[key]:.3g}: one 16-bit number per "
                                   "parameter")
    got = memory["optimizer"]
    if math.isclose(got, 12 * num_params * 8):
        return _verdict(False, "optimizer: that is in bits: count bytes, 4 for each fp32 number")
    if math.isclose(got, 8 * num_params):
        return _verdict(False, "optimizer: 2 + 2 + 8 = 12 bytes per parameter leaves out the master copy: the update "
                               "is applied to fp32 weights that only the optimizer keeps, 4 bytes more beside Adam's "
                               "8 bytes of momentum and variance")
    if math.isclose(got, 6 * num_params):
        return _verdict(False, "optimizer: three numbers per parameter is right, but the optimizer keeps them in fp32, "
                               "4 bytes each")
    if math.isclose(got, 4 * num_params):
        return _verdict(False, "optimizer: that is one fp32 number (or two 16-bit ones) per parameter: it keeps three "
                               "fp32 numbers: the master copy of the weights, momentum and variance")
    if math.isclose(got, 0):
        return _verdict(False, "optimizer: the optimizer's states are memory too: the master copy, momentum and "
                               "variance")
    if math.isclose(got, 12 * num_params / 1e9):
        return _verdict(False, "optimizer: that looks like GB: give bytes (the check divides by 1e9 itself)")
    if not math.isclose(got, want["optimizer"]):
        return _verdict(False, f"optimizer: {got:.3g} bytes, expected {want['optimizer']:.3g}: three fp32 numbers "
                               "per parameter")
    total = sum(want.values())
    return _verdict(True, f"{total / 1e9:.0f} GB of model states before a single activation: 2 + 2 + 12 = 16 bytes "
                          "per parameter, as many as in fp32")


def _training_days(num_params: float, num_tokens: float, peak_flops: float, utilization: float, num_gpus: int) -> float:
    """6 x parameters x tokens FLOPs over what `num_gpus` GPUs sustain a second, in days."""
    return 6 * num_params * num_tokens / (peak_flops * utilization * num_gpus) / 86400


def check_training_days(days, num_params: float, num_tokens: float, peak_flops: float, utilization: float,
                        num_gpus: int) -> bool:
    """The days that `num_gpus` GPUs take to train: 6 x parameters x tokens FLOPs (2 forward + 4
    backward), at the sustained rate utilization x peak per GPU, over 86,400 seconds a day."""
    if days is None:
        return _unfinished("days")
    try:
        got = float(days)
    except (TypeError, ValueError):
        return _verdict(False, f"`days` is {days!r}: give a number of days")
    want = _training_days(num_params, num_tokens, peak_flops, utilization, num_gpus)
    if math.isclose(got, want, rel_tol=1e-3):
        return _verdict(True, f"{want:,.1f} days on {num_gpus} GPUs")
    for factor, message in ((num_gpus, "that is GPU-days, the time on one GPU: share the work over the GPUs"),
                            (1 / 3, "you counted the forward pass only (2 N T): backward costs twice the forward"),
                            (utilization, "that assumes the GPUs run at their peak: multiply peak by the utilization"),
                            (1 / 4, f"that divides by {num_gpus} nodes: {num_gpus} is the number of GPUs"),
                            (4, "that counts nodes of 4 GPUs where the GPUs are given"),
                            (86400, "that is seconds: a day has 86,400 of them"),
                            (24, "that is hours: a day has 24 of them")):
        if math.isclose(got, want * factor, rel_tol=1e-3):
            return _verdict(False, f"{got:,.4g} days: {message}")
    return _verdict(False, f"{got:,.4g} days, expected about {want:,.0f}: FLOPs = 6 x parameters x tokens; divide by "
                           "what the GPUs sustain in a second, then by the seconds in a day")


def check_training_nodes(nodes, num_params: float, num_tokens: float, peak_flops: float, utilization: float,
                         target_days: float, gpus_per_node: int = 4) -> bool:
    """The fewest nodes of `gpus_per_node` GPUs that train in `target_days`: 6 x parameters x tokens
    FLOPs (2 forward + 4 backward), at the sustained rate utilization x peak per GPU, rounded up
    to whole nodes."""
    if nodes is None:
        return _unfinished("nodes")
    try:
        got = float(nodes)
    except (TypeError, ValueError):
        return _verdict(False, f"`nodes` is {nodes!r}: give a number of nodes")
    node_days = _training_days(num_params, num_tokens, peak_flops, utilization, gpus_per_node)  # on one node
    exact = node_days / target_days
    want = math.ceil(exact - 1e-9)
    if got == want:
        fewer = (f"; {want - 1} nodes ({(want - 1) * gpus_per_node} GPUs) would take {node_days / (want - 1):.1f}"
                 if want > 1 else "")
        return _verdict(True, f"{want} nodes ({want * gpus_per_node} GPUs) train in {node_days / want:.1f} days"
                              f"{fewer}")
    if math.isclose(got, exact, rel_tol=1e-6):
        return _verdict(False, f"{got:.4g} nodes: a job books whole nodes: round up to {want}")
    if got == math.floor(exact) and got < exact:
        return _verdict(False, f"{got:g} nodes take {node_days / got:.1f} days, more than {target_days:g}: round up, "
                               "not down")
    for factor, message in ((gpus_per_node, f"that counts GPUs: a node has {gpus_per_node}"),
                            (1 / 3, "you counted the forward pass only (2 N T): backward costs twice the forward"),
                            (utilization, "that assumes the GPUs run at their peak: multiply peak by the utilization"),
                            (86400, "a day has 86,400 seconds: divide the seconds by it"),
                            (24, "that mixes hours and days: a day has 24 hours")):
        for value in (exact * factor, math.ceil(exact * factor - 1e-9)):
            if math.isclose(got, value, rel_tol=1e-3):
                return _verdict(False, f"{got:,.4g} nodes: {message}")
    return _verdict(False, f"{got:,.4g} nodes, expected {want}: FLOPs = 6 x parameters x tokens; divide by what one "
                           f"node sustains in {target_days:g} days, then round up")


BEYOND = "beyond sharding"  # sharding the states is not enough: recompute the activations, or split the model
PARALLELISM_ANSWERS = {"data": "data", "sharded": "sharded", "zero": "sharded", "fsdp": "sharded", BEYOND: BEYOND,
                       "beyond": BEYOND}


def _parallelism_rule(num_params, activation_bytes, device_bytes, world_size) -> str:
    state = 16 * num_params  # parameters, gradients and Adam's states, in fp32 or mixed precision alike
    usable = (1 - HEADROOM) * device_bytes  # the path's fit rule: 10% kept free
    if state + activation_bytes <= usable:
        return "data"
    if state / world_size + activation_bytes <= usable:
        return "sharded"
    return BEYOND


# (parameters, activations in bytes, device bytes, GPUs): each case is one that a common wrong rule
# gets wrong; _PARALLELISM_WHY says what the right rule saw there.
_PARALLELISM_CASES = [
    (1.0e9, 10e9, 40e9, 8),   # 16 + 10 GB fit: data
    (2.0e9, 10e9, 40e9, 8),   # 32 + 10 > 40 (4 bytes a parameter would say data), 4 + 10 fit: sharded
    (1.5e9, 14e9, 40e9, 8),   # 24 + 14 = 38 GB: under 40, over the 36 the fit rule allows: sharded
    (1.5e9, 20e9, 40e9, 8),   # 24 GB of states fit alone; with 20 GB of activations they do not: sharded
    (7.0e9, 10e9, 40e9, 8),   # 112 GB of states, 14 + 10 sharded over 8: sharded
    (15e9, 15e9, 40e9, 8),    # 240 GB of states: 30 + 15 sharded over 8 do not fit: beyond sharding
    (70e9, 10e9, 40e9, 64),   # over 64 ranks 17.5 + 10 fit: sharded
    (1.0e9, 50e9, 40e9, 8),   # the activations alone exceed the device; ZeRO does not split them: beyond sharding
]


def check_parallelism_choice(choose) -> bool:
    """`choose(num_params, activation_bytes, device_bytes, world_size)` -> "data", "sharded" or
    "beyond sharding", run on cases where the usual slips (4 bytes a parameter, no activations, states not
    divided over the ranks, activations divided too, sharding first, the whole device filled) each give another
    answer.  A layout fits in (1 - HEADROOM) of the device, the path's fit rule."""
    if choose is None:
        return _unfinished("choose")
    for num_params, activations, device, world_size in _PARALLELISM_CASES:
        case = (f"{num_params / 1e9:g}B parameters, {activations / 1e9:g} GB of activations, {world_size} GPUs of "
                f"{device / 1e9:g} GB")
        got = _attempt("choose", case, lambda: choose(num_params, activations, device, world_size))
        if got is _FAILED:
            return False
        answer = PARALLELISM_ANSWERS.get(str(got).strip().lower())
        if str(got).strip().lower() == "model":
            return _verdict(False, f"{case}: choose returned 'model': where sharding is not enough, return "
                                   "\"beyond sharding\": recomputing the activations may do without a model split")
        if answer is None:
            return _verdict(False, f"{case}: choose returned {got!r}: return \"data\", \"sharded\" or "
                                   "\"beyond sharding\"")
        want = _parallelism_rule(num_params, activations, device, world_size)
        if answer == want:
            continue
        state_gb, act_gb = 16 * num_params / 1e9, activations / 1e9
        device_gb = (1 - HEADROOM) * device / 1e9  # what the fit rule lets a layout fill
        rule = f"{device_gb:g} GB, {1 - HEADROOM:.0%} of the GPU's {device / 1e9:g} GB"
        if want == "data":
            why = (f"{state_gb:g} GB of model states + {act_gb:g} GB of activations fit {rule}: plain data "
                   "parallelism is enough (sharding would only add communication)")
        elif want == "sharded" and answer == "data" and state_gb + act_gb <= device / 1e9:
            why = (f"{state_gb:g} GB of model states + {act_gb:g} GB of activations fill more than {rule}: the fit "
                   "rule keeps a tenth free for CUDA's context, the allocator's slack and communication buffers")
        elif want == "sharded" and answer == "data":
            why = (f"{state_gb:g} GB of model states (16 bytes per parameter) + {act_gb:g} GB of activations do not "
                   f"fit {rule}: count every byte training keeps")
        elif want == "sharded":
            why = (f"sharded over {world_size} ranks the states take {state_gb / world_size:g} GB, + {act_gb:g} GB of "
                   "activations: that fits, so ZeRO-3/FSDP is enough without splitting the model")
        elif answer == "data":
            why = f"{state_gb:g} GB of states + {act_gb:g} GB of activations cannot fit {rule}"
        else:
            too_big = ("the sharded states alone are" if state_gb / world_size > device_gb
                       else "together they are")
            why = (f"sharding divides the {state_gb:g} GB of states over {world_size} ranks "
                   f"({state_gb / world_size:g} GB) and each rank still keeps its own {act_gb:g} GB of activations: "
                   f"{too_big} over {rule}: sharding alone is not enough (recompute the activations or split "
                   "the model)")
        return _verdict(False, f"{case}: you said {answer}, the answer is {want}: {why}")
    return _verdict(True, f"all {len(_PARALLELISM_CASES)} cases: states (16 bytes per parameter) plus activations, "
                          f"within {1 - HEADROOM:.0%} of the GPU, decide data, sharded (1/world_size of the states) or "
                          "beyond sharding")
