"""One DeepSpeed engine step (ZeRO stage from argv) on a tiny model; report the parameters' sum."""
from report import report
import sys

import deepspeed
import torch

from scaledl.distributed import release_deepspeed_shared_memory, teardown

stage = int(next((a for a in sys.argv[1:] if not a.startswith("--local_rank")), 0))  # the launcher adds --local_rank
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": stage},
          "zero_allow_untested_optimizer": True}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
release_deepspeed_shared_memory()
rank = engine.global_rank
generator = torch.Generator().manual_seed(rank)
x, y = torch.randn(4, 8, generator=generator), torch.randn(4, 2, generator=generator)
loss = torch.nn.functional.mse_loss(engine(x), y)
engine.backward(loss)
engine.step()
with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=stage == 3):
    checksum = sum(p.detach().double().sum().item() for p in engine.module.parameters())
report(rank=rank, world_size=engine.world_size, param_sum=checksum)
# Leave the process group before exit, as the rungs do: a rank that exits with gloo's threads still
# running can abort at interpreter shutdown ("terminate called without an active exception").
teardown()
