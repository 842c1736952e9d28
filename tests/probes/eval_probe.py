"""Evaluate a seeded, untrained-then-briefly-trained model on this rank's test shard; report the global result."""
import torch

import scaledl
from report import report
from scaledl import models, sharding

dist = scaledl.setup(timeout_s=60)
data = scaledl.load_dataset()
torch.manual_seed(0)
model = models.for_dataset(data)
loss, accuracy = sharding.evaluate_torch(model, data, dist.rank, dist.world_size, dist.device, batch_size=333)
shard = sharding.eval_indices(len(data.y_test), dist.rank, dist.world_size)
report(rank=dist.rank, loss=loss, accuracy=accuracy, shard=len(shard))
scaledl.teardown()
