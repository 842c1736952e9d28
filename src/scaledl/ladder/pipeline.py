"""Model parallelism, the model split across ranks as a pipeline (`torch.distributed.pipelining`).

    torchrun --nproc_per_node=2 -m scaledl.ladder.pipeline --epochs 3 --microbatches 4

Data parallelism copies the whole model to every rank; when a model does not fit on one device,
split it instead.  Here rank 0 holds the convolutional layers and rank 1 the classifier: each
batch is cut into micro batches, rank 0 sends each micro batch's activations to rank 1 as soon
as they are ready (so both ranks work at once: GPipe's schedule), and gradients flow back the
same way.  Every rank sees every sample; each updates only its own layers.  It trains in fp32
and writes the whole model at the end (no checkpoints to resume from): those flags are not offered.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.utils.data import DataLoader, RandomSampler

from scaledl import datasets, devices, distributed, models, sharding
from scaledl.exits import exits_cleanly
from scaledl.ladder import harness
from scaledl.config import ConfigError

RUNG = "pipeline"
SPLIT_AT = 6  # the CNN's index of Flatten: convolutions on rank 0, classifier on rank 1
# Its stages split the CNN (SPLIT_AT): the transformer's flags are refused like the others.
NOT_HONOURED = (*harness.CHECKPOINT_FLAGS, *harness.GUARD_FLAGS, "precision", *harness.MODEL_FLAGS,
                "grad_accum")  # its --microbatches are its accumulation


def check_stages(num_stages: int) -> None:
    if num_stages != 2:
        raise ConfigError(f"the pipeline rung splits its model in 2 stages; run it with 2 ranks, not {num_stages}")


def split_model(model: torch.nn.Sequential, num_stages: int) -> list[torch.nn.Sequential]:
    check_stages(num_stages)
    # Slicing a Sequential keeps the layers' names, so the stages' state dicts merge back into the whole.
    return [model[:SPLIT_AT], model[SPLIT_AT:]]


@exits_cleanly
def main(argv=None) -> int:
    flags = harness.parser(RUNG, without=NOT_HONOURED)
    flags.add_argument("--microbatches", type=int, default=4, help="micro batches per batch (pipeline depth)")
    config, args = harness.parse(flags, argv)
    if args.microbatches < 1 or config.batch_size % args.microbatches:
        flags.error(f"argument --microbatches: must divide --batch-size {config.batch_size}, got {args.microbatches}")
    job = distributed.find_job()
    check_stages(job.world_size)  # before joining the group
    device = devices.pick_device(config.device, job.local_rank)
    if device.index is not None:
        torch.accelerator.set_device_index(device.index)
    dist.init_process_group(devices.pick_backend(device, config.backend), rank=job.rank, world_size=job.world_size,
                            **distributed.rendezvous(job, config.timeout))
    rank, is_first = job.rank, job.rank == 0
    torch.manual_seed(config.seed)  # every rank builds the same whole model, then keeps its own stage

    data = datasets.load_dataset(config.dataset, config.data_dir, config.train_limit)
    train_set = sharding.torch_train_set(data)
    # No data parallelism: every stage walks the same batches in the same order.
    order = torch.Generator()
    loader = DataLoader(train_set, batch_size=config.batch_size, sampler=RandomSampler(train_set, generator=order),
                        drop_last=True)
    full_model = models.for_dataset(data)
    model = split_model(full_model, job.world_size)[rank].to(device)
    stage = PipelineStage(model, rank, job.world_size, device)
    schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches,
                             loss_fn=lambda logits, y: F.cross_entropy(logits.float(), y))
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    # The global batch is one rank's batch: the learning rate scales with world size 1.
    run = harness.TorchRun(RUNG, config, device, model, optimizer, loader, state=harness.StageState(model, optimizer),
                           scheduler=harness.lr_scheduler(optimizer, config, 1, len(loader)))

    for epoch in run.epochs():
        order.manual_seed(config.seed + epoch)
        for x, y in run.batches(loader):
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            if is_first:  # forward and backward of every micro batch, sending activations on
                schedule.step(x)
                loss = logits = None  # the first stage sees no loss: it counts no samples
            else:  # receives activations, computes the loss, sends gradients back
                losses = []
                logits = schedule.step(target=y, losses=losses)
                loss = torch.stack(losses).detach().mean()
            optimizer.step()
            run.scheduler.step()  # this rung's own schedule (the harness steps none it is given)
            run.end_step(loss, logits, y)

    # Gather the stages into the whole model on every rank, evaluate it there, and save it.
    stages = [None] * job.world_size
    dist.all_gather_object(stages, {k: v.cpu() for k, v in model.state_dict().items()})
    full_model.load_state_dict({k: v for part in stages for k, v in part.items()})
    test_loss, test_accuracy = sharding.evaluate_torch(full_model.to(device), data, 0, 1, device)
    if run.is_main:
        torch.save(full_model.state_dict(), f"{config.out_dir}/model.pt")
    stage_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    run.finish(test_accuracy, stage_param_bytes=stage_bytes)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    harness.exit_process(main())
