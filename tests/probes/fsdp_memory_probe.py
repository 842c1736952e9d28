"""Two steps of the ladder's CNN wrapped as the FSDP2 rung wraps it, in fp32 and then in bf16 (the
rung's MixedPrecisionPolicy); report the bytes this rank keeps and the dtype of the weights each
layer computes with (seen from a forward hook, while they are gathered)."""
import torch
import torch.nn.functional as F

import scaledl
from report import report
from scaledl import models, precision, report as summary
from scaledl.ladder import fsdp

dist = scaledl.setup(timeout_s=120)
found = {}
for name in ("fp32", "bf16"):
    torch.manual_seed(0)
    model = fsdp.wrap(models.torch_cnn(), dist.device, mp_policy=precision.fsdp_policy(name))
    gathered = set()
    for layer in model:
        if isinstance(layer, (torch.nn.Linear, torch.nn.Conv2d)):
            layer.register_forward_pre_hook(lambda module, _: gathered.add(str(module.weight.dtype)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    for _ in range(2):
        F.cross_entropy(model(x).float(), y).backward()
        optimizer.step()
    found[name] = {"state_bytes": summary.model_state_bytes(model, optimizer), "gathered": sorted(gathered),
                   "shards": sorted({str(p.to_local().dtype) for p in model.parameters()}),
                   "grads": sorted({str(p.grad.to_local().dtype) for p in model.parameters()})}
report(rank=dist.rank, num_params=sum(p.numel() for p in models.torch_cnn().parameters()), found=found)
scaledl.teardown()
