"""Join the job with scaledl.setup, all-reduce once, and report what this rank found."""
from report import report
import sys

import torch
import torch.distributed as dist

import scaledl

init = "--no-init" not in sys.argv
info = scaledl.setup(timeout_s=60, init_process_group=init)
total = None
if init:
    value = torch.tensor([float(info.rank + 1)])
    dist.all_reduce(value)
    total = value.item()
report(**{
    "rank": info.rank, "local_rank": info.local_rank, "world_size": info.world_size,
    "local_world_size": info.local_world_size, "device": str(info.device), "backend": info.backend,
    "launcher": info.launcher, "master_addr": info.master_addr, "master_port": info.master_port,
    "allreduce_sum": total})
scaledl.teardown()
