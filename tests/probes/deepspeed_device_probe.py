"""One rank on GPU 0 that the launcher calls local rank 1, as on local rank 1 of a Polaris node, where
the affinity wrapper shows each rank only its own GPU: build the DeepSpeed rung's engine and step it."""
import os
import sys

import torch
import torch.nn.functional as F

import scaledl
from report import report
from scaledl import distributed, models
from scaledl.ladder import deepspeed as deepspeed_rung

stage = int(sys.argv[1])
dist = scaledl.setup(timeout_s=120)
os.environ["LOCAL_RANK"] = "1"  # what PALS' local rank gives on the node's second rank
model = models.torch_cnn()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
config = deepspeed_rung.deepspeed_config(scaledl.Config(batch_size=8), stage, world_size=dist.world_size)
engine, _, _ = deepspeed_rung.wrap(model, optimizer, None, config, dist.device)
x, y = torch.randn(8, 1, 28, 28, device=dist.device), torch.randint(0, 10, (8,), device=dist.device)
for step in range(2):
    engine.backward(F.cross_entropy(engine(x), y))
    engine.step()
report(rank=dist.rank, engine_device=str(engine.device), local_rank=os.environ["LOCAL_RANK"], steps=step + 1)
# Leave as the rungs do (scaledl.distributed.exit_process): every group's collectives finished, past gloo's
# workers, without interpreter finalization, which can abort a finished rank while a group is still held.
distributed.teardown()
distributed.exit_process(0)
