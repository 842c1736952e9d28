"""Each rank adds known values for 5 steps; rank 0 reports the reduced record."""
import sys
import time

import torch

import scaledl
from report import report

dist = scaledl.setup(timeout_s=60)
history = scaledl.History(sys.argv[1], dist.rank, dist.world_size, gather=scaledl.torch_gather)
for _ in range(5):
    time.sleep(0.01 * (dist.rank + 1))
    history.step(torch.tensor(1.0 + dist.rank), torch.tensor(2 + dist.rank), batch_size=8)
report(rank=dist.rank, record=history.log(step=5, epoch=1.0))
scaledl.teardown()
