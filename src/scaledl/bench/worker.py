"""The process the benchmarks launch: measures on every rank, rank 0 writes JSON.

    torchrun --nproc_per_node=2 -m scaledl.bench.worker steps --variant ddp --out t.json
    python -m scaledl.bench.worker serve --variant horovod        # timed blocks on request

`steps` times one variant's training steps; `serve` builds a variant once and then times a
block of N steps each time it reads "N" on stdin (the overhead suite interleaves variants
that way); `comm` times collectives and DDP bucket sizes; `fusion` times Horovod's fusion
thresholds; `memory` counts ZeRO's bytes per rank at every stage.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

LAPS_TAG = "LAPS "


def time_steps(variant, steps: int, warmup: int) -> list[float]:
    """Seconds per step, device synchronized around each, warm-up steps left out."""
    from scaledl.timing import Stopwatch

    watch = Stopwatch(variant.device, warmup=warmup)
    for _ in range(warmup + steps):
        watch.start()
        variant.step()
        watch.stop()
    return watch.laps


def write_result(path: str | None, rank: int, result: dict) -> None:
    if rank == 0 and path:
        with open(path, "w") as f:
            json.dump(result, f)


def steps(args) -> None:
    from scaledl.bench import variants

    variant = variants.build(args.variant, args.micro_batch_size, args.threads, args.bucket_cap_mb,
                             model_name=args.model)
    laps = time_steps(variant, args.steps, args.warmup)
    write_result(args.out, variant.rank, {"variant": args.variant, "world_size": variant.world_size,
                                          "micro_batch_size": args.micro_batch_size, "threads": args.threads,
                                          "model": args.model, "num_params": variant.num_params,
                                          "device": str(variant.device), "laps": laps})


def serve(args) -> None:
    from scaledl.bench import variants

    variant = variants.build(args.variant, args.micro_batch_size, args.threads)
    time_steps(variant, 0, args.warmup)
    print(LAPS_TAG + "[]", flush=True)  # ready
    for line in sys.stdin:
        if not line.strip() or line.strip() == "quit":
            break
        print(LAPS_TAG + json.dumps(time_steps(variant, int(line), 0)), flush=True)


def comm(args) -> None:
    """Collectives' time per message size, then DDP's step time per bucket size."""
    import torch
    import torch.distributed as dist

    from scaledl import distributed
    from scaledl.bench import variants
    from scaledl.timing import synchronize

    torch.set_num_threads(args.threads)
    setup = distributed.setup()
    world_size = setup.world_size
    collectives = {
        "allreduce": lambda t, out: dist.all_reduce(t),
        "broadcast": lambda t, out: dist.broadcast(t, src=0),
        # nccl-tests' size for allgather is the gathered (output) size: each rank sends 1/n of it.
        "allgather": lambda t, out: dist.all_gather_into_tensor(out, t),
    }
    results = {name: [] for name in collectives}
    for size in args.sizes:
        for name, collective in collectives.items():
            count = max(1, size // 4 // (world_size if name == "allgather" else 1))
            tensor = torch.ones(count, device=setup.device)
            out = torch.empty(count * world_size, device=setup.device)
            laps = []
            for i in range(args.warmup + args.iters):
                dist.barrier()
                synchronize(setup.device)
                start = time.perf_counter()
                collective(tensor, out)
                synchronize(setup.device)
                if i >= args.warmup:
                    laps.append(time.perf_counter() - start)
            results[name].append({"bytes": count * 4 * (world_size if name == "allgather" else 1), "laps": laps})
    models = {mb: variants.build("ddp", args.micro_batch_size, args.threads, bucket_cap_mb=mb)
              for mb in args.bucket_sizes_mb}
    buckets = {mb: [] for mb in args.bucket_sizes_mb}
    for round_index in range(args.rounds):  # interleaved, so drift hits every bucket size alike
        for mb in args.bucket_sizes_mb:
            buckets[mb] += time_steps(models[mb], args.steps, args.warmup if round_index == 0 else 1)
    write_result(args.out, setup.rank, {"world_size": world_size, "device": str(setup.device),
                                        "backend": setup.backend, "collectives": results,
                                        "ddp_buckets": [{"bucket_cap_mb": mb, "laps": laps}
                                                        for mb, laps in buckets.items()]})
    distributed.teardown()


def fusion(args) -> None:
    """Horovod's step time per HOROVOD_FUSION_THRESHOLD; Horovod reads it at init, so each
    value re-initializes Horovod in this process (as elastic Horovod does after a reset)."""
    import horovod.torch as hvd

    from scaledl.bench import variants
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
    from scaledl.bench import variants

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
    from scaledl.bench import variants

    parser = argparse.ArgumentParser(prog="python -m scaledl.bench.worker")
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
    parser.add_argument("--bucket-sizes-mb", type=float, nargs="+", default=[25.0], help="DDP bucket sweep (comm)")
    parser.add_argument("--thresholds", type=int, nargs="+", default=[64 * 2**20])
    parser.add_argument("--out")
    parser.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # the deepspeed launcher adds it
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    globals()[args.mode](args)
    return 0


if __name__ == "__main__":
    from scaledl import distributed

    code = main()
    if "torch.distributed" in sys.modules:
        distributed.teardown()
    distributed.exit_process(code)
