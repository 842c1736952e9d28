"""PyTorch's context-parallel attention (scaledl.context_parallel.torch_attention) on this job's ranks,
against full attention on one rank; report the largest difference, or the one line where it cannot run."""
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

import scaledl
from report import report
from scaledl import context_parallel

dist = scaledl.setup(timeout_s=120)
mesh = init_device_mesh(dist.device.type, (dist.world_size,), mesh_dim_names=("cp",))
generator = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(2, 4, 64 * dist.world_size, 32, generator=generator).to(dist.device) for _ in range(3))
found = {"rank": dist.rank, "device": dist.device.type}
for causal in (False, True):
    try:
        out = context_parallel.torch_attention(q, k, v, mesh, causal)
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        found[f"causal={causal}"] = (out - expected).abs().max().item()
    except context_parallel.ContextParallelUnavailable as error:
        found[f"causal={causal}"] = str(error)
report(**found)
scaledl.teardown()
