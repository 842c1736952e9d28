"""The bytes one rank's forward leaves for the backward, for the language model split over the ranks
as the tensor-parallel rung splits it, without and with sequence parallelism, with and without full
recomputation (scaledl.activations.held_by_forward); report them."""
import torch
from torch.distributed.device_mesh import init_device_mesh

import scaledl
from report import report
from scaledl import activations, models
from scaledl.ladder import tensor_parallel

SIZES = [(32, 8, 64, 2, 4), (18, 3, 96, 3, 6)]  # seq_len, batch, width, depth, heads

dist = scaledl.setup(timeout_s=120)
mesh = init_device_mesh(dist.device.type, (dist.world_size,), mesh_dim_names=("tp",))
held = []
for seq_len, batch, width, depth, heads in SIZES:
    x = torch.randint(0, models.VOCAB_SIZE, (batch, seq_len), generator=torch.Generator().manual_seed(1))
    for recompute in ("none", "full"):
        for sequence_parallel in (False, True):
            torch.manual_seed(0)
            model = models.gpt(width, depth, heads, seq_len, recompute=recompute).to(dist.device)
            tensor_parallel.wrap(model, dist.device, mesh, sequence_parallel)
            held.append({"sizes": [seq_len, batch, width, depth, heads], "recompute": recompute,
                         "sequence_parallel": sequence_parallel,
                         "bytes": activations.held_by_forward(model, x)[0]})
report(rank=dist.rank, tp=dist.world_size, held=held)
scaledl.teardown()
