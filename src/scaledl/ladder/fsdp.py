"""FSDP2, PyTorch's own ZeRO-3 (`fully_shard`), to compare with DeepSpeed's.

    torchrun --nproc_per_node=2 -m scaledl.ladder.fsdp --epochs 3      # or mpiexec, srun, ...

`diff ddp.py fsdp.py` is what FSDP2 needs (marked `# New Code #`): each layer's parameters are split
across ranks, all-gathered just before the layer runs forward or backward, and its gradients
reduce-scattered after, so every rank keeps (and updates) only its shard of parameters, gradients
and optimizer states.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard  # New Code #
from torch.utils.data import DataLoader, DistributedSampler  # New Code #

from scaledl import datasets, devices, distributed, models, precision, sharding  # New Code #
from scaledl.exits import exits_cleanly
from scaledl.ladder import harness

RUNG = "fsdp"


def wrap(model, device, **options):
    """The model as this rung trains it (the benchmarks time this same wiring)."""
    for layer in model:  # New Code #: shard every layer with weights (each is gathered only while it runs) ...
        if any(True for _ in layer.parameters()):  # New Code #
            fully_shard(layer, **options)  # New Code #
    return fully_shard(model, **options)  # New Code #: ... then the rest


@exits_cleanly
def main(argv=None) -> int:
    config = harness.parse_args(RUNG, argv)  # New Code #: with --backend and --timeout
    job = distributed.find_job()  # New Code #: rank, local_rank, world_size from any launcher (torchrun, mpiexec, srun)
    device = devices.pick_device(config.device, job.local_rank)  # New Code #: each rank its own GPU on the node
    if device.index is not None:  # New Code #: pin this process to it (CUDA or XPU), before any collective
        torch.accelerator.set_device_index(device.index)
    torch.distributed.init_process_group(devices.pick_backend(device, config.backend), rank=job.rank,  # New Code #
                                         world_size=job.world_size, **distributed.rendezvous(job, config.timeout))
    torch.manual_seed(config.seed)  # the same initial weights in every run

    data = datasets.for_config(config)
    train_set = sharding.torch_train_set(data)
    sampler = DistributedSampler(train_set, job.world_size, job.rank, seed=config.seed)  # New Code #: 1/world_size each
    loader = DataLoader(train_set, batch_size=config.batch_size, sampler=sampler, drop_last=True)
    mixed = precision.fsdp_policy(config.precision)  # New Code #: bf16 or fp16 weights gathered, fp32 shards kept
    model = wrap(models.for_config(config, data).to(device), device, mp_policy=mixed)  # New Code #
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    run = harness.TorchRun(RUNG, config, device, model, optimizer, loader,  # New Code #: whole tensors in a checkpoint
                           state=harness.FullState(model, optimizer))  # New Code #
    if job.rank == 0:  # New Code #: one line for the job, not one per rank
        print(f"{RUNG}: {run.steps_per_epoch} steps per epoch on {job.world_size} ranks, {device.type}")  # New Code #

    for epoch in run.epochs():  # on --resume, from the checkpoint's epoch
        sampler.set_epoch(epoch)  # New Code #: a new order every epoch (the same on every rank)
        for x, y in run.batches(loader):  # micro batches, --grad-accum a step; on --resume, skips those trained
            x, y = x.to(device), y.to(device)
            model.set_requires_gradient_sync(run.last_micro_batch)  # New Code #: reduce-scatter in the last one only
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

    test_loss, test_accuracy = sharding.evaluate_torch(model, data, job.rank, job.world_size, device)  # New Code #
    run.finish(test_accuracy)
    torch.distributed.destroy_process_group()  # New Code #
    return 0


if __name__ == "__main__":
    harness.exit_process(main())
