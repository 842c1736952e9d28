"""A script that joins a gloo group, all-gathers, and ends without teardown(), as a user's may.

    torchrun --nproc_per_node=2 -m exit_probe [scaledl|plain]

With `scaledl` it joins through scaledl.setup; with `plain`, through init_process_group alone (the
control).  SWITCH_S slows the GIL's hand-over between threads (sys.setswitchinterval), which makes
a gloo worker that still holds a finished collective's tensors at interpreter exit more likely.
"""
import os
import sys

sys.setswitchinterval(float(os.environ.get("SWITCH_S", "0.005")))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if sys.argv[1:] == ["plain"]:
    dist.init_process_group("gloo")
else:
    from scaledl import distributed  # noqa: E402

    distributed.setup(device="cpu", timeout_s=60)
x = torch.ones(4096)
out = torch.empty(dist.get_world_size() * 4096)
for _ in range(20):
    dist.all_gather_into_tensor(out, x, async_op=True).wait()
print(f"REPORT {{\"rank\": {dist.get_rank()}, \"sum\": {out.sum().item()}}}", flush=True)
