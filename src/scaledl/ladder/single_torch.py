"""One device, PyTorch: the baseline every PyTorch rung is a diff of.

    python -m scaledl.ladder.single_torch --epochs 3

A plain loop (data, model, optimizer; forward, loss, backward, step).  What every rung does the
same way (metrics, checkpoints, lr schedule, precision, NaN guard, summary) is `run` (scaledl.ladder.harness).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, RandomSampler

from scaledl import datasets, devices, models, sharding
from scaledl.exits import exits_cleanly
from scaledl.ladder import harness

RUNG = "single_torch"


def wrap(model, device, **options):
    """The model as this rung trains it (the benchmarks time this same wiring)."""
    return model  # one device: as it is


@exits_cleanly
def main(argv=None) -> int:
    config = harness.parse_args(RUNG, argv, without=harness.COLLECTIVE_FLAGS)  # one device: no collectives
    device = devices.pick_device(config.device)  # a GPU (CUDA or XPU) when there is one, else the CPU
    torch.manual_seed(config.seed)  # the same initial weights in every run

    data = datasets.for_config(config)
    train_set = sharding.torch_train_set(data)
    order = torch.Generator()
    sampler = RandomSampler(train_set, generator=order)  # a new shuffle every epoch
    loader = DataLoader(train_set, batch_size=config.batch_size, sampler=sampler, drop_last=True)
    model = wrap(models.for_config(config, data).to(device), device)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    run = harness.TorchRun(RUNG, config, device, model, optimizer, loader)
    print(f"{RUNG}: {run.steps_per_epoch} steps per epoch on {device}")

    for epoch in run.epochs():  # on --resume, from the checkpoint's epoch
        order.manual_seed(config.seed + epoch)  # a new order every epoch, and the same one after a resume
        for x, y in run.batches(loader):  # micro batches, --grad-accum a step; on --resume, skips those trained
            x, y = x.to(device), y.to(device)
            with run.autocast():  # bf16 or fp16 with --precision
                logits = model(x)
                loss = F.cross_entropy(logits.float(), y)
            # Gradients add up in .grad: dividing by --grad-accum makes their sum the big batch's mean.
            run.scaler.scale(loss / config.grad_accum).backward()  # fp16 scales the loss up: small gradients survive
            if not run.end_micro_batch(loss, logits, y):  # metrics; False until the step's last micro batch
                continue
            if run.guard.allows_step(model.parameters(), loss):  # NaN or inf gradients: stop, or skip the step
                run.scaler.step(optimizer)  # optimizer.step(), with the gradients scaled back
            run.scaler.update()
            optimizer.zero_grad()  # the next step's gradients start from zero
            run.end_step()  # lr schedule, --checkpoint-every

    test_loss, test_accuracy = sharding.evaluate_torch(model, data, 0, 1, device)
    run.finish(test_accuracy)
    return 0


if __name__ == "__main__":
    harness.exit_process(main())
