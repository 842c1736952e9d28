"""Run a rung with every DDP all-reduce timed (lesson 7's gap budget).

    torchrun --nproc_per_node=2 -m scaledl.workshop.timed_ddp [--rung MODULE] <the rung's arguments>

Every `DistributedDataParallel` model that the process builds gets a communication hook: DDP's default
all-reduce (divide the bucket by the world size, then all-reduce it, as `allreduce_hook` in
torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py does), with the clock read before and after.
Each rank appends one line `[start, end]` (seconds of `time.perf_counter`) per all-reduce to
`laps-<rank>.jsonl` in the rung's `--out-dir`. Then the rung (`scaledl.ladder.ddp` unless `--rung` names
another) runs unchanged, as `python -m` runs it.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from pathlib import Path

RUNG = "scaledl.ladder.ddp"


def timed_allreduce_hook(laps):
    """DDP's default all-reduce as a communication hook, writing each call's (start, end) to `laps`."""
    import torch
    import torch.distributed as tdist

    def hook(state, bucket):
        start = time.perf_counter()
        grads = bucket.buffer().div_(tdist.get_world_size())
        tdist.all_reduce(grads)
        laps.write(json.dumps([start, time.perf_counter()]) + "\n")
        done = torch.futures.Future()
        done.set_result(grads)
        return done

    return hook


def install(out_dir: str | Path) -> None:
    """Give every DDP model this process builds from now on the timed hook, writing into `out_dir`."""
    from torch.nn.parallel import DistributedDataParallel

    Path(out_dir).mkdir(parents=True, exist_ok=True)
    laps = open(Path(out_dir, f"laps-{os.environ.get('RANK', '0')}.jsonl"), "a", buffering=1)  # noqa: SIM115
    hook = timed_allreduce_hook(laps)
    plain_init = DistributedDataParallel.__init__

    def timed_init(self, *args, **kwargs):
        plain_init(self, *args, **kwargs)
        self.register_comm_hook(None, hook)

    DistributedDataParallel.__init__ = timed_init


def read_laps(out_dir: str | Path, world_size: int) -> list[list[tuple[float, float]]]:
    """Per rank, its all-reduces' (start, end) in seconds, in the order they ran."""
    return [[tuple(json.loads(line)) for line in Path(out_dir, f"laps-{rank}.jsonl").read_text().splitlines()]
            for rank in range(world_size)]


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    rung = RUNG
    if argv[:1] == ["--rung"]:
        rung, argv = argv[1], argv[2:]
    if "--out-dir" not in argv:
        sys.exit("timed_ddp: give the rung an --out-dir; the laps are written there")
    install(argv[argv.index("--out-dir") + 1])
    sys.argv = [sys.argv[0], *argv]
    runpy.run_module(rung, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
