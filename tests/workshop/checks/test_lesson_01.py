"""Lesson 1's checks (memory, nodes, which parallelism): each passes the solution, FAILs on what an untouched
exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one line."""

import numpy as np

from conftest import fails, verdict
from scaledl.workshop import checks


# ---------------------------------------------------------------- lesson 1

N = 7_000_000_000


def test_training_memory(capsys):
    # Mixed precision as the ZeRO paper counts it: 16-bit parameters and gradients, fp32 master copy + Adam.
    assert checks.check_training_memory({"params": 2 * N, "grads": 2 * N, "optimizer": 12 * N}, N)
    assert "PASS: 112 GB" in verdict(capsys)
    fails(capsys, checks.check_training_memory(None, N), "`memory` is not set")
    fails(capsys, checks.check_training_memory({"params": 4 * N, "grads": 4 * N, "optimizer": 8 * N}, N),
          "parameters", "fp32")  # the fp32 table above the exercise, copied
    fails(capsys, checks.check_training_memory({"params": 2 * N, "grads": 4 * N, "optimizer": 12 * N}, N),
          "gradients", "fp32")
    fails(capsys, checks.check_training_memory({"params": 2 * N, "grads": 2 * N, "optimizer": 8 * N}, N),
          "2 + 2 + 8", "master copy")  # Adam's two states without the fp32 weights
    fails(capsys, checks.check_training_memory({"params": 2 * N, "grads": 2 * N, "optimizer": 6 * N}, N),
          "in fp32")  # three 16-bit numbers
    fails(capsys, checks.check_training_memory({"params": 2 * N, "grads": 2 * N, "optimizer": 4 * N}, N),
          "it keeps three")
    fails(capsys, checks.check_training_memory({"params": 2 * N, "grads": 2 * N, "optimizer": 0}, N),
          "states are memory too")
    fails(capsys, checks.check_training_memory({"params": 16 * N, "grads": 16 * N, "optimizer": 96 * N}, N),
          "in bits")
    fails(capsys, checks.check_training_memory({"params": 14, "grads": 14, "optimizer": 84}, N), "looks like GB")
    fails(capsys, checks.check_training_memory({"params": 2 * N, "gradients": 2 * N}, N), "no 'grads'")
    fails(capsys, checks.check_training_memory({"params": 2 * N, "grads": 2 * N, "optimizer": 10 * N}, N),
          "three fp32 numbers")
    # Unusual but right: NumPy integers, floats, and an extra key for the activations.
    assert checks.check_training_memory({"params": 2.0 * N, "grads": np.int64(2) * N, "optimizer": float(12 * N),
                                         "activations": 0}, N)
    verdict(capsys)


def test_training_days(capsys):
    args = (7e9, 2e12, 312e12, 0.4, 64)  # 7,790 GPU-days over 64 A100s: 121.7 days
    want = 6 * 7e9 * 2e12 / (312e12 * 0.4 * 64) / 86400
    assert checks.check_training_days(want, *args)
    assert verdict(capsys) == "PASS: 121.7 days on 64 GPUs"
    assert checks.check_training_days(np.float64(121.72), *args)  # rounded as printed
    verdict(capsys)
    fails(capsys, checks.check_training_days(None, *args), "`days` is not set")
    fails(capsys, checks.check_training_days(want * 64, *args), "GPU-days")
    fails(capsys, checks.check_training_days(want / 3, *args), "forward pass only")
    fails(capsys, checks.check_training_days(want * 0.4, *args), "run at their peak")
    fails(capsys, checks.check_training_days(want / 4, *args), "64 is the number of GPUs")
    fails(capsys, checks.check_training_days(want * 4, *args), "counts nodes")
    fails(capsys, checks.check_training_days(want * 24, *args), "hours")
    fails(capsys, checks.check_training_days(want * 86400, *args), "seconds")
    fails(capsys, checks.check_training_days(30, *args), "expected about 122")  # the target, not the answer
    fails(capsys, checks.check_training_days([121.7], *args), "give a number of days")


def test_training_nodes(capsys):
    args = (7e9, 2e12, 312e12, 0.4, 30)  # 7,790 GPU-days: 259.7 A100s for 30 days, 64.9 nodes of 4
    assert checks.check_training_nodes(65, *args)
    assert verdict(capsys) == "PASS: 65 nodes (260 GPUs) train in 30.0 days; 64 nodes (256 GPUs) would take 30.4"
    fails(capsys, checks.check_training_nodes(None, *args), "`nodes` is not set")
    fails(capsys, checks.check_training_nodes(64, *args), "30.4 days", "round up")  # int() or round()
    fails(capsys, checks.check_training_nodes(6 * 7e9 * 2e12 / (312e12 * 0.4 * 4) / 86400 / 30, *args),
          "whole nodes")  # not rounded
    fails(capsys, checks.check_training_nodes(260, *args), "counts GPUs")
    fails(capsys, checks.check_training_nodes(22, *args), "forward pass only")  # 2 N T
    fails(capsys, checks.check_training_nodes(26, *args), "run at their peak")  # no utilization
    fails(capsys, checks.check_training_nodes(5, *args), "expected 65")  # 121.7 days on 64 GPUs over 30 days
    fails(capsys, checks.check_training_nodes([65], *args), "give a number")
    # Unusual but right: a NumPy integer, a float that is whole, through GPUs rounded up first.
    assert checks.check_training_nodes(np.int64(65), *args)
    verdict(capsys)
    assert checks.check_training_nodes(float(-(-260 // 4)), *args)
    verdict(capsys)


def choose_right(num_params, activation_bytes, device_bytes, world_size):
    state, usable = 16 * num_params, 0.9 * device_bytes  # the path's fit rule: 10% of the device kept free
    if state + activation_bytes <= usable:
        return "data"
    return "sharded" if state / world_size + activation_bytes <= usable else "beyond sharding"


def choose_with(bytes_per_param=16, activations=True, divide_states=True, divide_activations=False,
                shard_first=False, headroom=0.1):
    """The rule with one slip: 4 bytes a parameter, activations forgotten, states not divided over
    the ranks, activations divided too, sharding tried before plain data parallelism, or the whole device filled."""
    def choose(num_params, activation_bytes, device_bytes, world_size):
        device_bytes = (1 - headroom) * device_bytes
        state = bytes_per_param * num_params
        act = activation_bytes if activations else 0
        sharded = (state / world_size if divide_states else state) + (act / world_size if divide_activations else act)
        if shard_first and sharded <= device_bytes:
            return "sharded"
        if state + act <= device_bytes:
            return "data"
        return "sharded" if sharded <= device_bytes else "beyond sharding"
    return choose


def test_parallelism_choice_check(capsys):
    assert checks.check_parallelism_choice(choose_right)
    assert "PASS: all 8 cases" in verdict(capsys)
    fails(capsys, checks.check_parallelism_choice(None), "`choose` is not set")
    fails(capsys, checks.check_parallelism_choice(choose_with(bytes_per_param=4)), "you said data",
          "16 bytes per parameter")
    fails(capsys, checks.check_parallelism_choice(choose_with(activations=False)), "you said data",
          "count every byte")
    fails(capsys, checks.check_parallelism_choice(choose_with(divide_states=False)), "you said beyond sharding",
          "sharded over 8 ranks")
    fails(capsys, checks.check_parallelism_choice(choose_with(divide_activations=True)), "you said sharded",
          "still keeps its own 15 GB of activations: together they are over 36 GB", "sharding alone is not enough")
    fails(capsys, checks.check_parallelism_choice(choose_with(headroom=0)), "you said data",
          "24 GB of model states + 14 GB", "keeps a tenth free")  # the whole device filled: 38 GB fits 40, not 36
    fails(capsys, checks.check_parallelism_choice(choose_with(shard_first=True)), "you said sharded",
          "plain data parallelism is enough")
    fails(capsys, checks.check_parallelism_choice(lambda *args: "pipeline"), "return \"data\"")
    # "model" would say a model split is needed, where recomputing the activations may be enough.
    fails(capsys, checks.check_parallelism_choice(lambda *args: "model"), "return \"beyond sharding\"")
    # Unusual but right: mixed precision's 2 + 2 + 12 bytes, "ZeRO" for sharded, NumPy numbers.
    mixed = {"data": "Data", "sharded": "ZeRO", "beyond sharding": "Beyond Sharding "}

    def choose_mixed(num_params, activation_bytes, device_bytes, world_size):
        return mixed[choose_right(np.float64(num_params) * (2 + 2 + 12) / 16, activation_bytes, device_bytes,
                                  np.int64(world_size))]
    assert checks.check_parallelism_choice(choose_mixed)
    verdict(capsys)
