"""The process the benchmarks launch: measures on every rank, rank 0 writes JSON.

    torchrun --nproc_per_node=2 -m scaledl.perf.bench.worker steps --variant ddp --out t.json
    python -m scaledl.perf.bench.worker serve --variant horovod        # timed blocks on request

`steps` times one variant's training steps; `serve` builds a variant once and then times a
block of N steps each time it reads "N" on stdin (the overhead suite interleaves variants
that way); `comm` times collectives (after a barrier, and with --in-step also between the layers
of a step) and DDP bucket sizes; `fusion` times Horovod's fusion thresholds; `memory` counts
ZeRO's bytes per rank at every stage.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

LAPS_TAG = "LAPS "


def time_steps(variant, steps: int, warmup: int, together: tuple[str, int] | None = None) -> list[float]:
    """Seconds per step, device synchronized around each, warm-up steps left out.

    `together` (a folder, a count): wait after the warm-up until that many copies are warm, so
    that independent one-rank copies time their steps side by side (see `wait_for_copies`)."""
    from scaledl.timing import Stopwatch

    watch = Stopwatch(variant.device, warmup=warmup)
    for index in range(warmup + steps):
        if together and index == warmup:
            wait_for_copies(*together)
        watch.start()
        variant.step()
        watch.stop()
    return watch.laps


def wait_for_copies(folder: str, copies: int, timeout_s: float = 300.0) -> None:
    """A barrier between processes that share no process group: each leaves a file, then waits for
    `copies` of them.  Files, not a collective, because the copies must stay one-rank jobs."""
    from pathlib import Path

    here = Path(folder)
    here.mkdir(parents=True, exist_ok=True)
    (here / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(here.glob("ready-*"))) < copies:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(list(here.glob('ready-*')))} of {copies} copies became ready in {folder}")
        time.sleep(0.01)


def write_result(path: str | None, rank: int, result: dict) -> None:
    if rank == 0 and path:
        with open(path, "w") as f:
            json.dump(result, f)


def steps(args) -> None:
    from scaledl.perf.bench import variants

    if args.no_comm:
        skip_all_reduces()
    variant = variants.build(args.variant, args.micro_batch_size, args.threads, args.bucket_cap_mb,
                             model_name=args.model, recompute=args.recompute, grad_accum=args.grad_accum)
    laps = time_steps(variant, args.steps, args.warmup, (args.together, args.copies) if args.together else None)
    if args.no_comm and variant.world_size > 1:  # no collective kept the ranks together: a step is the slowest's
        import torch.distributed as dist

        every = [None] * variant.world_size
        dist.all_gather_object(every, laps)
        laps = [max(step) for step in zip(*every)]
    write_result(args.out, variant.rank, {"variant": args.variant, "world_size": variant.world_size,
                                          "micro_batch_size": args.micro_batch_size, "threads": args.threads,
                                          "model": args.model, "num_params": variant.num_params,
                                          "device": str(variant.device), "laps": laps})


def skip_all_reduces() -> None:
    """Tensor parallelism's step without its communication: every all-reduce that DTensor issues
    (torch.distributed._functional_collectives.all_reduce, looked up at each call) returns its
    input, so each rank computes what it computes in the real step and moves nothing.  The numbers
    it trains on are wrong; its time is the compute a prediction adds the communication to."""
    import torch.distributed._functional_collectives as funcol

    funcol.all_reduce = lambda tensor, *args, **kwargs: tensor


def serve(args) -> None:
    from scaledl.perf.bench import variants

    variant = variants.build(args.variant, args.micro_batch_size, args.threads)
    time_steps(variant, 0, args.warmup)
    print(LAPS_TAG + "[]", flush=True)  # ready
    for line in sys.stdin:
        if not line.strip() or line.strip() == "quit":
            break
        print(LAPS_TAG + json.dumps(time_steps(variant, int(line), 0)), flush=True)


def comm(args) -> None:
    """Collectives' time per message size (after a barrier; with --in-step also inside a synthetic
    step, `time_collectives_in_step`), then DDP's step time per bucket size."""
    import torch
    import torch.distributed as dist

    from scaledl import distributed
    from scaledl.perf.bench import variants

    torch.set_num_threads(args.threads)
    setup = distributed.setup()
    # Each collective: (the call, whether its size is its rank's 1/N share).  nccl-tests' sizes:
    # allgather's is the gathered (output) size, reducescatter's the input that each rank reduces.
    collectives = {
        "allreduce": (lambda full, part: dist.all_reduce(full), False),
        "broadcast": (lambda full, part: dist.broadcast(full, src=0), False),
        "allgather": (lambda full, part: dist.all_gather_into_tensor(full, part), True),
        "reducescatter": (lambda full, part: dist.reduce_scatter_tensor(part, full), True),
    }
    results = time_collectives(collectives, args, setup.world_size, setup.device)
    in_step = None
    if args.in_step:
        import torch.distributed._functional_collectives as funcol

        group = dist.group.WORLD
        in_step = time_collectives_in_step({
            **{name: collectives[name] for name in IN_STEP_COLLECTIVES},
            # DTensor's (tensor parallelism's) all-reduce: the functional collective, output allocated, then waited
            "allreduce_functional": (lambda full, part: funcol.wait_tensor(funcol.all_reduce(full, "sum", group)),
                                     False)}, args, setup.world_size, setup.device)
    models = {mb: variants.build("ddp", args.micro_batch_size, args.threads, bucket_cap_mb=mb)
              for mb in args.bucket_sizes_mb}
    buckets = {mb: [] for mb in args.bucket_sizes_mb}
    for round_index in range(args.rounds):  # interleaved, so drift hits every bucket size alike
        for mb in args.bucket_sizes_mb:
            buckets[mb] += time_steps(models[mb], args.steps, args.warmup if round_index == 0 else 1)
    write_result(args.out, setup.rank, {"world_size": setup.world_size, "device": str(setup.device),
                                        "backend": setup.backend, "collectives": results,
                                        "collectives_in_step": in_step,
                                        "ddp_buckets": [{"bucket_cap_mb": mb, "laps": laps}
                                                        for mb, laps in buckets.items()]})
    distributed.teardown()


def time_collectives(collectives: dict, args, world_size: int, device) -> dict:
    """Per collective, per size: the seconds of each call after a barrier, warm-up calls left out."""
    import torch.distributed as dist

    from scaledl.timing import synchronize

    def laps_of(collective, full, part) -> list[float]:
        laps = []
        for i in range(args.warmup + args.iters):
            dist.barrier()
            synchronize(device)
            start = time.perf_counter()
            collective(full, part)
            synchronize(device)
            if i >= args.warmup:
                laps.append(time.perf_counter() - start)
        return laps

    return _each_size(collectives, args.sizes, world_size, device, laps_of)


def _each_size(collectives: dict, sizes: list[int], world_size: int, device, laps_of) -> dict:
    """{name: [{"bytes", "laps"} per size]}: each collective's buffers made for each size (a sharded
    one's size is its gathered or reduced whole, nccl-tests' convention), then `laps_of(collective,
    full, part)` times it."""
    import torch

    results = {name: [] for name in collectives}
    for size in sizes:
        for name, (collective, sharded) in collectives.items():
            count = max(1, size // 4 // world_size) * world_size if sharded else max(1, size // 4)
            full = torch.ones(count, device=device)
            part = torch.ones(count // world_size if sharded else 1, device=device)
            results[name].append({"bytes": count * 4, "laps": laps_of(collective, full, part)})
    return results


IN_STEP_COLLECTIVES = ("allreduce", "allgather", "reducescatter")
IN_STEP_LAYERS, IN_STEP_WIDTH, IN_STEP_BATCH = 8, 256, 256  # under 1 ms of compute per layer on one CPU core


def time_collectives_in_step(collectives: dict, args, world_size: int, device) -> dict:
    """Per collective, per size: what one call adds to a training step when a rank reaches it from
    compute, as FSDP2 and tensor parallelism reach theirs (between layers) and DDP its buckets.

    A step of a small synthetic model (IN_STEP_LAYERS linear layers, forward and backward) is timed
    with a blocking collective after each layer's forward and without, in pairs; each lap is
    (with - without) / IN_STEP_LAYERS.  Unlike a loop of collectives after a barrier, this holds
    the wait for the peer that arrives later (its compute ran slower this time) and the wake-up of
    the communication thread that slept through the compute.  What it does not control: the laps are
    rank 0's alone, the step without always runs first, and no barrier precedes a pair, so whatever
    skew one step leaves lands on the next one's first collective."""
    import torch

    from scaledl.timing import synchronize

    torch.manual_seed(0)
    layers = [torch.nn.Linear(IN_STEP_WIDTH, IN_STEP_WIDTH).to(device) for _ in range(IN_STEP_LAYERS)]
    x = torch.randn(IN_STEP_BATCH, IN_STEP_WIDTH, device=device)

    def step(collective=None, full=None, part=None) -> float:
        synchronize(device)
        start = time.perf_counter()
        h = x
        for layer in layers:
            h = torch.relu(layer(h))
            if collective:
                collective(full, part)
        h.sum().backward()
        synchronize(device)
        return time.perf_counter() - start

    def laps_of(collective, full, part) -> list[float]:
        laps = []
        for i in range(args.warmup + args.iters):
            without, with_ = step(), step(collective, full, part)
            if i >= args.warmup:
                laps.append((with_ - without) / IN_STEP_LAYERS)
        return laps

    return _each_size(collectives, args.sizes, world_size, device, laps_of)


def fusion(args) -> None:
    """Horovod's step time per HOROVOD_FUSION_THRESHOLD; Horovod reads it at init, so each
    value re-initializes Horovod in this process (as elastic Horovod does after a reset)."""
    import horovod.torch as hvd

    from scaledl.perf.bench import variants
    from scaledl.distributed import MPI_LAUNCHERS
    from scaledl.launch_env import detect

    if detect().launcher in MPI_LAUNCHERS:
        # Horovod finalizes MPI at shutdown when it initialized it, and MPI cannot start
        # twice; initialized here first, MPI outlives every hvd.shutdown().
        from mpi4py import MPI  # noqa: F401
    built = {}
    for threshold in args.thresholds:
        os.environ["HOROVOD_FUSION_THRESHOLD"] = str(threshold)
        if hvd.is_initialized():
            hvd.shutdown()
        variant = variants.build("horovod", args.micro_batch_size, args.threads)
        built[threshold] = time_steps(variant, args.steps, args.warmup)
    write_result(args.out, hvd.rank(), {"world_size": hvd.size(), "fusion": [
        {"threshold_bytes": threshold, "laps": laps} for threshold, laps in built.items()]})


def memory(args) -> None:
    """Bytes of parameters, gradients and optimizer states per rank, counted after backward."""
    import torch.nn.functional as F

    from scaledl import distributed, zero_memory
    from scaledl.perf.bench import variants

    counted = {}
    for name in args.variants:
        variant = variants.build(name, args.micro_batch_size, args.threads)
        variant.step()  # the optimizer's states exist after its first step
        engine, (x, y) = variant.engine, variant.batch
        engine.backward(F.cross_entropy(engine(x), y))
        counted[name] = {"stage": engine.zero_optimization_stage(), **zero_memory.measure(engine)}
        engine.step()
    write_result(args.out, variant.rank, {"world_size": variant.world_size, "num_params": variant.num_params,
                                          "counted": counted})
    distributed.teardown()


def parse(argv=None) -> argparse.Namespace:
    from scaledl.perf.bench import variants

    parser = argparse.ArgumentParser(prog="python -m scaledl.perf.bench.worker")
    parser.add_argument("mode", choices=["steps", "serve", "comm", "fusion", "memory"])
    parser.add_argument("--variant", default="plain")
    parser.add_argument("--variants", nargs="+", default=[])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--micro-batch-size", type=int, default=32)
    parser.add_argument("--model", default="cnn", type=variants.model_name,
                        help="cnn, resnet50, transformer or transformer:WIDTH,DEPTH,HEADS,SEQ_LEN")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096])
    parser.add_argument("--bucket-cap-mb", type=float, help="DDP's bucket size (steps)")
    parser.add_argument("--recompute", default="none", choices=("none", "selective", "full"),
                        help="the transformer's --recompute (steps: plain, ddp)")
    parser.add_argument("--grad-accum", type=int, default=1, help="micro batches a step (steps: plain, ddp)")
    parser.add_argument("--bucket-sizes-mb", type=float, nargs="+", default=[25.0], help="DDP bucket sweep (comm)")
    parser.add_argument("--thresholds", type=int, nargs="+", default=[64 * 2**20])
    parser.add_argument("--no-comm", action="store_true",
                        help="steps, tensor_parallel: skip the all-reduces (the compute alone)")
    parser.add_argument("--in-step", action="store_true",
                        help="comm: also time each collective inside a synthetic training step")
    parser.add_argument("--together", help="a folder: time the steps only once --copies copies are warm (steps)")
    parser.add_argument("--copies", type=int, default=1)
    parser.add_argument("--out")
    parser.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # the deepspeed launcher adds it
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if args.no_comm and args.variant != "tensor_parallel":
        print(f"worker: error: --no-comm skips tensor parallelism's all-reduces; variant {args.variant} "
              "would stop at its first collective or train apart", file=sys.stderr)
        return 2
    globals()[args.mode](args)
    return 0


if __name__ == "__main__":
    from scaledl import distributed

    code = main()
    if "torch.distributed" in sys.modules:
        distributed.teardown()
    distributed.exit_process(code)
