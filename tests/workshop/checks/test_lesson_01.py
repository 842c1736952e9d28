"""Lesson 1's checks (memory, days, which parallelism): each passes the solution, FAILs on what an untouched
exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one line."""

import numpy as np

from conftest import fails, verdict
from scaledl.workshop import checks


# ---------------------------------------------------------------- lesson 1

N = 7_000_000_000


def test_training_memory(capsys):
    assert checks.check_training_memory({"params": 4 * N, "grads": 4 * N, "optimizer": 8 * N}, N)
    assert "PASS: 112 GB" in verdict(capsys)
    fails(capsys, checks.check_training_memory(None, N), "`memory` is not set")
    fails(capsys, checks.check_training_memory({"params": 4 * N, "grads": 4 * N, "optimizer": 4 * N}, N),
          "Adam keeps two")  # momentum only
    fails(capsys, checks.check_training_memory({"params": 4 * N, "grads": 4 * N, "optimizer": 0}, N),
          "Adam's states are memory too")
    fails(capsys, checks.check_training_memory({"params": 2 * N, "grads": 2 * N, "optimizer": 8 * N}, N),
          "fp32, 4")  # fp16 sizes for an fp32 model
    fails(capsys, checks.check_training_memory({"params": 32 * N, "grads": 32 * N, "optimizer": 64 * N}, N),
          "in bits")
    fails(capsys, checks.check_training_memory({"params": 28, "grads": 28, "optimizer": 56}, N), "looks like GB")
    fails(capsys, checks.check_training_memory({"params": 4 * N, "gradients": 4 * N}, N), "no 'grads'")
    fails(capsys, checks.check_training_memory({"params": 4 * N, "grads": 4 * N, "optimizer": 12 * N}, N),
          "mixed precision's count")  # the ZeRO paper's 12 bytes, which include an fp32 master copy
    # Unusual but right: NumPy integers, floats, and an extra key for the activations.
    assert checks.check_training_memory({"params": 4.0 * N, "grads": np.int64(4) * N, "optimizer": float(8 * N),
                                         "activations": 0}, N)
    verdict(capsys)


def test_training_days(capsys):
    args = (7e9, 2e12, 312e12, 0.4, 1)
    right = 6 * 7e9 * 2e12 / (312e12 * 0.4) / 86400
    assert checks.check_training_days(right, *args)
    verdict(capsys)
    fails(capsys, checks.check_training_days(None, *args), "`days` is not set")
    fails(capsys, checks.check_training_days(right / 3, *args), "forward pass only")  # 2 N T
    fails(capsys, checks.check_training_days(right * 0.4, *args), "run at their peak")  # no utilization
    fails(capsys, checks.check_training_days(right * 86400, *args), "in seconds")
    fails(capsys, checks.check_training_days(right * 24, *args), "in hours")
    on_64 = (7e9, 2e12, 312e12, 0.4, 64)
    fails(capsys, checks.check_training_days(right, *on_64), "one GPU's time")
    # Unusual but right: on 64 GPUs, in float32, through hours.
    assert checks.check_training_days(np.float32(6 * 7e9 * 2e12 / (64 * 312e12 * 0.4) / 3600 / 24), *on_64)
    verdict(capsys)


def choose_right(num_params, activation_bytes, device_bytes, world_size):
    state = 16 * num_params
    if state + activation_bytes <= device_bytes:
        return "data"
    return "sharded" if state / world_size + activation_bytes <= device_bytes else "model"


def choose_with(bytes_per_param=16, activations=True, divide_states=True, divide_activations=False,
                shard_first=False):
    """The rule with one slip: 4 bytes a parameter, activations forgotten, states not divided over
    the ranks, activations divided too, or sharding tried before plain data parallelism."""
    def choose(num_params, activation_bytes, device_bytes, world_size):
        state = bytes_per_param * num_params
        act = activation_bytes if activations else 0
        sharded = (state / world_size if divide_states else state) + (act / world_size if divide_activations else act)
        if shard_first and sharded <= device_bytes:
            return "sharded"
        if state + act <= device_bytes:
            return "data"
        return "sharded" if sharded <= device_bytes else "model"
    return choose


def test_parallelism_choice_check(capsys):
    assert checks.check_parallelism_choice(choose_right)
    assert "PASS: all 7 cases" in verdict(capsys)
    fails(capsys, checks.check_parallelism_choice(None), "`choose` is not set")
    fails(capsys, checks.check_parallelism_choice(choose_with(bytes_per_param=4)), "you said data",
          "16 bytes a parameter")
    fails(capsys, checks.check_parallelism_choice(choose_with(activations=False)), "you said data",
          "count every byte")
    fails(capsys, checks.check_parallelism_choice(choose_with(divide_states=False)), "you said model",
          "sharded over 8 ranks")
    fails(capsys, checks.check_parallelism_choice(choose_with(divide_activations=True)), "you said sharded",
          "still keeps its own 15 GB of activations: together they are over 40 GB")
    fails(capsys, checks.check_parallelism_choice(choose_with(shard_first=True)), "you said sharded",
          "plain data parallelism is enough")
    fails(capsys, checks.check_parallelism_choice(lambda *args: "pipeline"), "return \"data\"")
    # Unusual but right: mixed precision's 2 + 2 + 12 bytes, "ZeRO" for sharded, NumPy numbers.
    mixed = {"data": "Data", "sharded": "ZeRO", "model": "model "}

    def choose_mixed(num_params, activation_bytes, device_bytes, world_size):
        return mixed[choose_right(np.float64(num_params) * (2 + 2 + 12) / 16, activation_bytes, device_bytes,
                                  np.int64(world_size))]
    assert checks.check_parallelism_choice(choose_mixed)
    verdict(capsys)
