"""DeepSpeed, with ZeRO stages 0-3, CPU offload and its own activation checkpointing as flags.

    deepspeed --num_gpus=2 --module scaledl.ladder.deepspeed --zero-stage 2     # or torchrun, mpiexec, srun
    torchrun --nproc_per_node=2 -m scaledl.ladder.deepspeed --zero-stage 3 --offload-optimizer

`diff ddp.py deepspeed.py` is what DeepSpeed needs (marked `# New Code #`): `deepspeed.initialize` wraps
model, optimizer and scheduler in an engine that owns backward and step, configured by a dict.  ZeRO
partitions across ranks the optimizer states (stage 1), also the gradients (2), also the parameters
(3); offload keeps optimizer states (and with stage 3, parameters) in CPU memory.  --recompute full is
DeepSpeed's `checkpointing.checkpoint` (selective stays torch's: DeepSpeed's has no per-operation choice).
"""
from __future__ import annotations

import argparse  # New Code #

import deepspeed  # New Code #
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler  # New Code #

from scaledl import datasets, devices, distributed, layers, models, precision, quiet, sharding  # New Code #
from scaledl.exits import exits_cleanly
from scaledl.ladder import harness

RUNG = "deepspeed"


# New Code #: DeepSpeed is configured by a dict (or a JSON file)
def deepspeed_config(config, zero_stage: int = 0, offload_optimizer: bool = False, offload_params: bool = False,
                     world_size: int = 1, offload_activations: bool = False) -> dict:
    """DeepSpeed's JSON config, from the flags every rung shares plus ZeRO's."""
    zero = {"stage": zero_stage}
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    # What checkpointing.configure reads: with offload each block's input in CPU memory, partitioned into one piece
    # (unpartitioned, 0.19.8 empties an input already on the CPU before saving it: checkpointing.py's CPU path).
    offload = {"partition_activations": offload_activations, "cpu_checkpointing": offload_activations}
    return {
        "activation_checkpointing": offload,
        "train_micro_batch_size_per_gpu": config.batch_size,
        "gradient_accumulation_steps": config.grad_accum,  # model.step() steps the optimizer every this many
        "train_batch_size": config.batch_size * config.grad_accum * world_size,  # DeepSpeed checks the product
        "zero_optimization": zero,
        # DeepSpeed 0.19.3 and later clip the gradient norm to 1.0 unless told otherwise (older ones do
        # not); no other rung clips, and a silent clip makes the same run train differently here.
        "gradient_clipping": 0.0,
        "bf16": {"enabled": config.precision == "bf16"},
        "fp16": {"enabled": config.precision == "fp16", "initial_scale_power": 16},
        # ZeRO partitions any torch optimizer's state, but DeepSpeed refuses one outside its tested list
        # (Adam, AdamW, Adagrad and its own: ZERO_SUPPORTED_OPTIMIZERS in runtime/zero/utils.py) unless
        # told, and refuses a client optimizer with offload (ZeRORuntimeException) unless told again.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9,
    }


# New Code #: the engine replaces DDP's wrap
def wrap(model, optimizer, scheduler, ds_config: dict, device):
    """The engine this rung trains (the benchmarks time this same wiring): it moves the model to the
    device, broadcasts rank 0's weights, and from now on does backward, step and the scheduler's step."""
    distributed.deepspeed_sees(device)  # DeepSpeed takes LOCAL_RANK as the index of the rank's GPU
    quiet.deepspeed()  # DeepSpeed's messages a learner cannot act on (each named in scaledl.quiet)
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                                           config=ds_config)
    distributed.release_deepspeed_shared_memory()  # DeepSpeed never removes its /dev/shm buffers
    return engine, optimizer, scheduler


@exits_cleanly
def main(argv=None) -> int:
    # New Code #: ZeRO's options
    flags = harness.parser(RUNG)
    flags.add_argument("--zero-stage", type=int, default=0, choices=[0, 1, 2, 3], help="ZeRO stage")
    flags.add_argument("--offload-optimizer", action="store_true", help="keep optimizer states in CPU memory")
    flags.add_argument("--offload-params", action="store_true", help="keep parameters in CPU memory (stage 3)")
    flags.add_argument("--offload-activations", action="store_true",
                       help="keep each block's input in CPU memory (--recompute full)")
    flags.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # the deepspeed launcher passes it
    config, args = harness.parse(flags, argv)
    if args.offload_params and args.zero_stage != 3:  # New Code #
        flags.error("argument --offload-params: needs --zero-stage 3")
    if args.offload_activations and config.recompute != "full":  # New Code #
        flags.error("argument --offload-activations: needs --recompute full (it offloads each block's input)")
    if config.grad_accum > 1 and config.on_nonfinite == "skip":  # New Code #: a skipped micro batch would shift
        flags.error("--on-nonfinite skip skips a micro batch, and DeepSpeed counts micro batches to know when to "
                    "step: use --on-nonfinite stop with --grad-accum")  # New Code #
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
    model = models.for_config(config, data)  # New Code #: the engine moves it
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    steps_per_epoch = len(loader) // config.grad_accum  # New Code #: the engine steps the scheduler once a step
    scheduler = harness.lr_scheduler(optimizer, config, job.world_size, steps_per_epoch)  # New Code #
    # New Code #: DeepSpeed's config from the flags, then the engine that trains
    ds_config = deepspeed_config(config, args.zero_stage, args.offload_optimizer, args.offload_params, job.world_size,
                                 args.offload_activations)
    model, optimizer, scheduler = wrap(model, optimizer, scheduler, ds_config, device)
    if config.recompute == "full":  # New Code #: the blocks recompute through DeepSpeed's checkpoint, as ds_config says
        deepspeed.checkpointing.configure(None, deepspeed_config=ds_config)
        layers.use_checkpoint(model, deepspeed.checkpointing.checkpoint)
    run = harness.TorchRun(RUNG, config, device, model, optimizer, loader, scheduler=scheduler,  # New Code #
                           state=harness.DeepSpeedState(model))  # New Code #: the engine writes its own checkpoints
    input_dtype = precision.torch_dtype(config.precision)  # New Code #: the engine casts the weights, not the data
    if job.rank == 0:  # New Code #: one line for the job, not one per rank
        print(f"{RUNG}: {run.steps_per_epoch} steps per epoch on {job.world_size} ranks, {device.type}")  # New Code #

    for epoch in run.epochs():  # on --resume, from the checkpoint's epoch
        sampler.set_epoch(epoch)  # New Code #: a new order every epoch (the same on every rank)
        for x, y in run.batches(loader):  # micro batches, --grad-accum a step; on --resume, skips those trained
            x, y = x.to(device), y.to(device)
            logits = model(x.to(input_dtype))  # New Code #
            loss = F.cross_entropy(logits.float(), y)  # New Code #
            if run.guard.allows_loss(loss):  # New Code #: ZeRO keeps the gradients to itself: check the loss
                model.backward(loss)  # New Code #: divides by --grad-accum, scales, averages or reduce-scatters
                model.step()  # New Code #: at a step's last micro batch: optimizer step, zero the grads, scheduler step
            if run.end_micro_batch(loss, logits, y):  # New Code #: the engine counted the micro batches itself
                run.end_step()  # lr schedule, --checkpoint-every

    test_loss, test_accuracy = sharding.evaluate_torch(model, data, job.rank, job.world_size, device)  # New Code #
    run.finish(test_accuracy, zero_stage=args.zero_stage)  # New Code #
    torch.distributed.destroy_process_group()  # New Code #
    return 0


if __name__ == "__main__":
    harness.exit_process(main())
