"""Two DeepSpeed steps of the ladder's CNN at each ZeRO stage given, in fp32 and then in bf16 (one engine
each, built as the rung builds it); report the bytes counted from each engine.  One launch for every
stage: DeepSpeed's start-up is most of a launch's time."""
import sys

import torch
import torch.nn.functional as F

import scaledl
from report import report
from scaledl import models, precision, zero_memory
from scaledl.ladder import deepspeed as deepspeed_rung

stages = [int(a) for a in sys.argv[1:] if not a.startswith("--local_rank")]
dist = scaledl.setup(timeout_s=120)
counted = {}
for stage, name in [(stage, name) for stage in stages for name in ("fp32", "bf16")]:
    config = scaledl.Config(batch_size=8, precision=name)
    torch.manual_seed(0)
    model = models.torch_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    # The engine exactly as the DeepSpeed rung builds it.
    ds_config = deepspeed_rung.deepspeed_config(config, stage, world_size=dist.world_size)
    engine, _, _ = deepspeed_rung.wrap(model, optimizer, None, ds_config, dist.device)
    x, y = torch.randn(8, 1, 28, 28, dtype=precision.torch_dtype(name)), torch.randint(0, 10, (8,))
    for step in range(2):
        engine.backward(F.cross_entropy(engine(x).float(), y))
        if step == 1:
            counted[f"{stage} {name}"] = {**zero_memory.measure(engine),
                             "predicted_total": zero_memory.predict_for_engine(engine)["total"]}
        engine.step()
    engine.destroy()
report(rank=dist.rank, num_params=sum(p.numel() for p in models.torch_cnn().parameters()), counted=counted)
scaledl.teardown()
