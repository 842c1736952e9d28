"""Tensor parallelism: every rank holds a slice of each layer (`parallelize_module`).

    torchrun --nproc_per_node=2 -m scaledl.ladder.tensor_parallel --epochs 3 --width 64 --depth 2 --heads 4 --seq-len 32

`diff single_torch.py tensor_parallel.py` is what tensor parallelism needs (marked `# New Code #`):
every rank trains on the same batches, and each holds 1/world_size of every block's linear layers
(the transformer's, `--model transformer`, the default here).  Megatron-LM's split (Shoeybi et al.
2019, arXiv:1909.08053, section 3): q, k, v and the MLP's first layer are cut by output features
(ColwiseParallel: each rank computes its own heads and its slice of the hidden layer, no
communication), the attention's output and the MLP's second layer by input features
(RowwiseParallel: each rank's partial sums are all-reduced): two all-reduces a block forward, and
four backward, one into each column-wise layer's input (q, k, v apart; Megatron-LM fuses them: two)
(torch/distributed/tensor/parallel/style.py, torch 2.13; counted in tests/perf/test_predict.py).

`--sequence-parallel` also cuts the rest of each block, the LayerNorms and the residual stream
between the split layers, by sequence position (Korthikanti et al. 2022, arXiv:2205.05198, section
4.2.2): each rank normalizes 1/world_size of the tokens, an all-gather gives the column-wise layers
the whole sequence, and the row-wise layers' all-reduce becomes a reduce-scatter back to each
rank's tokens.  The same bytes cross the links; the norms' activations and the residual stream are
held once across the ranks instead of on every rank (`scaledl.activations`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh  # New Code #
from torch.distributed.tensor import Replicate, Shard  # New Code #
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,  # New Code #
                                               RowwiseParallel, SequenceParallel, parallelize_module)
from torch.utils.data import DataLoader, RandomSampler

from scaledl import datasets, devices, distributed, meshes, models, sharding  # New Code #
from scaledl.exits import exits_cleanly
from scaledl.ladder import harness

RUNG = "tensor_parallel"


def wrap(model, device, mesh, sequence_parallel=False, **options):  # New Code #: a 1-D mesh of the split ranks
    """The model as this rung trains it (the benchmarks time this same wiring)."""
    # New Code #: in every block, q, k, v and the MLP's first layer split by columns, the attention's output
    # and the MLP's second layer by rows, then all-reduced; the rest (embeddings, norms, head) stays whole
    plan = {f"block*.{name}": ColwiseParallel() for name in models.COLUMNWISE}
    plan |= {f"block*.{name}": RowwiseParallel() for name in models.ROWWISE}
    if sequence_parallel:  # New Code #: the norms on 1/world_size of the tokens (Shard(1): the sequence dimension)
        tokens, whole = Shard(1), Replicate()
        gather = PrepareModuleInput(input_layouts=tokens, desired_input_layouts=whole)  # New Code #: all-gather
        after_blocks = "pool" if hasattr(model, "pool") else "head"  # New Code #: the classifier's, or gpt's head
        plan |= {"embed": PrepareModuleOutput(output_layouts=whole, desired_output_layouts=tokens),  # New Code #
                 "block*.*_norm": SequenceParallel(),  # New Code #: each rank normalizes its own tokens
                 "block*.attention": gather, "block*.mlp": gather,  # New Code #: the whole sequence for q, k, v, up
                 after_blocks: PrepareModuleInput(input_layouts=tokens, desired_input_layouts=whole,  # New Code #
                                                  use_local_output=True)}
        # New Code #: the row-wise layers' partial sums reduce-scattered to each rank's tokens, not all-reduced
        plan |= {f"block*.{name}": RowwiseParallel(output_layouts=tokens) for name in models.ROWWISE}
    return parallelize_module(model, mesh, plan, **options)  # New Code #


@exits_cleanly
def main(argv=None) -> int:
    flags = harness.parser(RUNG)  # New Code #: with --backend and --timeout
    flags.set_defaults(model="transformer")  # New Code #: the model with layers worth splitting (lesson 12's; or gpt)
    flags.add_argument("--sequence-parallel", action="store_true", help=meshes.SEQUENCE_PARALLEL_HELP)  # New Code #
    config, args = harness.parse(flags, argv)  # New Code #
    job = distributed.find_job()  # New Code #: rank, local_rank, world_size from any launcher (torchrun, mpiexec, srun)
    meshes.check_split(config, job.world_size, job.world_size, args.sequence_parallel)  # New Code #: before joining
    device = devices.pick_device(config.device, job.local_rank)  # New Code #: each rank its own GPU on the node
    if device.index is not None:  # New Code #: pin this process to it (CUDA or XPU), before any collective
        torch.accelerator.set_device_index(device.index)
    torch.distributed.init_process_group(devices.pick_backend(device, config.backend), rank=job.rank,  # New Code #
                                         world_size=job.world_size, **distributed.rendezvous(job, config.timeout))
    mesh = init_device_mesh(device.type, (job.world_size,), mesh_dim_names=("tp",))  # New Code #: one group, all ranks
    torch.manual_seed(config.seed)  # the same initial weights in every run

    data = datasets.for_config(config)
    train_set = sharding.torch_train_set(data)
    order = torch.Generator()
    sampler = RandomSampler(train_set, generator=order)  # a new shuffle every epoch
    loader = DataLoader(train_set, batch_size=config.batch_size, sampler=sampler, drop_last=True)
    model = wrap(models.for_config(config, data).to(device), device, mesh, args.sequence_parallel)  # New Code #: split
    # New Code #: not foreach, a GPU's default: it refuses DTensors mixed with plain tensors (torch/optim/optimizer.py)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum, foreach=False)
    run = harness.TorchRun(RUNG, config, device, model, optimizer, loader, replicas=1,  # New Code #: one model
                           state=harness.FullState(model, optimizer))  # New Code #: whole tensors in a checkpoint
    if job.rank == 0:  # New Code #: one line for the job, not one per rank
        print(f"{RUNG}: {run.steps_per_epoch} steps per epoch, each layer split across "  # New Code #
              f"{job.world_size} ranks{', and the norms by tokens' if args.sequence_parallel else ''}, {device.type}")

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
    torch.distributed.destroy_process_group()  # New Code #
    return 0


if __name__ == "__main__":
    harness.exit_process(main())
