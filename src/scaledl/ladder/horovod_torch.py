"""Horovod with PyTorch.

    horovodrun -np 2 -H localhost:2 python -m scaledl.ladder.horovod_torch     # or mpirun, mpiexec, srun

`diff single_torch.py horovod_torch.py` is what Horovod needs (marked `# New Code #`): it wraps the
optimizer, which averages each gradient as soon as backward makes it; --fp16-allreduce, --adasum.
"""
from __future__ import annotations

import contextlib  # New Code #
import math  # New Code #
import os  # New Code #

import horovod.torch as hvd  # New Code #
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler  # New Code #

from scaledl import datasets, devices, distributed, models, sharding  # New Code #
from scaledl.exits import exits_cleanly
from scaledl.ladder import harness

RUNG = "horovod_torch"


def wrap(model, device, **options):
    """The model as this rung trains it (the benchmarks time this same wiring)."""
    return model  # one device: as it is


def distributed_optimizer(optimizer, model, fp16_allreduce: bool = False, adasum: bool = False,  # New Code #
                          grad_accum: int = 1):
    """All-reduce each gradient in a backward hook as soon as it is ready (fused into few messages)."""
    return hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), op=hvd.Adasum if adasum else hvd.Average,
        compression=hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none,
        backward_passes_per_step=grad_accum)  # in every grad_accum-th backward only


@exits_cleanly
def main(argv=None) -> int:
    # New Code #: Horovod's options
    flags = harness.parser(RUNG, without=("backend",))  # Horovod picks its own
    flags.add_argument("--fp16-allreduce", action="store_true", help="send gradients as fp16")
    flags.add_argument("--adasum", action="store_true", help="combine gradients with Adasum instead of averaging")
    config, args = harness.parse(flags, argv)
    # New Code #: Adasum steps in backward's hooks
    if args.adasum and (config.precision == "fp16" or config.on_nonfinite == "skip" or config.grad_accum > 1):
        flags.error("--adasum applies each step in backward's hooks, before fp16 unscales the gradients, before the "
                    "non-finite check and after every micro batch: use --precision bf16 or fp32, --on-nonfinite stop "
                    "and no --grad-accum")  # New Code #
    # New Code #: under gloo, a peer that stops answering fails the job after --timeout.
    os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(math.ceil(config.timeout)))
    os.environ.setdefault("HOROVOD_LOG_LEVEL", "fatal")  # New Code #: a lost peer is our one line, not Horovod's log
    job = distributed.find_job()  # New Code #: a half-set launcher environment is one line, not a silent single rank
    hvd.init()  # New Code #: rank, local_rank and size from horovodrun or MPI
    distributed.check_horovod_size(job, hvd.size())  # New Code #: torchrun's ranks would each train alone
    device = devices.pick_device(config.device, hvd.local_rank())  # New Code #: each rank its own GPU on the node
    if device.index is not None:  # New Code #: pin this process to it (CUDA or XPU)
        torch.accelerator.set_device_index(device.index)
    torch.manual_seed(config.seed)  # the same initial weights in every run

    data = datasets.for_config(config)
    train_set = sharding.torch_train_set(data)
    sampler = DistributedSampler(train_set, hvd.size(), hvd.rank(), seed=config.seed)  # New Code #: 1/size each
    loader = DataLoader(train_set, batch_size=config.batch_size, sampler=sampler, drop_last=True)
    model = wrap(models.for_config(config, data).to(device), device)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    optimizer = distributed_optimizer(optimizer, model, args.fp16_allreduce, args.adasum,  # New Code #
                                      config.grad_accum)
    run = harness.TorchRun(RUNG, config, device, model, optimizer, loader, comm=harness.horovod_comm(hvd))  # New Code #
    # New Code #: every rank starts from rank 0's weights and optimizer state (its checkpoint's, on --resume).
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    if hvd.rank() == 0:  # New Code #: one line for the job, not one per rank
        print(f"{RUNG}: {run.steps_per_epoch} steps per epoch on {hvd.size()} ranks, {device.type}")  # New Code #

    for epoch in run.epochs():  # on --resume, from the checkpoint's epoch
        sampler.set_epoch(epoch)  # New Code #: a new order every epoch (the same on every rank)
        for x, y in run.batches(loader):  # micro batches, --grad-accum a step; on --resume, skips those trained
            x, y = x.to(device), y.to(device)
            with run.autocast():  # bf16 or fp16 with --precision
                logits = model(x)
                loss = F.cross_entropy(logits.float(), y)
            # Gradients add up in .grad: dividing by --grad-accum makes their sum the big batch's mean.
            run.scaler.scale(loss / config.grad_accum).backward()  # fp16 scales the loss up: small gradients survive
            if not run.end_micro_batch(loss, logits, y):  # metrics; False until the step's last micro batch
                continue
            optimizer.synchronize()  # New Code #: wait for the averaged gradients before anyone reads them
            if run.guard.allows_step(model.parameters(), loss):  # NaN or inf gradients: stop, or skip the step
                # New Code #: already done above (with Adasum, --on-nonfinite is stop: its hooks have stepped)
                with contextlib.nullcontext() if args.adasum else optimizer.skip_synchronize():
                    run.scaler.step(optimizer)  # New Code #
            run.scaler.update()
            optimizer.zero_grad()  # the next step's gradients start from zero
            run.end_step()  # lr schedule, --checkpoint-every

    test_loss, test_accuracy = sharding.evaluate_torch(model, data, hvd.rank(), hvd.size(), device,  # New Code #
                                                       all_reduce=lambda totals: hvd.allreduce(totals, op=hvd.Sum))
    run.finish(test_accuracy)
    return 0


if __name__ == "__main__":
    harness.exit_process(main())
