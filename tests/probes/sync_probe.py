"""params_in_sync must say True for equal models and False when one rank's weights differ."""
import torch

import scaledl
from report import report
from scaledl.distributed import params_in_sync

dist = scaledl.setup(timeout_s=60)
model = torch.nn.Linear(3, 3)  # same seed on every rank: identical
same = params_in_sync(model)
with torch.no_grad():
    model.weight[0, 0] += 1e-7 * dist.rank  # a one-ulp-scale difference on rank 1 only
report(rank=dist.rank, same=same, after_change=params_in_sync(model))
scaledl.teardown()
