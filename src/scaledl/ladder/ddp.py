"""PyTorch DistributedDataParallel (DDP), one process per device.

    torchrun --nproc_per_node=2 -m scaledl.ladder.ddp --epochs 3      # or mpiexec, srun, ...

`diff single_torch.py ddp.py` is what DDP needs (marked `# New Code #`): each rank trains on its shard;
in backward, DDP averages gradients bucket by bucket while backward runs, so all ranks step alike.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP  # New Code #
from torch.utils.data import DataLoader, DistributedSampler  # New Code #

from scaledl import datasets, devices, distributed, models, sharding  # New Code #
from scaledl.exits import exits_cleanly
from scaledl.ladder import harness

RUNG = "ddp"


def wrap(model, device, **options):
    """The model as this rung trains it (the benchmarks time this same wiring)."""
    # New Code #: broadcasts rank 0's weights; averages gradients in backward (as views into its buckets: one copy less)
    return DDP(model, device_ids=None if device.type == "cpu" else [device], gradient_as_bucket_view=True, **options)


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
    model = wrap(models.for_config(config, data).to(device), device)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    run = harness.TorchRun(RUNG, config, device, model.module, optimizer, loader)  # New Code #: save the plain model
    if job.rank == 0:  # New Code #: one line for the job, not one per rank
        print(f"{RUNG}: {run.steps_per_epoch} steps per epoch on {job.world_size} ranks, {device.type}")  # New Code #

    for epoch in run.epochs():  # on --resume, from the checkpoint's epoch
        sampler.set_epoch(epoch)  # New Code #: a new order every epoch (the same on every rank)
        for x, y in run.batches(loader):  # micro batches, --grad-accum a step; on --resume, skips those trained
            x, y = x.to(device), y.to(device)
            model.require_backward_grad_sync = run.last_micro_batch  # New Code #: all-reduce in the last backward only
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
