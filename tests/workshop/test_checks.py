"""Each check passes the solution, FAILs on what an untouched exercise leaves, and FAILs on the
wrong answers a learner plausibly writes, naming the fix in one line."""
import math

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from conftest import DATA
from scaledl import schedule
from scaledl.workshop import checks
from scaledl.workshop.checks import lesson_02


def verdict(capsys) -> str:
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1, lines  # one line, always
    return lines[0]


def fails(capsys, result, *phrases):
    line = verdict(capsys)
    assert result is False and line.startswith("FAIL: "), line
    for phrase in phrases:
        assert phrase in line, line
    return line


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


# ---------------------------------------------------------------- lesson 2

def honest(step, batch_size, synchronize, num_steps=20, warmup_steps=3):
    import time

    for _ in range(warmup_steps):
        step()
    synchronize()
    start = time.perf_counter()
    for _ in range(num_steps):
        step()
    synchronize()
    return num_steps * batch_size / (time.perf_counter() - start)


def no_synchronize(step, batch_size, synchronize, num_steps=20, warmup_steps=3):
    import time

    for _ in range(warmup_steps):
        step()
    start = time.perf_counter()
    for _ in range(num_steps):
        step()
    return num_steps * batch_size / (time.perf_counter() - start)  # reads the clock while the device works


def warmup_timed(step, batch_size, synchronize, num_steps=20, warmup_steps=3):
    import time

    synchronize()
    start = time.perf_counter()
    for _ in range(warmup_steps + num_steps):
        step()
    synchronize()
    return (warmup_steps + num_steps) * batch_size / (time.perf_counter() - start)


def one_step_too_many_counted(step, batch_size, synchronize, num_steps=20, warmup_steps=3):
    import time

    for _ in range(warmup_steps):
        step()
    synchronize()
    start = time.perf_counter()
    for _ in range(num_steps):
        step()
    synchronize()
    return (num_steps + 1) * batch_size / (time.perf_counter() - start)


def last_step_untimed(step, batch_size, synchronize, num_steps=20, warmup_steps=3):
    import time

    for _ in range(warmup_steps):
        step()
    synchronize()
    for index in range(num_steps):
        if index == 1:
            start = time.perf_counter()  # the clock starts a step late
        step()
        synchronize()
    return num_steps * batch_size / (time.perf_counter() - start)


def returns_seconds(step, batch_size, synchronize, num_steps=20, warmup_steps=3):
    import time

    for _ in range(warmup_steps):
        step()
    synchronize()
    start = time.perf_counter()
    for _ in range(num_steps):
        step()
    synchronize()
    return time.perf_counter() - start


def per_step_mean(step, batch_size, synchronize, num_steps=20, warmup_steps=3):
    """Unusual but right: a wall clock, the device waited for after every step, the mean step time."""
    import time

    for _ in range(warmup_steps):
        step()
    synchronize()
    times = []
    for _ in range(num_steps):
        started = time.time()
        step()
        synchronize()
        times.append(time.time() - started)
    return batch_size / (sum(times) / len(times))


def untouched(*args, **kwargs):
    raise NotImplementedError("exercise")


def test_samples_per_s_on_a_simulated_device(capsys):
    assert checks.check_samples_per_s(honest)
    verdict(capsys)
    assert checks.check_samples_per_s(per_step_mean)
    verdict(capsys)
    fails(capsys, checks.check_samples_per_s(no_synchronize), "synchronize before reading it")
    fails(capsys, checks.check_samples_per_s(warmup_timed), "slow first steps are in the timing")
    fails(capsys, checks.check_samples_per_s(one_step_too_many_counted), "one step off")
    fails(capsys, checks.check_samples_per_s(last_step_untimed), "one step off")
    fails(capsys, checks.check_samples_per_s(returns_seconds), "looks like seconds")
    fails(capsys, checks.check_samples_per_s(lambda step, *args, **kwargs: [step() for _ in range(40)] and 1e4),
          "it ran 40 steps")
    fails(capsys, checks.check_samples_per_s(untouched), "NotImplementedError")
    fails(capsys, checks.check_samples_per_s(None), "not set")


def test_simulated_device_queues_work_until_synchronized():
    import time

    device = checks.SimulatedDevice(step_s=0.02, warmup_steps=0)
    start = time.perf_counter()
    for _ in range(5):
        device.step()
    queued = time.perf_counter() - start
    device.synchronize()
    assert queued < 0.01 and time.perf_counter() - start >= 0.1


def stopwatch_reads(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    """The lesson's solution: the first launch, then the slower side's pace, then the last run."""
    if not synchronize:
        return num_steps * batch_size / (num_steps * launch_s)
    return num_steps * batch_size / (launch_s + (num_steps - 1) * max(launch_s, device_s) + device_s)


def step_by_step(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    """Unusual but right: follow every step through the host and the device, in milliseconds."""
    host = device = 0
    for _ in range(num_steps):
        host += launch_s * 1000
        device = max(device, host) + device_s * 1000
    return batch_size * num_steps / ((device if synchronize else host) / 1000)


def queue_never_drains(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    return batch_size / launch_s  # the host's pace, synchronize or not


def device_time_only(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    if not synchronize:
        return batch_size / launch_s
    return num_steps * batch_size / (launch_s + num_steps * device_s)  # right only where the GPU is the bottleneck


def warmup_counted(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    return stopwatch_reads(launch_s, device_s, batch_size, num_steps + warmup_steps, 0, synchronize)


def one_step_too_many_timed(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    if not synchronize:
        return batch_size / launch_s
    return num_steps * batch_size / (launch_s + num_steps * max(launch_s, device_s) + device_s)


def serial(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    return batch_size / (launch_s + device_s)  # the host waiting for every step


def steady_pace(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    return batch_size / (max(launch_s, device_s) if synchronize else launch_s)


def synchronized_always(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    return stopwatch_reads(launch_s, device_s, batch_size, num_steps, warmup_steps, True)


def step_seconds(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize):
    return 1 / stopwatch_reads(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize)


def test_stopwatch_prediction(capsys):
    assert checks.check_stopwatch_prediction(stopwatch_reads)
    assert verdict(capsys).startswith("PASS: all 5 cases")
    assert checks.check_stopwatch_prediction(step_by_step)
    verdict(capsys)
    fails(capsys, checks.check_stopwatch_prediction(queue_never_drains), "synchronize=True",
          "waits while the device runs what is still queued")
    fails(capsys, checks.check_stopwatch_prediction(device_time_only), "launch 3 ms, device 1 ms",
          "the launches set the pace")
    fails(capsys, checks.check_stopwatch_prediction(warmup_counted), "warm-up steps run before the clock starts")
    fails(capsys, checks.check_stopwatch_prediction(one_step_too_many_timed), "one step off")
    fails(capsys, checks.check_stopwatch_prediction(serial), "launches the next step while the device runs")
    fails(capsys, checks.check_stopwatch_prediction(steady_pace), "holds the first launch")
    fails(capsys, checks.check_stopwatch_prediction(synchronized_always), "synchronize=False",
          "stops as soon as the host has launched the last step")
    fails(capsys, checks.check_stopwatch_prediction(step_seconds), "looks like seconds")
    fails(capsys, checks.check_stopwatch_prediction(lambda *case: stopwatch_reads(*case) / 1000), "per millisecond")
    fails(capsys, checks.check_stopwatch_prediction(lambda *case: None), "returned None")
    fails(capsys, checks.check_stopwatch_prediction(lambda *case: 1 / 0), "ZeroDivisionError")
    fails(capsys, checks.check_stopwatch_prediction(untouched), "NotImplementedError")
    fails(capsys, checks.check_stopwatch_prediction(None), "`stopwatch_reads` is not set")


def test_stopwatch_cases_tell_the_slips_from_the_right_reading():
    """In every case the reading is not itself one of the wrong answers' values, and each slip
    is some case's wrong answer: the check can name it."""
    for case in lesson_02._STOPWATCH_CASES:
        reading = stopwatch_reads(*case)
        assert math.isclose(reading, lesson_02.async_timeline.stopwatch(case[0], case[1], case[3], case[4])
                            .samples_per_s(case[2], case[5]), rel_tol=1e-9)
    for wrong in (queue_never_drains, device_time_only, warmup_counted, one_step_too_many_timed, serial,
                  steady_pace, synchronized_always):
        assert any(not math.isclose(wrong(*case), stopwatch_reads(*case), rel_tol=1e-6)
                   for case in lesson_02._STOPWATCH_CASES), wrong.__name__


# ---------------------------------------------------------------- lesson 3

def test_all_reduce_check(capsys):
    assert checks.check_all_reduce([3.0, 3.0], 2)
    verdict(capsys)
    assert checks.check_all_reduce([10, np.float32(10), 10.0, 10], 4)  # 4 ranks, any number type
    verdict(capsys)
    fails(capsys, checks.check_all_reduce([1.0, 2.0], 2), "it still holds its own value")  # untouched
    fails(capsys, checks.check_all_reduce([2.0, 2.0], 2), "the largest value")  # ReduceOp.MAX
    fails(capsys, checks.check_all_reduce([4.0] * 4, 4), "the largest value")
    fails(capsys, checks.check_all_reduce([1.5, 1.5], 2), "that is the average")  # divided by world size
    fails(capsys, checks.check_all_reduce([3.0, 2.0], 2), "only rank 0 holds the sum")  # tdist.reduce(x, dst=0)
    fails(capsys, checks.check_all_reduce([24.0] * 4, 4), "rank 0 holds 24")  # ReduceOp.PRODUCT
    fails(capsys, checks.check_all_reduce([1.0], 1), "start 2 or more")  # one rank proves nothing


def ring(nbytes, p, alpha, beta):
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / beta


def test_ring_prediction_check(capsys):
    assert checks.check_ring_prediction(ring)
    assert "PASS: the ring's cost model" in verdict(capsys)
    fails(capsys, checks.check_ring_prediction(None), "`predict` is not set")
    fails(capsys, checks.check_ring_prediction(lambda n, p, a, b: (p - 1) * a + (p - 1) / p * n / b), "half the ring")
    fails(capsys, checks.check_ring_prediction(lambda n, p, a, b: 2 * (p - 1) * a + n / b), "2(p-1)/p of the bytes")
    fails(capsys, checks.check_ring_prediction(lambda n, p, a, b: 2 * (p - 1) * a + 2 * (p - 1) / p * n * b),
          "beta is bytes per second")
    fails(capsys, checks.check_ring_prediction(lambda n, p, a, b: (p - 1) * a + 2 * (p - 1) / p * n / b),
          "counts p-1 messages")
    fails(capsys, checks.check_ring_prediction(lambda n, p, a, b: 2 * (p - 1) / p * n / b), "latency term is missing")
    fails(capsys, checks.check_ring_prediction(lambda n, p, a, b: 2 * p * a + 2 * n / b), "not p")
    # Unusual but right: NumPy, the two halves written out, and a learner's own names.
    def halves(nbytes, world_size, alpha, beta):
        step = alpha + nbytes / world_size / beta
        return np.float32(2 * (world_size - 1)) * np.float64(step)
    assert checks.check_ring_prediction(halves)
    verdict(capsys)


def sampler_shard(use_local_rank=False, replicas=None):
    def shard(num_samples, rank, local_rank, world_size):
        return list(DistributedSampler(range(num_samples), num_replicas=replicas or world_size,
                                       rank=local_rank if use_local_rank else rank, shuffle=False))
    return shard


def test_sharding_check_simulates_two_nodes(capsys):
    # 20 samples on 2 nodes x 3 ranks: 6 does not divide 20, so DistributedSampler pads 4 repeats.
    assert checks.check_sharding(sampler_shard())
    assert "on 2 nodes x 3 ranks, 20 samples: every sample goes to one rank, 4 also" in verdict(capsys)
    assert checks.check_sharding(sampler_shard(), 16, nodes=2, ranks_per_node=2)
    assert "each sample goes to exactly one rank" in verdict(capsys)
    # Unusual but right: a stride by hand (ranks get 3 or 4), drop_last, contiguous blocks.
    assert checks.check_sharding(lambda n, r, lr, w: list(range(r, n, w)))
    assert "ranks get 3 to 4" in verdict(capsys)
    assert checks.check_sharding(lambda n, r, lr, w: list(DistributedSampler(range(n), w, r, shuffle=False,
                                                                             drop_last=True)))
    assert "2 are left out of the epoch" in verdict(capsys)
    assert checks.check_sharding(lambda n, r, lr, w: np.array_split(np.arange(n), w)[r])
    verdict(capsys)
    # By local rank: on one node it looks right, on two nodes ranks 0 and 3 train on the same samples.
    assert checks.check_sharding(sampler_shard(use_local_rank=True), 16, nodes=1, ranks_per_node=2)
    verdict(capsys)
    fails(capsys, checks.check_sharding(sampler_shard(use_local_rank=True)),
          "ranks 0 and 3 both get sample 0", "sharded by local rank")
    # One node's worth of shards, taken by local rank: every sample twice.
    fails(capsys, checks.check_sharding(sampler_shard(use_local_rank=True, replicas=3)), "sharded by local rank")
    # One node's worth of shards, taken by global rank: the sampler refuses rank 3 of 3.
    fails(capsys, checks.check_sharding(sampler_shard(replicas=3)), "rank=3", "raised ValueError")
    fails(capsys, checks.check_sharding(lambda n, r, lr, w: list(range(r, n // 2, w))), "never seen", "world_size")
    fails(capsys, checks.check_sharding(lambda n, r, lr, w: list(range(r + 1, n, w))), "never seen (first: 0)")
    fails(capsys, checks.check_sharding(lambda n, r, lr, w: list(range(r, n + 1, w))), "index 20 is not a sample")
    fails(capsys, checks.check_sharding(untouched), "NotImplementedError")
    fails(capsys, checks.check_sharding(None), "`shard` is not set")


# ---------------------------------------------------------------- data parallelism

def test_in_sync_check_names_the_framework_fix(capsys):
    assert checks.check_in_sync(["abc", "abc"])
    verdict(capsys)
    fails(capsys, checks.check_in_sync(["abc", "abd"]), "rank 1 holds different parameters", "wrap the model in DDP")
    line = fails(capsys, checks.check_in_sync(["abc", "abd"], framework="deepspeed"), "engine")
    assert "DDP" not in line
    fails(capsys, checks.check_in_sync(["abc", None]), "did not finish")
    assert not checks.check_in_sync(None)


def test_horovod_sync_check_names_the_missing_part(capsys):
    for framework in ("tf", "torch"):
        assert checks.check_horovod_sync([["w", "o", "e"], ["w", "o", "e"]], framework)
        verdict(capsys)
    # No broadcast at all: the weights differ from the start.
    fails(capsys, checks.check_horovod_sync([["w", "o", "e"], ["v", "p", "f"]], "tf"),
          "different weights after the first step", "hvd.broadcast_variables")
    fails(capsys, checks.check_horovod_sync([["w", "o", "e"], ["v", "p", "f"]], "torch"),
          "different weights before the first step", "hvd.broadcast_parameters")
    # The weights broadcast, the optimizer state forgotten (rank 0 had resumed with momentum).
    fails(capsys, checks.check_horovod_sync([["w", "o", "e"], ["w", "p", "f"]], "tf"),
          "optimizer state", "optimizer.variables")
    fails(capsys, checks.check_horovod_sync([["w", "o", "e"], ["w", "p", "f"]], "torch"),
          "optimizer state", "hvd.broadcast_optimizer_state")
    # Broadcasts right, gradients never averaged.
    fails(capsys, checks.check_horovod_sync([["w", "o", "e"], ["w", "o", "f"]], "tf"), "hvd.DistributedGradientTape")
    fails(capsys, checks.check_horovod_sync([["w", "o", "e"], ["w", "o", "f"]], "torch"), "hvd.DistributedOptimizer")
    # The exercise raised before the first step ended.
    fails(capsys, checks.check_horovod_sync([[], []], "tf"), "did not finish on every rank")
    assert not checks.check_horovod_sync(None, "torch")
    fails(capsys, checks.check_horovod_sync([["w", "o", "e"]], "torch"), "start 2 or more")


SAME = [["w", "o", "e"], ["w", "o", "e"]]


@pytest.mark.parametrize("framework", ["tf", "torch"])
def test_horovod_sync_check_compares_with_one_process_on_the_global_batch(framework, capsys):
    """Ranks that agree can still be wrong together: the trained weights must be those of one
    process that took the same steps on every rank's micro batches at once."""
    right = {"average": 3e-8, "sum": 4e-3}
    assert checks.check_horovod_sync(SAME, framework, [right, right])
    assert "end where one process on the global batch does" in verdict(capsys)
    # Unusual but right: 4 ranks, float rounding of a GPU reduction, still inside the tolerance.
    close = {"average": 2e-6, "sum": 1e-2}
    assert checks.check_horovod_sync(SAME * 2, framework, [close] * 4)
    verdict(capsys)
    # op=hvd.Sum: the ranks agree, and match the process whose gradients are world_size times larger.
    summed = {"average": 4e-3, "sum": 1e-8}
    fails(capsys, checks.check_horovod_sync(SAME, framework, [summed, summed]), "summed over ranks",
          "2x its gradients")
    # The gradients averaged twice (the loss divided by world_size too), or an lr scaled by hand: agreed, but off.
    off = {"average": 2e-3, "sum": 6e-3}
    fails(capsys, checks.check_horovod_sync(SAME, framework, [off, off]), "differ from one process's steps",
          "by 0.002")
    # One rank's error is enough.
    fails(capsys, checks.check_horovod_sync(SAME, framework, [right, summed]), "summed over ranks")
    fails(capsys, checks.check_horovod_sync(SAME, framework, [right, None]), "reference cell did not finish")
    # Equal fingerprints are checked first: a missing broadcast is named as such, whatever the errors.
    fails(capsys, checks.check_horovod_sync([["w", "o", "e"], ["w", "p", "e"]], framework, [right, right]),
          "optimizer state")


def fuse_right(tensors, threshold):
    buffers, used = [], 0
    for name, nbytes in tensors:
        if buffers and used + nbytes <= threshold:
            buffers[-1].append(name)
            used += nbytes
        else:
            buffers.append([name])
            used = nbytes
    return buffers


def fuse_with(strict=False, overfill=False, sort=False):
    """Horovod's packing with one slip: a buffer must stay below the threshold, the tensor that
    passes it still joins, or the tensors sorted by size first (bin packing)."""
    def fuse(tensors, threshold):
        tensors = sorted(tensors, key=lambda t: -t[1]) if sort else tensors
        buffers, used = [], 0
        for name, nbytes in tensors:
            fits = used + nbytes < threshold if strict else used + nbytes <= threshold
            if buffers and (fits or (overfill and used < threshold)):
                buffers[-1].append(name)
                used += nbytes
            else:
                buffers.append([name])
                used = nbytes
        return buffers
    return fuse


def test_fusion_check(capsys):
    assert checks.check_fusion(fuse_right)
    assert "PASS: all 5 cases" in verdict(capsys)
    fails(capsys, checks.check_fusion(None), "`fuse` is not set")
    fails(capsys, checks.check_fusion(lambda tensors, threshold: [[name for name, _ in tensors]]),
          "at most the threshold")  # one buffer, whatever the threshold
    fails(capsys, checks.check_fusion(lambda tensors, threshold: [[name] for name, _ in tensors]),
          "share one buffer")  # fusion off
    fails(capsys, checks.check_fusion(fuse_with(strict=True)), "at most, not below")
    fails(capsys, checks.check_fusion(fuse_with(overfill=True)), "starts the next buffer")
    fails(capsys, checks.check_fusion(fuse_with(sort=True)), "does not sort")
    # Unusual but right: a generator of tuples, built from running totals.
    def fuse_totals(tensors, threshold):
        start, total = 0, 0
        for i, (_, nbytes) in enumerate(tensors):
            if i > start and total + nbytes > threshold:
                yield tuple(name for name, _ in tensors[start:i])
                start, total = i, 0
            total += nbytes
        yield tuple(name for name, _ in tensors[start:])
    assert checks.check_fusion(fuse_totals)
    verdict(capsys)


def test_horovod_allreduce_check(capsys):
    assert checks.check_horovod_allreduce([(3.0, 1.5), (3.0, 1.5)], 2)
    verdict(capsys)
    # Unusual but right: 4 ranks, the total as the average times the world size, NumPy numbers.
    assert checks.check_horovod_allreduce([(np.float32(2.5) * 4, np.float64(2.5))] * 4, 4)
    verdict(capsys)
    fails(capsys, checks.check_horovod_allreduce([(2.5, 2.5)] * 4, 4), "averages unless told otherwise")
    fails(capsys, checks.check_horovod_allreduce([(1.5, 1.5), (1.5, 1.5)], 2), "averages unless told otherwise")
    fails(capsys, checks.check_horovod_allreduce([(3.0, 3.0), (3.0, 3.0)], 2), "that is the sum")
    fails(capsys, checks.check_horovod_allreduce([(1.0, 1.0), (2.0, 2.0)], 2), "it still holds its own value")
    assert not checks.check_horovod_allreduce(None, 2)


def accumulation_report(max_error=1e-8, all_reduces=1, buckets=1, unscaled=0.03, over_ranks=0.01):
    return {"max_error": max_error, "all_reduces": all_reduces, "buckets": buckets, "error_unscaled": unscaled,
            "error_over_ranks": over_ranks}


def test_accumulation_check(capsys):
    assert checks.check_accumulation([accumulation_report()] * 2, 4)
    verdict(capsys)
    # Unusual but right: 3 buckets, each all-reduced once; reports without the optional errors.
    assert checks.check_accumulation([{"max_error": 2e-6, "all_reduces": 3, "buckets": 3}] * 4, 4)
    assert "3 buckets" in verdict(capsys)
    # No no_sync (or the forward outside it): every micro batch's backward all-reduced.
    fails(capsys, checks.check_accumulation([accumulation_report(all_reduces=4)] * 2, 4),
          "4 all-reduces in a window of 4", "skip the synchronization")
    # no_sync on every micro batch, the last included: nothing was ever averaged.
    fails(capsys, checks.check_accumulation([accumulation_report(0.02, all_reduces=0)] * 2, 4),
          "no gradient was all-reduced")
    # Loss not divided by the accumulation steps: the step is 4x too large.
    fails(capsys, checks.check_accumulation([accumulation_report(0.03, unscaled=1e-8)] * 2, 4),
          "4x too large", "divide each micro batch's loss by 4")
    # Divided by world_size too: DDP already averages over the ranks.
    fails(capsys, checks.check_accumulation([accumulation_report(0.01, over_ranks=1e-8)] * 2, 4),
          "2x too small", "already averages")
    # The first micro batch synchronized, the rest only accumulated: one all-reduce, wrong weights.
    fails(capsys, checks.check_accumulation([accumulation_report(0.004)] * 2, 4), "must be the last")
    # Right on rank 0 only: every rank's report counts.
    fails(capsys, checks.check_accumulation([accumulation_report(), accumulation_report(0.004)], 4),
          "differ from one big-batch step by 0.004")
    # One rank cannot show any of this.
    fails(capsys, checks.check_accumulation([accumulation_report()], 4), "start 2 or more")
    fails(capsys, checks.check_accumulation([None, None], 4), "did not finish")
    assert not checks.check_accumulation(None, 4)


def test_in_sync_check_needs_two_ranks(capsys):
    fails(capsys, checks.check_in_sync(["abc"]), "start 2 or more")
    assert checks.check_in_sync(["abc"] * 3)
    verdict(capsys)


# ---------------------------------------------------------------- scaling

def test_efficiency_check(capsys):
    rates = {1: 1000.0, 2: 1700.0, 4: 3000.0}

    def right(r):
        base = min(r)
        return {n: v / (n * r[base] / base) for n, v in r.items()}

    assert checks.check_efficiency(right, rates)
    assert "baseline of 2 ranks" in verdict(capsys)
    # Unusual but right: a measurement that starts at 2 ranks, and numpy numbers back.
    assert checks.check_efficiency(lambda r: {n: np.float64(e) for n, e in right(r).items()}, {2: 1800.0, 4: 3000.0})
    verdict(capsys)
    # The baseline hard-coded as 1 rank: a KeyError on the hidden measurement.
    fails(capsys, checks.check_efficiency(lambda r: {n: v / (n * r[1]) for n, v in r.items()}, rates),
          "baseline of 2 ranks", "KeyError", "not always 1")
    # The baseline's rate not divided by its ranks: right when the baseline is 1, wrong from 2.
    fails(capsys, checks.check_efficiency(lambda r: {n: v / (n * r[min(r)]) for n, v in r.items()}, rates),
          "baseline 2 ranks", "divide them by 2")
    fails(capsys, checks.check_efficiency(lambda r: {n: v / r[min(r)] for n, v in r.items()}, rates),
          "is the speed-up")
    fails(capsys, checks.check_efficiency(lambda r: {n: 1 / e for n, e in right(r).items()}, rates), "upside down")
    fails(capsys, checks.check_efficiency(lambda r: {n: e for n, e in right(r).items() if n > 1}, rates),
          "no efficiency for world_size 1")
    fails(capsys, checks.check_efficiency(untouched, rates), "NotImplementedError")
    fails(capsys, checks.check_efficiency(None, rates), "not set")


def test_warmup_check(capsys):
    def solution(step, lr, global_batch_size, base_batch_size, warmup_steps):
        return schedule.lr_at(step, lr=lr, global_batch_size=global_batch_size, base_batch_size=base_batch_size,
                              scale_lr=True, warmup_steps=warmup_steps)

    def interpolated(step, lr, global_batch_size, base_batch_size, warmup_steps):  # unusual but right
        k = global_batch_size / base_batch_size
        return float(np.interp(step, [0, warmup_steps], [lr, lr * k]))

    def no_warmup(step, lr, global_batch_size, base_batch_size, warmup_steps):
        return lr * global_batch_size / base_batch_size

    def not_scaled(step, lr, global_batch_size, base_batch_size, warmup_steps):
        return lr * min(1.0, step / warmup_steps) if step < warmup_steps else lr

    def square_root(step, lr, global_batch_size, base_batch_size, warmup_steps):
        target = lr * math.sqrt(global_batch_size / base_batch_size)
        return target if step >= warmup_steps else lr + (target - lr) * step / warmup_steps

    def from_zero(step, lr, global_batch_size, base_batch_size, warmup_steps):
        target = lr * global_batch_size / base_batch_size
        return target * min(1.0, step / warmup_steps)

    def one_step_ahead(step, lr, global_batch_size, base_batch_size, warmup_steps):
        target = lr * global_batch_size / base_batch_size
        return target if step >= warmup_steps else lr + (target - lr) * (step + 1) / warmup_steps

    def integer_factor(step, lr, global_batch_size, base_batch_size, warmup_steps):
        target = lr * (global_batch_size // base_batch_size)
        return target if step >= warmup_steps else lr + (target - lr) * step / warmup_steps

    assert checks.check_warmup(solution)
    verdict(capsys)
    assert checks.check_warmup(interpolated)
    verdict(capsys)
    fails(capsys, checks.check_warmup(no_warmup), "no warm-up")
    fails(capsys, checks.check_warmup(square_root), "square-root scaling")
    fails(capsys, checks.check_warmup(from_zero), "not at 0")
    fails(capsys, checks.check_warmup(not_scaled), "never grows with the batch")
    fails(capsys, checks.check_warmup(one_step_ahead), "one step off")
    fails(capsys, checks.check_warmup(integer_factor), "96 / 64 is 1.5", "integer division")
    fails(capsys, checks.check_warmup(untouched), "NotImplementedError")


# ---------------------------------------------------------------- DeepSpeed and ZeRO

GOOD = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 3, "train_batch_size": 48,
        "gradient_clipping": 0}


def test_deepspeed_config_check(capsys):
    assert checks.check_deepspeed_config([GOOD, GOOD], world_size=2)
    verdict(capsys)
    # Unusual but right: every config DeepSpeed accepts, one batch number left for it to infer.
    for left_out in ("train_batch_size", "gradient_accumulation_steps"):
        config = {key: value for key, value in GOOD.items() if key != left_out}
        assert checks.check_deepspeed_config([config], world_size=2)
        assert f"DeepSpeed infers {left_out}" in verdict(capsys)
    assert checks.check_deepspeed_config([{"train_batch_size": 96, "gradient_accumulation_steps": 3,
                                           "gradient_clipping": 0.0}], world_size=4)
    verdict(capsys)
    # The global batch without the ranks, and without the accumulation: two different numbers, both refused.
    fails(capsys, checks.check_deepspeed_config([{**GOOD, "train_batch_size": 24}], world_size=2),
          "train_batch_size 24 != micro batch 8 x accumulation 3 x world_size 2", "refuses")
    fails(capsys, checks.check_deepspeed_config([{**GOOD, "train_batch_size": 16}], world_size=2),
          "train_batch_size 16 != micro batch 8 x accumulation 3 x world_size 2")
    # The global batch in the micro batch's place.
    as_global = {**GOOD, "train_micro_batch_size_per_gpu": 48, "train_batch_size": 288}
    fails(capsys, checks.check_deepspeed_config([as_global], world_size=2), "comes to 48")
    fails(capsys, checks.check_deepspeed_config([{**GOOD, "gradient_clipping": 1.0}], world_size=2),
          "clips the gradient norm to that")
    # Clipping left to the default: 1.0 from DeepSpeed 0.19.3 on, none before.
    fails(capsys, checks.check_deepspeed_config([{k: v for k, v in GOOD.items() if k != "gradient_clipping"}],
                                                world_size=2), "0.19.3", "older releases do not")
    # Consistent, but not what the exercise asks: no accumulation.
    fails(capsys, checks.check_deepspeed_config([{**GOOD, "gradient_accumulation_steps": 1, "train_batch_size": 16}],
                                                world_size=2), "asks for 3")
    fails(capsys, checks.check_deepspeed_config([{"gradient_accumulation_steps": 3}], world_size=2),
          "needs train_batch_size or train_micro_batch_size_per_gpu")
    fails(capsys, checks.check_deepspeed_config([GOOD], world_size=1), "start 2 or more")
    assert not checks.check_deepspeed_config(None, world_size=2)  # untouched: from_ranks said FAIL


def test_deepspeed_batch_resolves_like_deepspeed(monkeypatch):
    """DeepSpeed's own config class on the same configs, 2 ranks (its rank query answered without a
    process group, so that it asks the world size of `mpu`)."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime.config import DeepSpeedConfig

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *args, **kwargs: 0)

    configs = [GOOD, {"train_batch_size": 48}, {"train_micro_batch_size_per_gpu": 8},
               {"train_batch_size": 48, "train_micro_batch_size_per_gpu": 8},
               {"train_batch_size": 50, "train_micro_batch_size_per_gpu": 8},
               {"train_batch_size": 48, "gradient_accumulation_steps": 5}, {"gradient_accumulation_steps": 2}]
    for config in configs:
        try:
            ours = checks.deepspeed_batch(config, 2)
        except ValueError:
            ours = None
        try:
            resolved = DeepSpeedConfig(dict(config), mpu=_WorldOf(2))
            theirs = (resolved.train_batch_size, resolved.train_micro_batch_size_per_gpu,
                      resolved.gradient_accumulation_steps)
        except AssertionError:
            theirs = None
        assert ours == theirs, config


class _WorldOf:
    """The data-parallel world size DeepSpeedConfig asks its `mpu` for, without a process group."""

    def __init__(self, world_size):
        self.world_size = world_size

    def get_data_parallel_world_size(self):
        return self.world_size

    def get_model_parallel_world_size(self):
        return 1


def test_accumulation_plan_check(capsys):
    def right(micro_steps, accumulation_steps, zero_stage):
        steps = micro_steps // accumulation_steps
        return (micro_steps if zero_stage >= 2 else steps), steps

    assert checks.check_accumulation_plan(right)
    assert "PASS: all 5 cases" in verdict(capsys)
    assert checks.check_accumulation_plan(right, (6, 3, 0, 2, 2))
    assert "as the live ranks did (2 reducing backwards, 2 optimizer steps)" in verdict(capsys)
    fails(capsys, checks.check_accumulation_plan(right, (6, 3, 0, 6, 2)), "the live ranks did 6 and 2")
    fails(capsys, checks.check_accumulation_plan(None), "`plan` is not set")
    # Every micro step reduces, whatever the stage (no accumulation of the communication).
    fails(capsys, checks.check_accumulation_plan(lambda m, a, z: (m, m // a)), "only in a window's last backward")
    # Stage 2 treated like stage 0.
    fails(capsys, checks.check_accumulation_plan(lambda m, a, z: (m // a, m // a)), "from stage 2 on every backward")
    # Every step() counted as an optimizer step.
    fails(capsys, checks.check_accumulation_plan(lambda m, a, z: (m if z >= 2 else m // a, m)),
          "applies the optimizer only at a window's end")
    # An unfinished window counted as a step (rounding up).
    fails(capsys, checks.check_accumulation_plan(lambda m, a, z: (m if z >= 2 else -(-m // a), -(-m // a))),
          "a window left unfinished")
    # Unusual but right: a list of NumPy integers, the windows counted in a loop.
    def counted(micro_steps, accumulation_steps, zero_stage):
        steps = sum(1 for m in range(1, micro_steps + 1) if m % accumulation_steps == 0)
        return [np.int64(micro_steps if zero_stage > 1 else steps), np.int64(steps)]
    assert checks.check_accumulation_plan(counted)
    verdict(capsys)


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


def engine_solution(num_params, world_size, stage):
    share = lambda partitioned: num_params / world_size if partitioned else num_params  # noqa: E731
    return {"params": 4 * share(stage >= 3), "grads": 4 * share(stage >= 2),
            "optimizer": (4 if stage == 0 else 8) * share(stage >= 1)}


def test_engine_bytes_check(capsys):
    def changed(key, value):  # the solution with one part replaced, from stage 1 on
        return lambda n, w, s: {**engine_solution(n, w, s), **({key: value(n, w, s)} if s >= 1 else {})}

    assert checks.check_engine_bytes(engine_solution)
    verdict(capsys)
    # Unusual but right: whole bytes per partition, rounded up as DeepSpeed pads, NumPy integers, a total.
    def padded(num_params, world_size, stage):
        parts = {key: np.int64(math.ceil(value))
                 for key, value in engine_solution(num_params, world_size, stage).items()}
        return {**parts, "total": sum(parts.values())}
    assert checks.check_engine_bytes(padded, world_size=2)
    verdict(capsys)
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
    # Stage 2 left the gradients whole.
    fails(capsys, checks.check_engine_bytes(lambda n, w, s: {**engine_solution(n, w, s), "grads": 4 * n}),
          "stage 2: gradients are partitioned from stage 2")
    # Stage 1 partitioned the gradients too (stage off by one).
    fails(capsys, checks.check_engine_bytes(lambda n, w, s: engine_solution(n, w, min(s + 1, 3) if s else 0)),
          "stage 1: every rank still holds all the gradients")
    fails(capsys, checks.check_engine_bytes(lambda n, w, s: sum(engine_solution(n, w, s).values())), "return a dict")
    fails(capsys, checks.check_engine_bytes(None), "not set")


# ---------------------------------------------------------------- pipeline

def pipeline_tensors():
    from scaledl import models

    torch.manual_seed(0)
    whole = models.torch_cnn()
    x = torch.randn(16, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return whole, x, whole[:6](x), whole(x)


def test_pipeline_check(capsys):
    whole, x, first, full = pipeline_tensors()
    with torch.no_grad():
        assert checks.check_pipeline(first.clone(), whole[6:](first), first, full)
        verdict(capsys)
        # Unusual but right: a GPU's kernels round differently, a few ulps off the CPU's numbers.
        nudged = first * (1 + 1e-6)
        assert checks.check_pipeline(nudged, whole[6:](nudged), first, full)
        verdict(capsys)
        # `logits = full_model(x)` on rank 1 and no send/recv: nothing was received.
        fails(capsys, checks.check_pipeline(None, whole(x), first, full), "rank 1 has no `activations`")
        # A buffer received into, but never filled by rank 0 (torch.empty or zeros).
        zeros = torch.zeros_like(first)
        fails(capsys, checks.check_pipeline(zeros, whole[6:](zeros), first, full), "does not hold rank 0's output")
        # A buffer of the wrong shape.
        fails(capsys, checks.check_pipeline(torch.zeros(16, 32, 14, 14), None, first, full),
              "shape (16, 32, 14, 14)", "(16, 32, 7, 7)")
        # Received right, then the wrong layers run on it.
        fails(capsys, checks.check_pipeline(first.clone(), None, first, full), "no `logits`")
        fails(capsys, checks.check_pipeline(first.clone(), whole[8:](torch.zeros(16, 128)), first, full),
              "differ from the whole model's")


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


def test_exposed_communication_check(capsys):
    def solution(buckets, ranks, alpha, bandwidth, backward):
        each = [ring(b, ranks, alpha, bandwidth) for b in buckets]
        return max(each[-1], sum(each) - backward) if each else 0.0

    def timeline(buckets, ranks, alpha, bandwidth, backward):  # unusual, right: when the last one ends
        each = [ring(b, ranks, alpha, bandwidth) for b in buckets]
        last_starts = max(backward, sum(each[:-1]))  # after backward, and after the buckets before it
        return last_starts + each[-1] - backward

    def no_overlap(buckets, ranks, alpha, bandwidth, backward):
        return sum(ring(b, ranks, alpha, bandwidth) for b in buckets)

    def last_only(buckets, ranks, alpha, bandwidth, backward):
        return ring(buckets[-1], ranks, alpha, bandwidth)

    def no_floor(buckets, ranks, alpha, bandwidth, backward):
        return max(0.0, sum(ring(b, ranks, alpha, bandwidth) for b in buckets) - backward)

    def first_as_last(buckets, ranks, alpha, bandwidth, backward):
        each = [ring(b, ranks, alpha, bandwidth) for b in buckets]
        return max(each[0], sum(each) - backward)

    def half_ring(buckets, ranks, alpha, bandwidth, backward):
        each = [(ranks - 1) * alpha + (ranks - 1) / ranks * b / bandwidth for b in buckets]
        return max(each[-1], sum(each) - backward)

    assert checks.check_exposed(solution)
    verdict(capsys)
    assert checks.check_exposed(timeline)
    verdict(capsys)
    fails(capsys, checks.check_exposed(no_overlap), "every bucket's time")
    fails(capsys, checks.check_exposed(last_only), "only the last bucket")
    fails(capsys, checks.check_exposed(no_floor), "starts only when backward ends")
    fails(capsys, checks.check_exposed(first_as_last), "launch order")
    fails(capsys, checks.check_exposed(half_ring), "2(N-1) alpha")
    fails(capsys, checks.check_exposed(untouched), "NotImplementedError")


@pytest.mark.parametrize("check, args", [
    (checks.check_training_memory, (None, 10)), (checks.check_training_days, (None, 1, 1, 1, 1, 1)),
    (checks.check_samples_per_s, (None,)), (checks.check_sharding, (None,)), (checks.check_efficiency, (None, {1: 1})),
    (checks.check_warmup, (None,)), (checks.check_zero_formula, (None,)), (checks.check_parallelism_choice, (None,)),
    (checks.check_ring_prediction, (None,)), (checks.check_fusion, (None,)), (checks.check_accumulation_plan, (None,)),
    (checks.check_exposed, (None,)), (checks.check_engine_bytes, (None,)),
    (checks.check_stopwatch_prediction, (None,)), (checks.check_ddp_buckets, (None,)),
])
def test_every_check_fails_on_a_name_never_set(check, args, capsys):
    assert check(*args) is False
    assert verdict(capsys).startswith("FAIL: ")


# ---------------------------------------------------------------- FSDP2

LAYERS = ("FSDPConv2d 0", "FSDPConv2d 3", "FSDPLinear 7", "FSDPLinear 9")


def fsdp_report(own=True, at_rest=True, after_forward=False, after_backward=True, loss=2.31):
    """What the lesson's cell reports; the combinations below are those 2 gloo ranks of torch 2.13
    showed for each way of wrapping torch_cnn (per layer with the default, the root alone with
    reshard_after_forward=False, per layer and root with False, set_reshard_after_forward(False))."""
    return {"own_group": dict.fromkeys(LAYERS, own), "at_rest": dict.fromkeys(LAYERS, at_rest),
            "after_forward": dict.fromkeys(LAYERS, after_forward),
            "after_backward": dict.fromkeys(LAYERS, after_backward), "loss": loss}


def test_fsdp_reshard_check(capsys):
    assert checks.check_fsdp_reshard([fsdp_report()] * 2)
    verdict(capsys)
    # Unusual but right: the default wrap, then model.set_reshard_after_forward(False); 4 ranks.
    assert checks.check_fsdp_reshard([fsdp_report()] * 4)
    verdict(capsys)
    # FSDP2's default: every layer reshards after forward, backward gathers it again.
    fails(capsys, checks.check_fsdp_reshard([fsdp_report(after_forward=True)] * 2), "FSDPConv2d 0 gives its",
          "again")
    # Only the root wrapped (with False): one group, nothing to overlap.
    fails(capsys, checks.check_fsdp_reshard([fsdp_report(own=False)] * 2), "not sharded on its own")
    # Not sharded at all (the model left as it was, or wrapped in DDP).
    fails(capsys, checks.check_fsdp_reshard([fsdp_report(own=False, at_rest=False)] * 2), "whole on every rank")
    # Ranks that ran different models on the same batch.
    fails(capsys, checks.check_fsdp_reshard([fsdp_report(), fsdp_report(loss=2.4)]), "different losses")
    fails(capsys, checks.check_fsdp_reshard([fsdp_report()]), "start 2 or more")
    fails(capsys, checks.check_fsdp_reshard([None, None]), "did not finish")
    assert not checks.check_fsdp_reshard(None)


# ---------------------------------------------------------------- lesson 0

def polaris_launch(wrapper: bool):
    """Where the 4 ranks of a `--depth 8 --cpu-bind depth` launch land on the recorded Polaris
    tree, with ALCF's `CUDA_VISIBLE_DEVICES = 3 - local_rank` wrapper or with every GPU visible."""

    from scaledl.hpc import binding

    root = DATA / "sysfs" / "polaris"
    command = ["mpiexec", "-n", "4", "--ppn", "4", "--depth", "8", "--cpu-bind", "depth", "python", "train.py"]
    if wrapper:
        command[-2:-2] = ["bash", "-c", 'export CUDA_VISIBLE_DEVICES=$((3 - PALS_LOCAL_RANKID)); exec "$@"', "bind"]
    gpu_nodes = binding.gpu_numa_nodes(root, "cuda")
    return binding.plan(command, {}, "cuda", 4, root), gpu_nodes


def test_binding_prediction_check(capsys):
    placements, gpu_nodes = polaris_launch(wrapper=True)
    right = {0: (3, 0), 1: (2, 1), 2: (1, 2), 3: (0, 3)}
    assert checks.check_binding_prediction(right, placements, gpu_nodes)
    assert "0->GPU 3" in verdict(capsys)
    # Unusual but right: GPUs by PCI address, lists instead of tuples, numpy integers.
    unusual = {int(r): [address.upper(), np.int64(node)] for r, (address, node) in
               enumerate(sorted(gpu_nodes.items(), key=lambda item: item[1]))}  # rank r: the GPU on NUMA node r
    assert checks.check_binding_prediction(unusual, placements, gpu_nodes)
    verdict(capsys)
    # The guess most people make first: rank r on GPU r, on NUMA node r.
    fails(capsys, checks.check_binding_prediction({r: (r, r) for r in range(4)}, placements, gpu_nodes),
          "local rank 0 does not drive GPU 0", "cuda:<local_rank>", "NUMA node 3")
    # The right GPUs, each given the NUMA node of its number.
    fails(capsys, checks.check_binding_prediction({r: (3 - r, 3 - r) for r in range(4)}, placements, gpu_nodes),
          "GPU 3 sits on NUMA node 0, not 3")
    # Off by one: 4 - r.
    fails(capsys, checks.check_binding_prediction({r: (4 - r, r) for r in range(4)}, placements, gpu_nodes),
          "does not drive GPU 4", "GPUs 0-3")
    # A launch with every GPU visible (cuda:<local_rank>) fails even with a prediction that matches it.
    identity, _ = polaris_launch(wrapper=False)
    assert [p.verdict for p in identity] == ["far"] * 4
    fails(capsys, checks.check_binding_prediction({r: (r, 3 - r) for r in range(4)}, identity, gpu_nodes),
          "local rank 0 on NUMA node 0 with a GPU on NUMA node 3 (far)")
    fails(capsys, checks.check_binding_prediction({0: (3, 0)}, placements, gpu_nodes), "every local rank 0-3")
    fails(capsys, checks.check_binding_prediction(None, placements, gpu_nodes), "`prediction` is not set")


# ---------------------------------------------------------------- lesson 6: DDP's buckets

def learner_buckets(order=-1, default_first=2**20, strict=False, unit=2**20, frozen=False, per_element=False,
                    horovod=False):
    """A learner's predict_buckets, written out as one would, with one of the usual mistakes."""
    def predict(model, bucket_cap_mb=None):
        caps = [default_first, 25 * unit] if bucket_cap_mb is None else [int(bucket_cap_mb * unit)] * 2
        buckets, names, size = [], [], 0
        for name, p in list(model.named_parameters())[::order]:
            if not p.requires_grad and not frozen:
                continue
            nbytes = p.numel() if per_element else p.numel() * p.element_size()
            cap = caps[min(len(buckets), 1)]
            if horovod and names and size + nbytes > cap:
                buckets.append(names)
                names, size = [], 0
            names.append(name)
            size += nbytes
            if not horovod and (size > cap if strict else size >= cap):
                buckets.append(names)
                names, size = [], 0
        return buckets + ([names] if names else [])
    return predict


def test_bucket_check_names_each_wrong_rule(capsys):
    assert checks.check_ddp_buckets(learner_buckets())
    verdict(capsys)
    fails(capsys, checks.check_ddp_buckets(learner_buckets(order=1)), "last layer first", "bucket_cap_mb=1")
    fails(capsys, checks.check_ddp_buckets(learner_buckets(default_first=25 * 2**20)), "first bucket is smaller")
    fails(capsys, checks.check_ddp_buckets(learner_buckets(strict=True)), "reach the cap", "512x512")
    fails(capsys, checks.check_ddp_buckets(learner_buckets(unit=10**6)), "1024 * 1024")
    fails(capsys, checks.check_ddp_buckets(learner_buckets(frozen=True)), "requires_grad=False")
    fails(capsys, checks.check_ddp_buckets(learner_buckets(per_element=True)), "4 bytes per element")
    fails(capsys, checks.check_ddp_buckets(learner_buckets(horovod=True)), "Horovod's fusion")
    fails(capsys, checks.check_ddp_buckets(lambda model, cap: [[n for n, _ in model.named_parameters()][::-1]]),
          "you made", "DDP makes")
    fails(capsys, checks.check_ddp_buckets(lambda model, cap: 1 / 0), "ZeroDivisionError")

    def untouched(model, bucket_cap_mb=None):
        raise NotImplementedError
    fails(capsys, checks.check_ddp_buckets(untouched), "NotImplementedError")


def test_bucket_check_takes_an_unusual_right_answer(capsys):
    """Tuples, a running total kept in a list, the caps worked out per bucket: still DDP's buckets."""
    import itertools

    def predict(model, bucket_cap_mb=None):
        sizes = [(n, p.nelement() * p.element_size()) for n, p in reversed(list(model.named_parameters()))
                 if p.requires_grad]
        out, current = [], []
        for name, nbytes in sizes:
            current.append((name, nbytes))
            cap = (2**20 if not out else 25 * 2**20) if bucket_cap_mb is None else bucket_cap_mb * 1024 * 1024
            if sum(b for _, b in current) >= cap:
                out.append(tuple(n for n, _ in current))
                current = []
        return out + [tuple(n for n, _ in current)] * bool(current) + list(itertools.islice([], 0))
    assert checks.check_ddp_buckets(predict)
    assert verdict(capsys).startswith("PASS: ")


def polaris_ranks(ranks: int, cpu_bind: str, depth: int = 16):
    """A launch of `ranks` ranks a node with ALCF's wrapper and the learner's --cpu-bind, on the recorded tree."""

    from scaledl.hpc import binding

    root = DATA / "sysfs" / "polaris"
    command = ["mpiexec", "-n", str(ranks), "--ppn", str(ranks), "--depth", str(depth), "--cpu-bind", cpu_bind,
               "bash", "-c", 'export CUDA_VISIBLE_DEVICES=$((3 - PALS_LOCAL_RANKID % 4)); exec "$@"', "bind",
               "python", "train.py"]
    return binding.plan(command, {}, "cuda", ranks, root)


def test_binding_verdicts_check(capsys):
    # rank 0 on NUMA nodes 0-1 with GPU 3 (node 0), rank 1 on 2-3 with GPU 2 (node 1)
    depth_16 = polaris_ranks(2, "depth")
    assert checks.check_binding_verdicts({0: "split", 1: "far"}, depth_16)
    assert "local rank 1: far" in verdict(capsys)
    # Unusual but right: digit strings for the ranks, capitals and spaces in the words.
    assert checks.check_binding_verdicts({"0": " Split", "1": "FAR"}, depth_16)
    verdict(capsys)
    # The first guess (depth binding keeps each rank by its GPU), the two swapped, the same for both.
    fails(capsys, checks.check_binding_verdicts({0: "local", 1: "local"}, depth_16), "local rank 0 is not local",
          "NUMA nodes its 16 cores span")
    fails(capsys, checks.check_binding_verdicts({0: "far", 1: "split"}, depth_16), "local rank 0 is not far")
    fails(capsys, checks.check_binding_verdicts({0: "split", 1: "split"}, depth_16), "local rank 1 is not split")
    fails(capsys, checks.check_binding_verdicts({0: "split"}, depth_16), "1 missing")
    fails(capsys, checks.check_binding_verdicts({0: "half", 1: "far"}, depth_16), "'half' is not a verdict")
    fails(capsys, checks.check_binding_verdicts(["split", "far"], depth_16), "is a dict")
    fails(capsys, checks.check_binding_verdicts({}, depth_16), "`VERDICTS` is not set")
    # ALCF's own --depth 8 on 2 ranks: both local, and a verdict of "split" is then wrong.
    assert checks.check_binding_verdicts({0: "local", 1: "local"}, polaris_ranks(2, "depth", depth=8))
    verdict(capsys)


def test_binding_launch_check(capsys):
    assert checks.check_binding_launch(polaris_ranks(2, "list:0-7:8-15"))
    assert "rank 1: CPUs 8-15" in verdict(capsys)
    # Unusual but right: the cores' second hardware threads only, and a whole NUMA node with them.
    assert checks.check_binding_launch(polaris_ranks(2, "list:32-39:40-47"))
    verdict(capsys)
    assert checks.check_binding_launch(polaris_ranks(2, "list:0-7,32-39:8-15,40-47"))
    verdict(capsys)
    # The first guess, 16 cores deep: rank 0 split over NUMA nodes 0-1, rank 1 far on 2-3.
    fails(capsys, checks.check_binding_launch(polaris_ranks(2, "depth")), "local rank 0", "(split)", "NUMA node 0 only")
    fails(capsys, checks.check_binding_launch(polaris_ranks(2, "list:8-15:0-7")), "(far)", "NUMA node 0 only")
    fails(capsys, checks.check_binding_launch(polaris_ranks(2, "none")), "(split)")
    fails(capsys, checks.check_binding_launch(polaris_ranks(2, "list:0:8")), "1 CPU", "at least 8 of its NUMA")
    fails(capsys, checks.check_binding_launch(polaris_ranks(2, "list:0-3:8-11")), "4 CPUs")
    # 8 ranks, two to a GPU (the wrapper's r % 4): each local, but ranks r and r + 4 on the same cores.
    fails(capsys, checks.check_binding_launch(polaris_ranks(8, "list:0-7:8-15:16-23:24-31:0-7:8-15:16-23:24-31")),
          "share CPUs")
    fails(capsys, checks.check_binding_launch([]), "`CPU_BIND` is not set")
