"""Checks for the exercises: each says in one line what is right, or what is wrong and how to fix it.

A check returns True/False and prints its verdict, so a notebook cell can call it after the
learner's code and the tests can feed it right and wrong answers alike.  Every check FAILs on
what an untouched exercise leaves behind (a name never set, a NotImplementedError).
"""
from __future__ import annotations

import math

from scaledl import async_timeline


def _verdict(ok: bool, message: str) -> bool:
    print(("PASS: " if ok else "FAIL: ") + message)
    return ok


def _unfinished(name: str) -> bool:
    return _verdict(False, f"`{name}` is not set: finish the exercise cell above and run it")


def from_ranks(view, name: str) -> list | None:
    """`name` as every rank of an ipyparallel view holds it, or None (with a FAIL line) when
    the exercise cell that sets it has not run to the end on every rank."""
    try:
        return view.pull(name, block=True)
    except Exception:  # ipyparallel wraps the engines' NameError in a CompositeError
        _verdict(False, f"`{name}` is not set on every rank: finish the exercise cell above and run it")
        return None


def gather(view, expression: str) -> list:
    """`expression` evaluated on every rank, in rank order; None on a rank where it fails (a name
    the exercise never set), so a check can say which part is missing."""
    view.execute(f"try:\n    _grader_value = {expression}\nexcept Exception:\n    _grader_value = None", block=True)
    return view.pull("_grader_value", block=True)


# ----------------------------------------------------------------------------- lesson 1

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


# ----------------------------------------------------------------------------- lesson 2

# The device that check_samples_per_s times, in real time, and that lesson 2's figure and
# check_stopwatch_prediction run in simulated time: one model of the queue for all three.
SimulatedDevice = async_timeline.SimulatedDevice


def check_samples_per_s(samples_per_s, batch_size: int = 64, num_steps: int = 5, warmup_steps: int = 3) -> bool:
    """Run the learner's `samples_per_s(step, batch_size, synchronize, num_steps, warmup_steps)`
    on a simulated device whose true rate is known.  Few timed steps of 40 ms each: one step
    too many or too few counted is 17 to 25% off, the noise of sleeping a few percent."""
    if samples_per_s is None:
        return _unfinished("samples_per_s")
    device = SimulatedDevice(step_s=0.04, warmup_steps=2, warmup_s=0.15)
    try:
        got = samples_per_s(device.step, batch_size, device.synchronize, num_steps=num_steps,
                            warmup_steps=warmup_steps)
    except NotImplementedError:
        return _verdict(False, "samples_per_s still raises NotImplementedError: finish the exercise cell")
    want = batch_size / device.step_s
    if device.steps != num_steps + warmup_steps:
        return _verdict(False, f"it ran {device.steps} steps for warmup_steps={warmup_steps} and "
                               f"num_steps={num_steps}: run the warm-up steps, then exactly num_steps timed ones")
    if not isinstance(got, (int, float)) or not got > 0:
        return _verdict(False, f"it returned {got!r}: return samples per second, a positive number")
    if any(math.isclose(got, seconds, rel_tol=0.15) for seconds in (num_steps * device.step_s, device.step_s)):
        return _verdict(False, f"{got:.3g} looks like seconds: return samples per second")
    if got > 3 * want:
        return _verdict(False, f"{got:,.0f} samples/s, faster than the device can go ({want:,.0f}): the clock "
                               "stopped before the queued work finished: synchronize before reading it")
    if got < 0.7 * want:
        return _verdict(False, f"{got:,.0f} samples/s, well below the steady {want:,.0f}: the slow first steps are "
                               "in the timing: start the clock after the warm-up (and synchronize there too)")
    # One step off, either way: n +- 1 steps' samples over n timed, or n over n +- 1 timed.
    if any(abs(got / want - ratio) < 0.05 for ratio in ((num_steps - 1) / num_steps, (num_steps + 1) / num_steps,
                                                          num_steps / (num_steps - 1), num_steps / (num_steps + 1))):
        return _verdict(False, f"{got:,.0f} samples/s, {got / want:.0%} of the true {want:,.0f}: one step off: the "
                               f"clock must cover exactly the {num_steps} timed steps, and count their samples")
    if not 0.9 < got / want < 1.1:
        return _verdict(False, f"{got:,.0f} samples/s, expected {want:,.0f}: count only the samples of the timed "
                               "steps, and stop the clock after the device has finished them")
    return _verdict(True, "within 10% of the simulated device's true rate: warm-up left out, the device "
                          "synchronized before each clock reading")


# (launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize): GPU-bound and launch-bound,
# with and without synchronize, warm-up steps that a count can wrongly take in, and one step alone.
_STOPWATCH_CASES = [(0.001, 0.004, 64, 4, 2, True), (0.003, 0.001, 32, 5, 3, True),
                    (0.0005, 0.005, 128, 10, 2, False), (0.003, 0.001, 32, 5, 3, False),
                    (0.002, 0.0015, 16, 1, 1, True)]


def _stopwatch_slips(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize) -> list:
    """(samples/s, what went wrong) for the wrong predictions learners make, in the order they
    are told apart."""
    L, D, B, n, w = launch_s, device_s, batch_size, num_steps, warmup_steps

    def seconds(steps: int, sync: bool) -> float:  # the closed form of async_timeline.stopwatch
        return L + D + (steps - 1) * max(L, D) if sync else steps * L

    drain = ("that is the host's pace: with synchronize the clock also waits while the device runs "
             "what is still queued")
    warm = ("the warm-up steps run before the clock starts (and are synchronized): they are in neither "
            "the time nor the samples")
    one_off = ("one step off: the clock runs from the first timed launch to the moment it is read, "
               "over exactly num_steps steps' samples")
    if not synchronize:
        slips = [(n * B / seconds(n, True), "that is the reading after synchronize: without it the clock stops as "
                                            "soon as the host has launched the last step"),
                 (B / D, "that is the device's pace: without synchronize the clock never waits for the device"),
                 (B / (L + D), "the host does not wait for each step to run: it only launches them")]
    else:
        slips = [(B / L, drain if D > L else "the host's pace, but the clock also waits for the last step to run "
                                           "on the device"),
                 (B / D, "the device's pace, but the clock also holds the first launch, before the device has "
                         "anything to run" if D > L else
                         "the device is faster than the host feeds it: it waits between steps, so the "
                         "launches set the pace"),
                 (n * B / (L + n * D), "the device waits for each launch: where launching takes longer than "
                                       "running, the launches set the pace"),
                 (B / max(L, D), "that is the pace in between: the clock also holds the first launch (the "
                                 "device has nothing to run yet) and the last run (the host has nothing left "
                                 "to launch)"),
                 (B / (L + D), "the host does not wait for the device between steps: it launches the next "
                               "step while the device runs the last one")]
    if w:
        slips += [((n + w) * B / seconds(n + w, synchronize), warm), ((n + w) * B / seconds(n, synchronize), warm),
                  (n * B / seconds(n + w, synchronize), warm)]
    slips += [(steps * B / seconds(timed, synchronize), one_off)
              for steps, timed in ((n, n + 1), (n, n - 1), (n + 1, n), (n - 1, n)) if timed > 0]
    if synchronize:
        slips += [(n * B / (n * max(L, D) + D), "the device cannot start before the first launch is done"),
                  (n * B / (L + n * max(L, D)), "the last step runs on the device after the host has launched it")]
    return slips


def check_stopwatch_prediction(predict) -> bool:
    """`predict(launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize) -> samples/s`,
    what lesson 2's stopwatch reads on a device that queues work, against the reading of that
    stopwatch run on `async_timeline.SimulatedDevice` in simulated time (exact, no noise)."""
    if predict is None:
        return _unfinished("stopwatch_reads")
    for case in _STOPWATCH_CASES:
        launch_s, device_s, batch_size, num_steps, warmup_steps, synchronize = case
        where = (f"launch {launch_s * 1e3:g} ms, device {device_s * 1e3:g} ms, {num_steps} steps of {batch_size} "
                 f"after {warmup_steps} warm-up, synchronize={synchronize}")
        try:
            raw = predict(*case)
        except NotImplementedError:
            return _verdict(False, "stopwatch_reads still raises NotImplementedError: finish the exercise cell")
        except Exception as error:  # a learner's error, reported in one line
            return _verdict(False, f"{where}: stopwatch_reads raised {type(error).__name__}: "
                                   f"{(str(error).splitlines() or [''])[0]}")
        try:
            got = math.nan if isinstance(raw, bool) else float(raw)
        except (TypeError, ValueError):
            got = math.nan
        if not 0 < got < math.inf:
            return _verdict(False, f"{where}: it returned {raw!r}: return samples per second, a positive number")
        reading = async_timeline.stopwatch(launch_s, device_s, num_steps, warmup_steps=warmup_steps)
        want = reading.samples_per_s(batch_size, synchronize)
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        if got < 1:
            hint = "that looks like seconds: return samples per second"
        elif math.isclose(got * 1e3, want, rel_tol=1e-6):
            hint = "that is samples per millisecond: launch_s and device_s are in seconds"
        else:
            hint = next((message for value, message in _stopwatch_slips(*case)
                         if math.isclose(got, value, rel_tol=1e-6)),
                        "follow the first and the last timed step through the figure: when does the clock stop?")
        shown = f"{got:.3g}" if got < 1 else f"{got:,.0f} samples/s"
        return _verdict(False, f"{where}: {shown}, the stopwatch reads {want:,.0f} samples/s: {hint}")
    return _verdict(True, f"all {len(_STOPWATCH_CASES)} cases: without synchronize the clock reads the host's "
                          "launches; with it, the queue drains first; the warm-up stays outside the clock")


# ----------------------------------------------------------------------------- lesson 3

def check_all_reduce(values_by_rank: list, world_size: int) -> bool:
    """After all_reduce(SUM) of rank + 1 every rank holds 1 + 2 + ... + world_size."""
    if values_by_rank is None:
        return False
    if world_size < 2:
        return _verdict(False, "one rank cannot tell a sum from its own value: start 2 or more (WORLD_SIZE = 2)")
    expected = world_size * (world_size + 1) / 2
    values = [float(v) for v in values_by_rank]
    wrong = [(rank, v) for rank, v in enumerate(values) if v != expected]
    if not wrong:
        return _verdict(True, f"every rank holds {expected:g}, the sum over all ranks")
    rank, value = wrong[0]
    if values[0] == expected and value == rank + 1:
        hint = "only rank 0 holds the sum: a reduce delivers to one rank, and every rank needs it"
    elif value == rank + 1:
        hint = "it still holds its own value: every rank must take part in the collective"
    elif value == world_size:
        hint = "that is the largest value: the reduce op must be a sum"
    elif value == (world_size + 1) / 2:
        hint = "that is the average: this exercise wants the sum (the default op)"
    else:
        hint = "check the reduce op (a sum) and that every rank takes part"
    return _verdict(False, f"rank {rank} holds {value:g}, expected {expected:g}: {hint}")


def check_sharding(shard, num_samples: int = 20, nodes: int = 2, ranks_per_node: int = 3) -> bool:
    """`shard(num_samples, rank, local_rank, world_size) -> indices`, run for every rank of a
    simulated job of `nodes` nodes, on a number of samples the world size does not divide:
    every sample exactly once across all ranks, except what DistributedSampler does to give
    every rank as many samples (it repeats fewer than world_size of them, or with drop_last
    leaves fewer than world_size out)."""
    if shard is None:
        return _unfinished("shard")
    world_size = nodes * ranks_per_node
    by_rank = []
    for rank in range(world_size):
        try:
            by_rank.append([int(i) for i in shard(num_samples, rank, rank % ranks_per_node, world_size)])
        except NotImplementedError:
            return _verdict(False, "shard still raises NotImplementedError: finish the exercise cell")
        except Exception as error:  # a learner's error, reported in one line
            message = (str(error).splitlines() or [""])[0]
            return _verdict(False, f"shard(num_samples={num_samples}, rank={rank}, local_rank={rank % ranks_per_node}, "
                                   f"world_size={world_size}) raised {type(error).__name__}: {message}")
    where = f"on {nodes} nodes x {ranks_per_node} ranks, {num_samples} samples"
    owners: dict[int, list[int]] = {}
    for rank, indices in enumerate(by_rank):
        for index in indices:
            owners.setdefault(index, []).append(rank)
    strays = sorted(set(owners) - set(range(num_samples)))
    if strays:
        return _verdict(False, f"{where}: index {strays[0]} is not a sample (0 to {num_samples - 1})")
    sizes = {len(indices) for indices in by_rank}
    repeats = sum(len(ranks) - 1 for ranks in owners.values())
    missing = sorted(set(range(num_samples)) - set(owners))
    padded = repeats < world_size and len(sizes) == 1  # DistributedSampler evens out the ranks
    if repeats and not padded:
        pairs = [(index, a, b) for index, ranks in sorted(owners.items()) for a in ranks for b in ranks if a < b]
        # Name a pair of ranks with the same local rank when there is one: that is the usual mistake.
        index, first, second = next((pair for pair in pairs if pair[1] % ranks_per_node == pair[2] % ranks_per_node),
                                    pairs[0])
        ranks = [first, second]
        same_local = first % ranks_per_node == second % ranks_per_node
        hint = ("you sharded by local rank, which repeats on every node: use the global rank" if same_local
                else "each rank needs its own place: the global rank among world_size ranks")
        return _verdict(False, f"{where}: ranks {ranks[0]} and {ranks[1]} both get sample {index}: {hint}")
    if missing and not (not repeats and len(missing) < world_size and len(sizes) == 1):
        return _verdict(False, f"{where}: {len(missing)} samples are never seen (first: {missing[0]}): together "
                               "the shards must cover the data: one shard per rank of the whole job (world_size)")
    if repeats:
        said = (f"every sample goes to one rank, {repeats} also to a second so that every rank gets {sizes.pop()} "
                "(DistributedSampler's padding)")
    elif missing:
        said = f"no sample goes to two ranks; {len(missing)} are left out of the epoch so that every rank gets " \
               f"{sizes.pop()} (drop_last)"
    elif len(sizes) > 1:
        said = (f"each sample goes to exactly one rank (ranks get {min(sizes)} to {max(sizes)}: DistributedSampler "
                "pads instead, so that every rank runs the same number of steps)")
    else:
        said = "each sample goes to exactly one rank"
    return _verdict(True, f"{where}: {said}")



def ring_allreduce_s(nbytes: float, world_size: int, alpha: float, beta: float) -> float:
    """The ring all-reduce's time: 2(p-1) messages of latency alpha, and 2(p-1)/p of the n bytes
    through each rank's link at beta bytes/s (Patarasuk and Yuan, 2009; Thakur et al., 2005)."""
    p = world_size
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / beta


# (bytes, ranks, alpha s, beta bytes/s): 8 and 3 ranks so that 2(p-1)/p is neither 1 nor 2, a latency
# large enough to see, a bandwidth that is not 1.
_RING_CASES = [(100e6, 8, 50e-6, 10e9), (1e3, 8, 50e-6, 10e9), (64e6, 3, 5e-6, 200e9), (1e9, 64, 10e-6, 25e9)]


def check_ring_prediction(predict) -> bool:
    """`predict(nbytes, world_size, alpha, beta) -> seconds`, the ring all-reduce's cost model,
    against the formula on cases where a half-ring (p-1 steps), a missing 2(p-1)/p, or beta used
    as seconds per byte differ.  (The lesson puts the prediction beside a measured time itself:
    a verdict holds no number that changes from run to run.)"""
    if predict is None:
        return _unfinished("predict")
    for nbytes, p, alpha, beta in _RING_CASES:
        case = f"{nbytes:,.0f} bytes on {p} ranks, alpha {alpha * 1e6:g} us, beta {beta / 1e9:g} GB/s"
        try:
            got = float(predict(nbytes, p, alpha, beta))
        except NotImplementedError:
            return _verdict(False, "predict still raises NotImplementedError: finish the exercise cell")
        except Exception as error:  # a learner's error, reported in one line
            return _verdict(False, f"{case}: predict raised {type(error).__name__}: "
                                   f"{(str(error).splitlines() or [''])[0]}")
        want = ring_allreduce_s(nbytes, p, alpha, beta)
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        latency, bandwidth = 2 * (p - 1) * alpha, 2 * (p - 1) / p * nbytes / beta
        slips = [(latency / 2 + bandwidth / 2, "that is half the ring: a reduce-scatter and an all-gather, "
                                               "p-1 steps each"),
                 (latency / 2 + bandwidth, "the latency counts p-1 messages: each half of the ring sends p-1"),
                 (latency + nbytes / beta, "each rank sends 2(p-1)/p of the bytes, not the buffer once"),
                 (latency + 2 * nbytes / beta, "each rank sends 2(p-1)/p of the bytes: a chunk of n/p per step"),
                 (latency + 2 * (p - 1) / p * nbytes * beta, "beta is bytes per second: divide the bytes by it"),
                 (bandwidth, "the latency term is missing: 2(p-1) messages, alpha each"),
                 (latency, "the bandwidth term is missing: 2(p-1)/p n bytes at beta bytes/s"),
                 (2 * p * alpha + 2 * nbytes / beta, "count p-1 steps per half, not p")]
        hint = next((message for value, message in slips if math.isclose(got, value, rel_tol=1e-6)),
                    "t = 2(p-1) alpha + 2(p-1)/p n / beta")
        return _verdict(False, f"{case}: {got * 1e3:.4g} ms, expected {want * 1e3:.4g} ms: {hint}")
    return _verdict(True, "the ring's cost model on 3, 8 and 64 ranks: 2(p-1) latencies and 2(p-1)/p of the bytes "
                          "through each rank's link")


# ----------------------------------------------------------------------------- data parallelism

_IN_SYNC_FIXES = {
    "ddp": "wrap the model in DDP before the first step (it broadcasts rank 0's weights and averages gradients)",
    "deepspeed": "train through the engine deepspeed.initialize returned: engine(x), engine.backward, engine.step",
}


def check_in_sync(fingerprints_by_rank: list, framework: str = "ddp") -> bool:
    """After a data-parallel step every rank must hold bit-identical parameters."""
    if fingerprints_by_rank is None:
        return False
    if len(fingerprints_by_rank) < 2:  # one rank agrees with itself whatever the code does
        return _verdict(False, "one rank has nobody to agree with: start 2 or more (WORLD_SIZE = 2)")
    if any(f is None for f in fingerprints_by_rank):
        return _verdict(False, "the training cell did not finish on every rank: finish the exercise and run it")
    if len(set(fingerprints_by_rank)) == 1:
        return _verdict(True, f"all {len(fingerprints_by_rank)} ranks hold identical parameters")
    differing = [rank for rank, f in enumerate(fingerprints_by_rank) if f != fingerprints_by_rank[0]]
    return _verdict(False, f"rank {differing[0]} holds different parameters than rank 0: {_IN_SYNC_FIXES[framework]}")


# Where Horovod's broadcast belongs and what averages the gradients, per framework: TensorFlow
# broadcasts after the first step (the optimizer makes its variables then), PyTorch before it.
_HOROVOD_FIXES = {
    "tf": ("after the first step",
           "broadcast rank 0's model variables after the first step (hvd.broadcast_variables)",
           "broadcast the optimizer's variables too (optimizer.variables), not only the model's",
           "average the gradients: wrap the tape in hvd.DistributedGradientTape"),
    "torch": ("before the first step",
              "broadcast rank 0's parameters before training (hvd.broadcast_parameters)",
              "broadcast rank 0's optimizer state too (hvd.broadcast_optimizer_state)",
              "average the gradients: wrap the optimizer in hvd.DistributedOptimizer"),
}


def check_horovod_sync(fingerprints_by_rank: list, framework: str, errors_by_rank: list | None = None,
                       tolerance: float = 1e-5) -> bool:
    """Horovod's duties, checked apart.  Each rank gives [weights at the start, optimizer state at
    the start, weights after the last step]: equal starts need the two broadcasts, equal ends the
    averaged gradients.  (Two entries, [start, end], check the weights alone.)

    Equal is not enough: summed gradients keep the ranks equal too.  `errors_by_rank` holds, per
    rank, {"average": largest difference of its trained weights from one process that took the
    same steps on the global batch (every rank's micro batches) from the same start, "sum": the
    same against that process with its gradients multiplied by world_size}: the weights must
    match the first within `tolerance`."""
    if fingerprints_by_rank is None:
        return False
    if len(fingerprints_by_rank) < 2:
        return _verdict(False, "one rank has nobody to agree with: start 2 or more (WORLD_SIZE = 2)")
    if any(len(f) < 2 or None in f for f in fingerprints_by_rank):
        return _verdict(False, "the training cell did not finish on every rank: finish the exercise above and "
                               "run both cells")
    when, weights_hint, optimizer_hint, average_hint = _HOROVOD_FIXES[framework]
    checks = [(0, f"weights {when}", weights_hint)]
    if len(fingerprints_by_rank[0]) > 2:
        checks.append((1, f"optimizer state (momentum) {when}", optimizer_hint))
    checks.append((-1, "weights after the last step", average_hint))
    for index, what, hint in checks:
        differing = [rank for rank, f in enumerate(fingerprints_by_rank) if f[index] != fingerprints_by_rank[0][index]]
        if differing:
            return _verdict(False, f"rank {differing[0]} holds different {what} than rank 0: {hint}")
    if errors_by_rank is None:
        return _verdict(True, f"all {len(fingerprints_by_rank)} ranks start from rank 0's weights and optimizer "
                              "state and stay identical after every step")
    if any(e is None for e in errors_by_rank):
        return _verdict(False, "the reference cell did not finish on every rank: run the cells above in order")
    world_size = len(fingerprints_by_rank)
    worst = max(errors_by_rank, key=lambda e: e["average"])
    if worst["average"] > tolerance:
        if worst.get("sum", math.inf) <= tolerance:
            return _verdict(False, f"the ranks agree, and end where one process with {world_size}x its gradients does: "
                                   "the gradients were summed over ranks: leave the reduction at Horovod's default")
        return _verdict(False, f"the ranks agree, but their weights differ from one process's steps on the global "
                               f"batch by {worst['average']:.2g}: average the gradients over ranks, nothing more")
    return _verdict(True, f"all {world_size} ranks start from rank 0's weights and optimizer state, stay identical, "
                          f"and end where one process on the global batch does (within {tolerance:g})")


def check_horovod_allreduce(results_by_rank: list, world_size: int) -> bool:
    """Each rank all-reduces rank + 1 twice: (total with op=hvd.Sum, average with the default)."""
    if results_by_rank is None:
        return False
    want_total, want_average = world_size * (world_size + 1) / 2, (world_size + 1) / 2
    for rank, (total, average) in enumerate(results_by_rank):
        total, average = float(total), float(average)
        if total != want_total:
            hint = ("Horovod averages unless told otherwise: ask for a sum" if total == want_average
                    else "it still holds its own value: all-reduce it, on every rank" if total == rank + 1
                    else "sum it, on every rank")
            return _verdict(False, f"rank {rank}: total is {total:g}, expected {want_total:g}: {hint}")
        if average != want_average:
            hint = ("that is the sum: leave the op at its default, the average" if average == want_total
                    else "it still holds its own value: all-reduce it, on every rank" if average == rank + 1
                    else "average it (the default op), on every rank")
            return _verdict(False, f"rank {rank}: average is {average:g}, expected {want_average:g}: {hint}")
    return _verdict(True, f"every rank holds the sum {want_total:g} and the average {want_average:g}")


def check_accumulation(reports_by_rank: list, accumulation_steps: int, tolerance: float = 1e-5) -> bool:
    """DDP gradient accumulation.  Each rank reports {"max_error": largest difference of its
    weights from one SGD step on the big batch (all ranks' micro batches), "all_reduces": bucket
    all-reduces in the window, "buckets": all-reduces one synchronized backward makes}, and
    optionally the same difference from a step of accumulation_steps x lr ("error_unscaled": the
    micro losses were not divided) and of lr / world_size ("error_over_ranks": divided by the
    ranks too, which DDP's average already does)."""
    if reports_by_rank is None:
        return False
    if len(reports_by_rank) < 2:  # one rank: no all-reduce to skip, no other rank's samples to match
        return _verdict(False, "one rank has nothing to synchronize with: start 2 or more (WORLD_SIZE = 2)")
    if any(r is None for r in reports_by_rank):
        return _verdict(False, "the accumulation cell did not finish on every rank: finish the exercise and run it")
    buckets = reports_by_rank[0]["buckets"]
    calls = max(r["all_reduces"] for r in reports_by_rank)
    if min(r["all_reduces"] for r in reports_by_rank) == 0:
        return _verdict(False, "no gradient was all-reduced in the window: the last micro batch's backward must "
                               "synchronize, or the ranks drift apart")
    if calls > buckets:
        return _verdict(False, f"{calls} all-reduces in a window of {accumulation_steps} micro batches, "
                               f"{calls / buckets:g} backwards' worth: skip the synchronization on all but the last "
                               "micro batch (DDP has a context manager for it; the forward belongs inside it too)")
    worst = max(reports_by_rank, key=lambda r: r["max_error"])
    error = worst["max_error"]
    if not error < tolerance:
        world_size = len(reports_by_rank)
        if worst.get("error_unscaled", math.inf) < tolerance:
            hint = (f"the step is {accumulation_steps}x too large: divide each micro batch's loss by "
                    f"{accumulation_steps}, so that the window's gradient is the mean over its samples")
        elif worst.get("error_over_ranks", math.inf) < tolerance:
            hint = (f"the step is {world_size}x too small: DDP already averages over the ranks, so divide each "
                    f"micro batch's loss by the accumulation steps ({accumulation_steps}) only")
        else:
            hint = ("one all-reduce, but not of the whole window: the synchronized backward must be the last, "
                    f"after the other micro batches accumulated; each loss divided by {accumulation_steps}, "
                    "one optimizer step per window")
        return _verdict(False, f"the weights differ from one big-batch step by {error:.2g}: {hint}")
    return _verdict(True, f"one all-reduce per window ({buckets} bucket{'s' * (buckets != 1)}) and the same weights "
                          f"as one step on the {accumulation_steps}x larger batch of all {len(reports_by_rank)} ranks")


def _bucket_models() -> list:
    """(description, model, bucket_cap_mb) cases where the usual wrong rules give other buckets than DDP's:
    a bucket that reaches its cap exactly, caps in MiB that 10**6 bytes do not reach, the default caps
    (a 1 MiB first bucket, 25 MiB after it) on a model of 8 MB, and a frozen layer."""
    import torch.nn as nn

    from scaledl import models

    def linears(*sizes, bias=True):
        return nn.Sequential(*[nn.Linear(n_in, n_out, bias=bias) for n_in, n_out in zip(sizes, sizes[1:])])

    frozen = models.torch_cnn(width=16)
    frozen[0].requires_grad_(False)
    return [("the lesson's CNN (width 64) with bucket_cap_mb=1", models.torch_cnn(width=64), 1),
            ("3 bias-free 512x512 layers (1 MiB each) with bucket_cap_mb=1",
             linears(512, 512, 512, 512, bias=False), 1),
            ("2 bias-free 500x500 layers (10**6 B each) with bucket_cap_mb=1", linears(500, 500, 500, bias=False), 1),
            ("layers 1000-1000-1000-10 with the default caps", linears(1000, 1000, 1000, 10), None),
            ("the CNN (width 16) with its first layer frozen, bucket_cap_mb=0.1", frozen, 0.1)]


def _buckets_by_rule(model, bucket_cap_mb, order=-1, first_cap=True, reach=True, unit=2**20, frozen=False,
                     element_bytes=True, fit_before=False) -> list[list[str]]:
    """DDP's bucketing with one rule changed, to name the rule a wrong answer broke."""
    cap = int((25 if bucket_cap_mb is None else bucket_cap_mb) * unit)
    caps = [2**20 if bucket_cap_mb is None and first_cap else cap, cap]
    buckets, names, size = [], [], 0
    for name, param in list(model.named_parameters())[::order]:
        if not (param.requires_grad or frozen):
            continue
        nbytes = param.numel() * (param.element_size() if element_bytes else 1)
        limit = caps[min(len(buckets), 1)]
        if fit_before and names and size + nbytes > limit:
            buckets.append(names)
            names, size = [], 0
            limit = caps[min(len(buckets), 1)]
        names.append(name)
        size += nbytes
        if not fit_before and (size >= limit if reach else size > limit):
            buckets.append(names)
            names, size = [], 0
    return buckets + ([names] if names else [])


_BUCKET_HINTS = [
    ({"order": 1}, "DDP fills its buckets in the order the gradients become ready: backward reaches the last "
                   "layer first, so walk the parameters from last to first"),
    ({"frozen": True}, "a parameter with requires_grad=False gets no gradient and joins no bucket"),
    ({"reach": False}, "a bucket closes as soon as its bytes reach the cap (at or past it), not only once it is past"),
    ({"unit": 10**6}, "bucket_cap_mb counts MiB: multiply by 1024 * 1024, not 10**6"),
    ({"fit_before": True}, "a bucket takes the tensor that brings it to its cap or past it, then closes: the "
                           "tensor does not move on to the next bucket (that is Horovod's fusion, not DDP's)"),
    ({"first_cap": False}, "with the default caps the first bucket is smaller: 1 MiB, so that the first "
                           "all-reduce starts early; the others take 25 MiB"),
    ({"element_bytes": False}, "the cap is in bytes: a float32 parameter takes 4 bytes per element"),
]


def _shown(buckets: list) -> str:
    return " | ".join(", ".join(bucket) for bucket in buckets)


def check_ddp_buckets(predict) -> bool:
    """`predict(model, bucket_cap_mb)` -> DDP's buckets, a list of lists of parameter names in the
    order they are all-reduced, against `scaledl.comm_estimate.ddp_buckets` (torch's own
    `_compute_bucket_assignment_by_size`, checked in tests/test_comm_estimate.py)."""
    from scaledl import comm_estimate

    if predict is None:
        return _unfinished("predict_buckets")
    cases = _bucket_models()
    for case, model, bucket_cap_mb in cases:
        try:
            got = [list(bucket) for bucket in predict(model, bucket_cap_mb)]
        except NotImplementedError:
            return _verdict(False, "predict_buckets still raises NotImplementedError: finish the exercise cell")
        except Exception as error:  # a learner's error, reported in one line
            return _verdict(False, f"{case}: predict_buckets raised {type(error).__name__}: "
                                   f"{(str(error).splitlines() or [''])[0]}")
        want = [bucket["names"] for bucket in comm_estimate.ddp_buckets(model, bucket_cap_mb)]
        if got == want:
            continue
        hints = [hint for change, hint in _BUCKET_HINTS if got == _buckets_by_rule(model, bucket_cap_mb, **change)]
        hint = hints[0] if hints else ("each parameter that needs a gradient goes in exactly one bucket, last layer "
                                       "first; a bucket closes once its bytes reach its cap")
        return _verdict(False, f"{case}: you made [{_shown(got)}], DDP makes [{_shown(want)}]: {hint}")
    return _verdict(True, f"all {len(cases)} models bucketed as DDP buckets them: last layer first, each bucket "
                          "closed once it reaches its cap, the first one 1 MiB by default")


def horovod_fuse(tensors: list, threshold: int) -> list[list[str]]:
    """Horovod's packing of one cycle's tensors (`[(name, bytes)]` in its order) into fusion
    buffers: greedily in order, the next tensor joins while the buffer stays within the threshold,
    else it starts the next buffer; a tensor larger than the threshold goes alone
    (`Controller::FuseResponses`, horovod/common/controller.cc, v0.28.1, for tensors of one type)."""
    buffers, used = [], 0
    for name, nbytes in tensors:
        if buffers and used + nbytes <= threshold:
            buffers[-1].append(name)
            used += nbytes
        else:
            buffers.append([name])
            used = nbytes
    return buffers


# (tensors in Horovod's order, threshold): a case where packing in order differs from sorting by size,
# one where a buffer fills exactly, one tensor larger than the threshold, fusion off, and all in one.
_FUSION_CASES = [
    ([("a", 40), ("b", 30), ("c", 50), ("d", 20)], 100),
    ([("a", 60), ("b", 40), ("c", 10)], 100),
    ([("a", 30), ("b", 200), ("c", 30), ("d", 30)], 100),
    ([("a", 10), ("b", 10), ("c", 10)], 0),
    ([("a", 10), ("b", 20), ("c", 30)], 2**27),
]


def check_fusion(fuse) -> bool:
    """`fuse(tensors, threshold) -> [[names of one buffer], ...]` against Horovod's own packing."""
    if fuse is None:
        return _unfinished("fuse")
    for tensors, threshold in _FUSION_CASES:
        case = f"{', '.join(f'{name} {nbytes} B' for name, nbytes in tensors)} with a threshold of {threshold} B"
        try:
            got = [list(buffer) for buffer in fuse(list(tensors), threshold)]
        except NotImplementedError:
            return _verdict(False, "fuse still raises NotImplementedError: finish the exercise cell")
        except Exception as error:  # a learner's error, reported in one line
            return _verdict(False, f"{case}: fuse raised {type(error).__name__}: "
                                   f"{(str(error).splitlines() or [''])[0]}")
        want = horovod_fuse(tensors, threshold)
        if got == want:
            continue
        sizes = dict(tensors)
        flat = [name for buffer in got for name in buffer]
        if sorted(flat) != sorted(sizes):
            hint = "every tensor goes in exactly one buffer"
        elif flat != [name for name, _ in tensors]:
            hint = "Horovod keeps the tensors in its order: it packs them as they come, it does not sort or look back"
        elif any(sum(sizes[name] for name in buffer) > threshold and len(buffer) > 1 for buffer in got):
            hint = "a buffer holds at most the threshold: the tensor that would pass it starts the next buffer"
        elif len(got) == len(tensors):
            hint = "tensors that fit together within the threshold share one buffer: that is the point of fusion"
        else:
            hint = "a tensor joins the buffer while the total stays within the threshold (at most, not below)"
        return _verdict(False, f"{case}: you made {got}, Horovod makes {want}: {hint}")
    return _verdict(True, f"all {len(_FUSION_CASES)} cases packed as Horovod packs them: in order, each buffer at "
                          "most the threshold, a larger tensor alone")


# ----------------------------------------------------------------------------- scaling

# A second measurement the learner never sees: its baseline is 2 ranks, not 1, and its world
# sizes are not all powers of two, so a formula that divides by the 1-rank rate, or by N where it
# should divide by N / baseline, gives other numbers than the right one.
_EFFICIENCY_HIDDEN = {2: 1900.0, 3: 2700.0, 6: 4800.0, 8: 6100.0}


def check_efficiency(efficiency, samples_per_s: dict, mode: str = "weak") -> bool:
    """`efficiency(samples_per_s: {world_size: samples/s}) -> {world_size: efficiency}`:
    samples/s on N ranks over N times the baseline's samples/s per rank, the baseline being the
    smallest world size measured (weak and strong alike).  Checked on `samples_per_s` and on a
    measurement whose baseline is 2 ranks."""
    if efficiency is None:
        return _unfinished("efficiency")
    for rates in (dict(samples_per_s), dict(_EFFICIENCY_HIDDEN)):
        base_n = min(rates)
        per_rank = rates[base_n] / base_n
        try:
            got = efficiency(dict(rates))
        except NotImplementedError:
            return _verdict(False, "efficiency still raises NotImplementedError: finish the exercise cell")
        except Exception as error:  # a learner's error, in one line
            where = f"for {rates}" if base_n == 1 else f"for a baseline of {base_n} ranks, {rates}"
            return _verdict(False, f"efficiency {where} raised {type(error).__name__}: "
                                   f"{(str(error).splitlines() or [''])[0]}: the baseline is the smallest world size "
                                   "measured, not always 1")
        for n, rate in sorted(rates.items()):
            want = rate / (n * per_rank)
            value = got.get(n) if isinstance(got, dict) else None
            if value is None:
                return _verdict(False, f"no efficiency for world_size {n}: return one for every world size measured")
            if math.isclose(value, want, rel_tol=1e-6):
                continue
            where = f"world_size {n}" + (f" (baseline {base_n} ranks)" if base_n != 1 else "")
            if n != base_n and math.isclose(value, rate / rates[base_n], rel_tol=1e-6):
                return _verdict(False, f"{where}: {value:.3g} is the speed-up over the baseline: divide it by the "
                                       "world size, relative to the baseline's")
            if value and math.isclose(value, 1 / want, rel_tol=1e-6):
                return _verdict(False, f"{where}: {value:.3g} is upside down: measured over ideal, not ideal over "
                                       "measured")
            if base_n != 1 and math.isclose(value, rate / (n * rates[base_n]), rel_tol=1e-6):
                return _verdict(False, f"{where}: {value:.3g}, expected {want:.3g}: the baseline's samples/s come from "
                                       f"{base_n} ranks: divide them by {base_n} for one rank's share")
            return _verdict(False, f"{where}: {value:.3g}, expected {want:.3g}: samples/s on N ranks over "
                                   "N times the samples/s per rank of the baseline")
    return _verdict(True, "efficiency = samples/s on N ranks / (N x samples/s per rank of the baseline) at every "
                          "world size, also for a baseline of 2 ranks")


def check_warmup(lr_at, lr: float = 0.1, base_batch_size: int = 64, warmup_steps: int = 100) -> bool:
    """`lr_at(step, lr, global_batch_size, base_batch_size, warmup_steps)`: the linear scaling
    rule with a linear warm-up from the unscaled lr (Goyal et al., 2017; scaledl.schedule).

    Checked on a batch the base does not divide (k = 1.5, where integer division gives 1), on a
    batch equal to the base (k = 1: nothing to ramp), and on a warm-up of 7 steps, where a ramp
    one step ahead or behind is off by 1/7 of the way."""
    from scaledl import schedule

    if lr_at is None:
        return _unfinished("lr_at")
    cases = [(global_batch_size, warmup, step)
             for global_batch_size, warmup in ((256, warmup_steps), (96, 7), (base_batch_size, warmup_steps))
             for step in (5 * warmup, warmup, 0, warmup // 2, warmup - 1)]  # the target first, then the ramp
    for global_batch_size, warmup, step in cases:
        def expected(at: int, batch: float = global_batch_size) -> float:
            return schedule.lr_at(at, lr=lr, global_batch_size=batch, base_batch_size=base_batch_size,
                                  scale_lr=True, warmup_steps=warmup)

        want = expected(step)
        try:
            got = lr_at(step, lr, global_batch_size, base_batch_size, warmup)
        except NotImplementedError:
            return _verdict(False, "lr_at still raises NotImplementedError: finish the exercise cell")
        except Exception as error:  # a learner's error, in one line
            return _verdict(False, f"lr_at({step}, {lr}, {global_batch_size}, {base_batch_size}, {warmup}) raised "
                                   f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}")
        if isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=1e-6):
            continue
        if not isinstance(got, (int, float)):
            return _verdict(False, f"lr_at returned {got!r}: return the learning rate, a number")
        k = global_batch_size / base_batch_size
        integer_k = global_batch_size // base_batch_size
        if integer_k != k and math.isclose(got, expected(step, integer_k * base_batch_size)):
            hint = f"{global_batch_size} / {base_batch_size} is {k:g}: integer division dropped the fraction"
        elif step >= warmup and math.isclose(got, lr * math.sqrt(k)):
            hint = "that is square-root scaling: the linear rule multiplies lr by global / base batch"
        elif step >= warmup and k != 1 and math.isclose(got, lr):
            hint = "lr never grows with the batch: multiply it by global_batch_size / base_batch_size"
        elif step < warmup and math.isclose(got, lr * k):
            hint = "no warm-up: ramp linearly from lr to the scaled lr over warmup_steps"
        elif step == 0 and math.isclose(got, 0):
            hint = "the ramp starts at the unscaled lr, not at 0 (Goyal et al.)"
        elif any(math.isclose(got, expected(step + shift)) for shift in (1, -1)):
            hint = "the ramp is one step off: step 0 has the unscaled lr, and step warmup_steps the first full one"
        else:
            hint = "a straight line from lr at step 0 to the scaled lr at step warmup_steps, then the scaled lr"
        return _verdict(False, f"global batch {global_batch_size}, warm-up {warmup} steps, step {step}: "
                               f"lr {got:.4g}, expected {want:.4g}: {hint}")
    return _verdict(True, "lr ramps linearly from the base lr to lr x global/base batch, then stays there")


MIB = 2**20
# (buckets in launch order, ranks, alpha, bandwidth, backward): a long backward (only the last bucket
# shows), a short one (the overflow shows), buckets of unequal size (first and last differ), one
# bucket, one rank.
_EXPOSED_CASES = [([25 * MIB, 25 * MIB, 10 * MIB], 4, 10e-6, 10e9, 0.2),
                  ([25 * MIB, 25 * MIB, 10 * MIB], 4, 10e-6, 10e9, 0.004),
                  ([1 * MIB, 24 * MIB], 8, 50e-6, 5e9, 0.003),
                  ([100 * MIB], 16, 20e-6, 25e9, 0.05),
                  ([25 * MIB, 5 * MIB], 1, 10e-6, 10e9, 0.01)]


def check_exposed(exposed_s) -> bool:
    """`exposed_s(buckets, ranks, alpha_s, bandwidth_Bps, backward_s)`: the seconds of DDP's
    bucketed all-reduce that backward does not hide (scaledl.predict.bucketed_s with overlap):
    each bucket a ring all-reduce, one after another; the last starts when backward ends, so it is
    always exposed, and what did not fit under backward is too."""
    from scaledl import predict

    if exposed_s is None:
        return _unfinished("exposed_s")
    for buckets, ranks, alpha, bandwidth, backward in _EXPOSED_CASES:
        link = predict.Link(alpha, bandwidth)
        each = [predict.allreduce_s(b, ranks, link) for b in buckets]
        want = predict.bucketed_s(buckets, ranks, link, backward, overlap=True)
        case = (f"buckets of {', '.join(f'{b / MIB:g}' for b in buckets)} MiB on {ranks} ranks, alpha "
                f"{alpha * 1e6:g} us, {bandwidth / 1e9:g} GB/s, backward {backward * 1e3:g} ms")
        try:
            got = float(exposed_s(list(buckets), ranks, alpha, bandwidth, backward))
        except NotImplementedError:
            return _verdict(False, "exposed_s still raises NotImplementedError: finish the exercise cell")
        except Exception as error:
            return _verdict(False, f"{case}: exposed_s raised {type(error).__name__}: "
                                   f"{(str(error).splitlines() or [''])[0]}")
        if math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12):
            continue
        total = sum(each)
        if ranks > 1 and math.isclose(got, total, rel_tol=1e-6):
            hint = "that is every bucket's time: the buckets before the last run while backward still computes"
        elif math.isclose(got, each[-1], rel_tol=1e-6):
            hint = "only the last bucket: when backward is short, what did not fit under it is exposed too"
        elif any(math.isclose(got, v, rel_tol=1e-6, abs_tol=1e-12)
                 for v in (total - backward, max(0.0, total - backward))):
            hint = "total minus backward can be below the last bucket, which starts only when backward ends"
        elif len(each) > 1 and math.isclose(got, max(each[0], total - backward), rel_tol=1e-6):
            hint = "the buckets are in launch order: the last one in the list goes when backward ends"
        elif ranks == 1:
            hint = "one rank has nothing to all-reduce"
        else:
            hint = "each bucket is a ring all-reduce, 2(N-1) alpha + 2(N-1)/N n / bandwidth, one after another"
        return _verdict(False, f"{case}: {got * 1e3:.4g} ms, expected {want * 1e3:.4g} ms: {hint}")
    return _verdict(True, "the last bucket, or what did not fit under backward, whichever is longer")


# ----------------------------------------------------------------------------- DeepSpeed and ZeRO

def deepspeed_batch(config: dict, world_size: int) -> tuple[int, int, int]:
    """(train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps) as
    DeepSpeed resolves them, or ValueError with DeepSpeed's reason for refusing the config.

    DeepSpeed needs one of train_batch_size and train_micro_batch_size_per_gpu, fills in the
    numbers left out (integer division; accumulation 1 when two are missing), then requires
    train = micro x accumulation x world_size, every one above 0: DeepSpeedConfig's
    `_set_batch_related_parameters` and `_batch_assertion` (deepspeed/runtime/config.py, 0.19.8;
    the same rules in 0.17.6)."""
    train = config.get("train_batch_size")
    micro = config.get("train_micro_batch_size_per_gpu")
    accumulation = config.get("gradient_accumulation_steps")
    for name, value in (("train_batch_size", train), ("train_micro_batch_size_per_gpu", micro),
                        ("gradient_accumulation_steps", accumulation)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{name} is {value!r}: DeepSpeed wants a number")
    if train is not None and micro is not None and accumulation is None:
        accumulation = train // micro // world_size
    elif train is not None and accumulation is not None and micro is None:
        micro = train // world_size // accumulation
    elif micro is not None and accumulation is not None and train is None:
        train = micro * accumulation * world_size
    elif train is not None and micro is None and accumulation is None:
        micro, accumulation = train // world_size, 1
    elif micro is not None and train is None and accumulation is None:
        train, accumulation = micro * world_size, 1
    elif train is None and micro is None:
        raise ValueError("DeepSpeed needs train_batch_size or train_micro_batch_size_per_gpu (or both)")
    for name, value in (("train_batch_size", train), ("train_micro_batch_size_per_gpu", micro),
                        ("gradient_accumulation_steps", accumulation)):
        if value <= 0:
            raise ValueError(f"{name} comes to {value}: DeepSpeed wants every batch number above 0")
    if train != micro * accumulation * world_size:
        raise ValueError(f"train_batch_size {train} != micro batch {micro} x accumulation {accumulation} x "
                         f"world_size {world_size}: DeepSpeed refuses this config; the global batch counts every "
                         "micro batch of every rank")
    return train, micro, accumulation


def check_deepspeed_config(configs_by_rank: list, world_size: int, micro_batch_size: int = 8,
                           accumulation_steps: int = 3) -> bool:
    """A config DeepSpeed accepts (any of the three batch numbers may be left for it to infer:
    `deepspeed_batch`) whose batch is the one the exercise asks for, with clipping off.

    The exercise runs on 2 or more ranks with an accumulation that differs from the world size,
    so a global batch that leaves out the ranks and one that leaves out the accumulation come to
    different numbers, both wrong.  Clipping must be off explicitly: DeepSpeed clips the gradient
    norm to 1.0 when the key is missing from 0.19.3 on (constants.py GRADIENT_CLIPPING_DEFAULT,
    DeepSpeed PR 8068), and not at all before (0.17.6 included)."""
    if configs_by_rank is None:
        return False
    if world_size < 2:  # on one rank a global batch without the ranks is right by accident
        return _verdict(False, "one rank cannot tell a global batch from a local one: start 2 or more "
                               "(WORLD_SIZE = 2)")
    config = configs_by_rank[0]
    if not isinstance(config, dict):
        return _verdict(False, f"ds_config is {type(config).__name__}: write the config as a dict")
    try:
        train, micro, accumulation = deepspeed_batch(config, world_size)
    except ValueError as error:
        return _verdict(False, str(error))
    if micro != micro_batch_size:
        hint = (": that is the global batch, every rank's micro batches together" if micro == train
                else f" ({world_size} ranks' worth): the micro batch is one rank's" if micro == micro_batch_size
                * world_size else "")
        return _verdict(False, f"the micro batch per rank comes to {micro}; the exercise asks for "
                               f"{micro_batch_size}{hint}")
    if accumulation != accumulation_steps:
        return _verdict(False, f"gradient accumulation comes to {accumulation} micro batches per optimizer step; "
                               f"the exercise asks for {accumulation_steps}")
    clipping = config.get("gradient_clipping")
    if clipping is None:
        return _verdict(False, "no \"gradient_clipping\": DeepSpeed 0.19.3 and later clip the gradient norm to 1.0 "
                               "by default (older releases do not): set it to 0 so that no release clips")
    if isinstance(clipping, bool) or not isinstance(clipping, (int, float)) or clipping > 0:
        return _verdict(False, f"\"gradient_clipping\" is {clipping!r}: DeepSpeed clips the gradient norm to that; "
                               "the other rungs do not clip, so set 0")
    inferred = [name for name in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                  "gradient_accumulation_steps") if name not in config]
    said = f" (DeepSpeed infers {', '.join(inferred)})" if inferred else ""
    return _verdict(True, f"global batch {train} = micro batch {micro} x accumulation {accumulation} x "
                          f"world_size {world_size}{said}, and nothing is clipped")


_PARTITIONED = {0: (), 1: ("optimizer",), 2: ("optimizer", "grads"), 3: ("optimizer", "grads", "params")}
_NAMES = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer states"}


def accumulation_plan(micro_steps: int, accumulation_steps: int, zero_stage: int) -> tuple[int, int]:
    """(backward passes that reduce gradients, optimizer steps) of a DeepSpeed engine over
    `micro_steps` micro steps: the optimizer steps at each full window's end; stages 0-1 reduce in
    that window's last backward only, stages 2-3 in every backward (engine.py, allreduce_gradients)."""
    steps = micro_steps // accumulation_steps
    return (micro_steps if zero_stage >= 2 else steps), steps


# (micro steps, accumulation steps, ZeRO stage): a window that divides, one that does not, stage 2's
# every-backward reduction, and no accumulation at all.
_PLAN_CASES = [(12, 4, 0), (7, 3, 1), (7, 3, 2), (5, 1, 0), (8, 4, 3)]


def check_accumulation_plan(plan, measured: tuple | None = None) -> bool:
    """`plan(micro_steps, accumulation_steps, zero_stage) -> (reducing backwards, optimizer steps)`
    against DeepSpeed's engine; with `measured = (micro_steps, accumulation_steps, zero_stage,
    reducing backwards, optimizer steps)` from the live ranks, against what they did too."""
    if plan is None:
        return _unfinished("plan")
    cases = [*_PLAN_CASES, *([measured[:3]] if measured else [])]
    for micro_steps, accumulation, stage in cases:
        case = f"{micro_steps} micro steps, gradient_accumulation_steps {accumulation}, ZeRO stage {stage}"
        try:
            got = tuple(int(value) for value in plan(micro_steps, accumulation, stage))
        except NotImplementedError:
            return _verdict(False, "plan still raises NotImplementedError: finish the exercise cell")
        except Exception as error:  # a learner's error, reported in one line
            return _verdict(False, f"{case}: plan raised {type(error).__name__}: "
                                   f"{(str(error).splitlines() or [''])[0]}")
        want = accumulation_plan(micro_steps, accumulation, stage)
        if got == want:
            continue
        reductions, steps = got
        if steps != want[1]:
            hint = ("the optimizer steps once per full window; a window left unfinished has not stepped yet"
                    if steps in (-(-micro_steps // accumulation), micro_steps / accumulation) else
                    "engine.step() is called every micro step but applies the optimizer only at a window's end"
                    if steps == micro_steps else "count the full windows")
        elif stage < 2:
            hint = ("at stages 0-1 the engine reduces only in a window's last backward: the others accumulate "
                    "locally" if reductions == micro_steps else "one reduction per full window, in its last backward")
        else:
            hint = ("from stage 2 on every backward reduces: each rank keeps only its part of the gradients, so it "
                    "cannot accumulate the whole of them")
        return _verdict(False, f"{case}: you said {reductions} reducing backwards and {steps} optimizer steps, "
                               f"DeepSpeed makes {want[0]} and {want[1]}: {hint}")
    said = f"all {len(cases)} cases as DeepSpeed's engine counts them"
    if measured:
        micro_steps, accumulation, stage, reductions, steps = measured
        if (reductions, steps) != accumulation_plan(micro_steps, accumulation, stage):
            return _verdict(False, f"{said}, but the live ranks did {reductions} and {steps} in {micro_steps} micro "
                                   "steps: rerun the measurement cell")
        said += f", and as the live ranks did ({reductions} reducing backwards, {steps} optimizer steps)"
    return _verdict(True, said)


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


def check_engine_bytes(engine_bytes_per_rank, world_size: int = 4) -> bool:
    """`engine_bytes_per_rank(num_params, world_size, stage)` for lesson 9's live engine: fp32
    parameters and gradients (4 + 4 bytes), SGD's momentum (4), and from stage 1 on DeepSpeed's
    fp32 master copy of the rank's partition (4 more).  Checked part by part on a parameter count
    that `world_size` does not divide (DeepSpeed pads partitions: rounding either way passes)."""
    from scaledl import zero_memory

    if engine_bytes_per_rank is None:
        return _unfinished("engine_bytes_per_rank")
    num_params = 206_922  # the CNN's
    close = lambda a, b: math.isclose(a, b, rel_tol=1e-4)  # noqa: E731
    for stage in range(4):
        try:
            got = engine_bytes_per_rank(num_params, world_size, stage)
        except NotImplementedError:
            return _verdict(False, "engine_bytes_per_rank still raises NotImplementedError: finish the exercise cell")
        if not isinstance(got, dict) or set(got) < {"params", "grads", "optimizer"}:
            return _verdict(False, "return a dict with the bytes of \"params\", \"grads\" and \"optimizer\"")
        want = zero_memory.predict(num_params, world_size, stage)
        shard = num_params / world_size
        for key in ("params", "grads", "optimizer"):
            if close(got[key], want[key]):
                continue
            full = num_params if key not in _PARTITIONED[stage] else shard
            if key in ("params", "grads") and close(got[key], 2 * full):
                return _verdict(False, f"stage {stage}: {_NAMES[key]} at 2 bytes: this engine trains in fp32, 4 bytes "
                                       "per parameter (the paper's 2 are fp16)")
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
            if key in _PARTITIONED[stage] and close(got[key], want[key] * world_size):
                return _verdict(False, f"stage {stage}: {_NAMES[key]} are partitioned from stage "
                                       f"{min(s for s in _PARTITIONED if key in _PARTITIONED[s])} on: divide them "
                                       "by world_size")
            if key not in _PARTITIONED[stage] and close(got[key] * world_size, want[key]):
                kept = ", ".join(_NAMES[k] for k in _PARTITIONED[stage]) or "nothing"
                return _verdict(False, f"stage {stage}: every rank still holds all the {_NAMES[key]}: stage {stage} "
                                       f"partitions only {kept}")
            return _verdict(False, f"stage {stage}: {_NAMES[key]} {got[key]:,.0f} bytes, expected {want[key]:,.0f}")
    return _verdict(True, "the live engine's four stages, part by part: fp32 weights, gradients and momentum, and "
                          "from stage 1 the fp32 copy of the rank's partition")


# ----------------------------------------------------------------------------- pipeline

def check_pipeline(received, logits, first_stage_output, full_logits, tolerance: float = 1e-4) -> bool:
    """Rank 1's received buffer must hold rank 0's stage output, and its logits (its stage on
    that buffer) must equal the whole model's on the same batch.  Tensors on the CPU."""
    if received is None:
        return _verdict(False, "rank 1 has no `activations`: receive rank 0's output into a buffer of that name")
    if tuple(received.shape) != tuple(first_stage_output.shape):
        return _verdict(False, f"rank 1's buffer has shape {tuple(received.shape)}, but rank 0 sends "
                               f"{tuple(first_stage_output.shape)}: a receive buffer must match what is sent")
    if not (received - first_stage_output).abs().max().item() < tolerance:
        return _verdict(False, "rank 1's buffer does not hold rank 0's output: rank 0 must send it and rank 1 "
                               "receive into the buffer before using it")
    if logits is None:
        return _verdict(False, "rank 1 has no `logits`: run its stage on the activations it received")
    error = (logits - full_logits).abs().max().item()
    if not error < tolerance:
        return _verdict(False, f"rank 1's logits differ from the whole model's (max error {error:.2g}): "
                               "run rank 1's own stage on the received activations")
    return _verdict(True, "rank 1 received rank 0's activations, and the two stages compute what the whole model does")


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


# ----------------------------------------------------------------------------- FSDP2

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


# ----------------------------------------------------------------------------- lesson 0

def check_binding_launch(placements: list, min_cpus: int = 8) -> bool:
    """A launch the learner wrote (`scaledl.binding.plan` of it on a node's sysfs tree): every rank
    local to its GPU, on CPUs of its own, and at least `min_cpus` CPUs (hardware threads) each: one
    CPU per rank is local too, but starves the data loader and the host side.  The sysfs copy holds
    no core siblings, so CPUs are counted, not cores."""
    from scaledl.binding import format_cpulist as format_cpus

    if not placements:
        return _unfinished("CPU_BIND")
    for p in placements:
        if p.verdict != "local":
            return _verdict(False, f"local rank {p.local_rank}: CPUs {format_cpus(p.cpus)} on NUMA node "
                                   f"{','.join(map(str, p.cpu_nodes))}, its GPU on NUMA node {p.gpu_node} "
                                   f"({p.verdict}): give it CPUs of NUMA node {p.gpu_node} only (the table above "
                                   "lists them)")
    for p, q in ((p, q) for i, p in enumerate(placements) for q in placements[i + 1:]):
        if p.cpus & q.cpus:
            return _verdict(False, f"local ranks {p.local_rank} and {q.local_rank} share CPUs "
                                   f"{format_cpus(p.cpus & q.cpus)}: give each rank CPUs of its own")
    for p in placements:
        cpus = len(p.cpus)
        if cpus < min_cpus:
            return _verdict(False, f"local rank {p.local_rank} has {cpus} CPU{'s' * (cpus != 1)}, local but few: "
                                   f"give it at least {min_cpus} of its NUMA node's {len(p.node_cpus)}")
    shown = "; ".join(f"rank {p.local_rank}: CPUs {format_cpus(p.cpus)}, GPU on NUMA {p.gpu_node}" for p in placements)
    return _verdict(True, f"every rank on its GPU's NUMA node, with CPUs of its own ({shown})")


def check_binding_verdicts(verdicts, placements: list) -> bool:
    """`verdicts[local_rank]` is "local", "split" or "far" for a launch whose ranks land as
    `placements` (`scaledl.binding.plan`): the learner reads it off the node's table before the
    launch's own printout shows it.  Local ranks as ints or digit strings; the words in any case."""
    words = ("local", "split", "far")
    if not verdicts:
        return _unfinished("VERDICTS")
    if not isinstance(verdicts, dict):
        return _verdict(False, "`VERDICTS` is a dict: {local rank: 'local', 'split' or 'far'}")
    given = {}
    for key, value in verdicts.items():
        rank = int(key) if isinstance(key, int) or (isinstance(key, str) and key.strip().isdigit()) else key
        given[rank] = value.strip().lower() if isinstance(value, str) else value
    missing = [p.local_rank for p in placements if p.local_rank not in given]
    if missing:
        return _verdict(False, f"give a verdict for every local rank: {', '.join(map(str, missing))} missing")
    for rank, word in given.items():
        if word not in words:
            return _verdict(False, f"local rank {rank}: {word!r} is not a verdict; say 'local', 'split' or 'far'")
    for p in placements:
        if given[p.local_rank] != p.verdict:
            return _verdict(False, f"local rank {p.local_rank} is not {given[p.local_rank]}: list the NUMA nodes "
                                   f"its {len(p.cpus)} cores span (the table above gives each NUMA node's cores), "
                                   "and compare them with its GPU's")
    return _verdict(True, "; ".join(f"local rank {p.local_rank}: {p.verdict}" for p in placements))


def check_binding_prediction(prediction, placements: list, gpu_nodes: dict) -> bool:
    """`prediction[local_rank] = (GPU, NUMA node of that GPU)` for a launch whose ranks land as
    `placements` (`scaledl.binding.plan` on a node's sysfs tree); GPU as its number in PCI order
    (what nvidia-smi shows) or its PCI address.  `gpu_nodes`: each GPU's PCI address -> NUMA node,
    in PCI order.  The launch itself must put every rank on its GPU's NUMA node (local): a launch
    with a far or split rank FAILs whatever was predicted."""
    for p in placements:
        if p.verdict != "local":
            return _verdict(False, f"the launch runs local rank {p.local_rank} on NUMA node "
                                   f"{','.join(map(str, p.cpu_nodes))} with a GPU on NUMA node {p.gpu_node} "
                                   f"({p.verdict}): give each rank the GPU on its own cores' NUMA node")
    if not isinstance(prediction, dict) or any(p.local_rank not in prediction for p in placements):
        return _unfinished("prediction") if not prediction else _verdict(
            False, f"predict every local rank 0-{len(placements) - 1}: `prediction` has {sorted(prediction)}")
    order = list(gpu_nodes)
    for p in placements:
        want_gpu, want_node = order.index(p.gpu), p.gpu_node
        try:
            gpu, node = prediction[p.local_rank]
            gpu = order.index(gpu.lower()) if isinstance(gpu, str) else int(gpu)
            node = int(node)
        except (TypeError, ValueError):
            return _verdict(False, f"prediction[{p.local_rank}] = {prediction[p.local_rank]!r}: write (GPU number, "
                                   "NUMA node), e.g. (2, 1)")
        if gpu != want_gpu:
            if gpu == p.local_rank:
                hint = (f"that is cuda:<local_rank>; GPU {gpu} sits on NUMA node {list(gpu_nodes.values())[gpu]}, "
                        f"and local rank {p.local_rank}'s cores are on NUMA node {p.cpu_nodes[0]}")
            elif 0 <= gpu < len(order):
                hint = f"GPU {gpu} sits on NUMA node {list(gpu_nodes.values())[gpu]}, not next to its cores"
            else:
                hint = f"this node has GPUs 0-{len(order) - 1}"
            return _verdict(False, f"local rank {p.local_rank} does not drive GPU {gpu}: {hint}")
        if node != want_node:
            return _verdict(False, f"GPU {gpu} sits on NUMA node {want_node}, not {node}: a GPU's NUMA node is its "
                                   "PCI root's, not its number (here the order is reversed)")
    mapping = ", ".join(f"{p.local_rank}->GPU {order.index(p.gpu)}" for p in placements)
    return _verdict(True, f"every local rank drives the GPU on its own NUMA node ({mapping}), all local")
