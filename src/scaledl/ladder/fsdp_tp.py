"""2D parallelism: tensor parallelism inside groups of ranks, FSDP2 across them.

    torchrun --nproc_per_node=4 -m scaledl.ladder.fsdp_tp --tp 2 --epochs 3 --width 64 --depth 2 --heads 4 --seq-len 32

`diff fsdp.py fsdp_tp.py` is what the second dimension needs (marked `# New Code #`): the ranks
form a dp x tp grid (a 2-D `DeviceMesh`, `init_device_mesh(..., mesh_dim_names=("dp", "tp"))`).
The tp ranks of a row split every block's layers as tensor_parallel.py does and train on the same
batches; the dp rows train on different shards of the data, and FSDP2 shards what each rank holds
once more across its column: each rank keeps 1/(dp*tp) of the split layers and 1/dp of the rest.
How large models are trained today (torchtitan/models/llama3/infra/parallelize.py: `apply_tp`,
then `apply_fsdp` over the data-parallel mesh); on a GPU cluster tp stays inside a node, whose GPUs
share NVLink, and dp crosses the network, which carries only FSDP2's all-gathers and reduce-scatters.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh  # New Code #
from torch.distributed.fsdp import fully_shard  # New Code #
from torch.utils.data import DataLoader, DistributedSampler  # New Code #

from scaledl import datasets, devices, distributed, meshes, models, precision, sharding  # New Code #
from scaledl.exits import exits_cleanly
from scaledl.ladder import harness
from scaledl.ladder import tensor_parallel  # New Code #: its split of each block

RUNG = "fsdp_tp"


def wrap(model, device, mesh, sequence_parallel=False, **options):  # New Code #: the dp x tp mesh
    """The model as this rung trains it (the benchmarks time this same wiring)."""
    tensor_parallel.wrap(model, device, mesh["tp"], sequence_parallel)  # New Code #: split each block across a row
    for layer in model:  # New Code #: shard every layer with weights (each is gathered only while it runs) ...
        if any(True for _ in layer.parameters()):  # New Code #
            fully_shard(layer, mesh=mesh["dp"], **options)  # New Code #: ... across the dp ranks of a column
    return fully_shard(model, mesh=mesh["dp"], **options)  # New Code #: ... then the rest


@exits_cleanly
def main(argv=None) -> int:
    flags = harness.parser(RUNG)  # New Code #: with --backend and --timeout
    flags.set_defaults(model="transformer")  # New Code #: the model with layers worth splitting
    flags.add_argument("--tp", type=int, help="ranks per tp group (default: a node's)")  # New Code #
    flags.add_argument("--sequence-parallel", action="store_true", help=meshes.SEQUENCE_PARALLEL_HELP)  # New Code #
    config, args = harness.parse(flags, argv)  # New Code #
    job = distributed.find_job()  # New Code #: rank, local_rank, world_size from any launcher (torchrun, mpiexec, srun)
    tp = meshes.tp_in_node(config.heads, job.local_world_size) if args.tp is None else args.tp  # New Code #
    meshes.check_split(config, tp, job.world_size, args.sequence_parallel)  # New Code #: before joining the group
    device = devices.pick_device(config.device, job.local_rank)  # New Code #: each rank its own GPU on the node
    if device.index is not None:  # New Code #: pin this process to it (CUDA or XPU), before any collective
        torch.accelerator.set_device_index(device.index)
    torch.distributed.init_process_group(devices.pick_backend(device, config.backend), rank=job.rank,  # New Code #
                                         world_size=job.world_size, **distributed.rendezvous(job, config.timeout))
    # New Code #: rank r sits in row r // tp (its dp index) and column r % tp: consecutive ranks share a node
    mesh = init_device_mesh(device.type, (job.world_size // tp, tp), mesh_dim_names=("dp", "tp"))
    dp_rank, dp_size = mesh["dp"].get_local_rank(), mesh["dp"].size()
    torch.manual_seed(config.seed)  # the same initial weights in every run

    data = datasets.for_config(config)
    train_set = sharding.torch_train_set(data)
    sampler = DistributedSampler(train_set, dp_size, dp_rank, seed=config.seed)  # New Code #: 1/dp each, per row
    loader = DataLoader(train_set, batch_size=config.batch_size, sampler=sampler, drop_last=True)
    mixed = precision.fsdp_policy(config.precision)  # New Code #: bf16 or fp16 weights gathered, fp32 shards kept
    model = wrap(models.for_config(config, data).to(device), device, mesh, args.sequence_parallel,  # New Code #
                 mp_policy=mixed)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    run = harness.TorchRun(RUNG, config, device, model, optimizer, loader, replicas=dp_size,  # New Code #
                           state=harness.FullState(model, optimizer))  # New Code #
    if job.rank == 0:  # New Code #: one line for the job, not one per rank
        print(f"{RUNG}: {run.steps_per_epoch} steps per epoch, {dp_size} x {tp} ranks (dp x tp), "  # New Code #
              f"{'sequence parallel, ' if args.sequence_parallel else ''}{device.type}")

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

    test_loss, test_accuracy = sharding.evaluate_torch(model, data, dp_rank, dp_size, device)  # New Code #: per row
    run.finish(test_accuracy)
    torch.distributed.destroy_process_group()  # New Code #
    return 0


if __name__ == "__main__":
    harness.exit_process(main())
