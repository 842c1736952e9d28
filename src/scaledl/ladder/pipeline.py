"""Model parallelism, the model split across ranks as a pipeline (`torch.distributed.pipelining`).

    torchrun --nproc_per_node=2 -m scaledl.ladder.pipeline --epochs 3 --microbatches 4
    torchrun --nproc_per_node=4 -m scaledl.ladder.pipeline --model gpt --schedule 1f1b --microbatches 8
    torchrun --nproc_per_node=4 -m scaledl.ladder.pipeline --model gpt --dp 2     # 2 pipelines of 2 stages

Data parallelism copies the whole model to every rank; when a model does not fit on one device,
split it instead.  Each batch is cut into micro batches; a stage sends each micro batch's
activations to the next as soon as they are ready (so the stages work at once), and gradients flow
back the same way.  Every rank sees every sample; each updates only its own layers.  The CNN splits
in 2 stages (convolutions, then the classifier); a transformer (`--model gpt` or `transformer`)
into as many stages as there are ranks, its blocks shared out evenly (the embeddings go with the
first, the head with the last).  `--schedule` orders the micro batches' forwards and backwards:

- `gpipe`: every forward, then every backward (ScheduleGPipe): a stage holds all m micro batches'
  activations at the backward's start;
- `1f1b`: stage s runs min(m, p - s) warm-up forwards, then one backward and one forward in turn
  (Schedule1F1B): the same bubble, (p - 1)/(m + p - 1) of the step, and at most p - s micro batches'
  activations held;
- `interleaved`: each rank holds two chunks of the model, v = 2 virtual stages (rank r: chunks r
  and r + p), so the bubble shrinks to (p - 1)/(v·m + p - 1) for more sends
  (ScheduleInterleaved1F1B; from Narayanan et al. 2021, arXiv:2104.04473, section 2.2.2).

`--dp` runs pipelines side by side on different shards of the data, their gradients averaged after
each step's schedule (a 2-D grid of ranks, dp x pp).  It trains in fp32.  A checkpoint
(`--checkpoint-every`, and at the end) holds the whole model, each stage's tensors gathered by
name, and `--resume` gives each rank its own back (harness.StageState), at the step it stopped.
"""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.distributed as dist
import torch.distributed.pipelining as pipelining
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.utils.data import DataLoader, DistributedSampler

from scaledl import datasets, devices, distributed, models, pipeline_events, sharding
from scaledl.config import ConfigError
from scaledl.exits import exits_cleanly
from scaledl.ladder import harness

RUNG = "pipeline"
SPLIT_AT = 6  # the CNN's index of Flatten: convolutions on rank 0, classifier on rank 1
NOT_HONOURED = (*harness.GUARD_FLAGS, "precision", "grad_accum")  # its --microbatches are its accumulation
# --schedule -> torch.distributed.pipelining's class, and the model chunks each rank holds.
SCHEDULES = {"gpipe": ("ScheduleGPipe", 1), "1f1b": ("Schedule1F1B", 1), "interleaved": ("ScheduleInterleaved1F1B", 2)}


def split_model(model: torch.nn.Sequential, num_chunks: int, model_name: str = "cnn") -> list[torch.nn.Sequential]:
    """The model cut into `num_chunks` consecutive pieces.  Each keeps its layers' names, so the pieces'
    state dicts merge back into the whole model's."""
    if model_name == "cnn":
        if num_chunks != 2:
            raise ConfigError(f"the pipeline rung splits the CNN in 2 stages; run it with 2 ranks and --schedule gpipe "
                              f"or 1f1b, or split a transformer (--model gpt), not {num_chunks} stages")
        return [model[:SPLIT_AT], model[SPLIT_AT:]]
    names = [name for name, _ in model.named_children()]
    blocks = [name for name in names if name.startswith("block")]
    if len(blocks) % num_chunks:
        raise ConfigError(f"--depth {len(blocks)} blocks do not split evenly into {num_chunks} pipeline stages: "
                          f"give a --depth that {num_chunks} divides")
    per_chunk = len(blocks) // num_chunks
    first, last = names.index(blocks[0]), names.index(blocks[-1])
    pieces = []
    for chunk in range(num_chunks):
        start = first + chunk * per_chunk
        taken = names[start:start + per_chunk]
        taken = (names[:first] if chunk == 0 else []) + taken + (names[last + 1:] if chunk == num_chunks - 1 else [])
        pieces.append(torch.nn.Sequential(OrderedDict((name, getattr(model, name)) for name in taken)))
    return pieces


def schedule_class(name: str):
    """The installed torch's class for --schedule (one line where it has none)."""
    found = getattr(pipelining, SCHEDULES[name][0], None)
    if found is None:
        raise ConfigError(f"--schedule {name} needs torch.distributed.pipelining.{SCHEDULES[name][0]}, which torch "
                          f"{torch.__version__} lacks: use --schedule gpipe, or a newer torch")
    return found


@exits_cleanly
def main(argv=None) -> int:
    flags = harness.parser(RUNG, without=NOT_HONOURED)
    flags.add_argument("--microbatches", type=int, default=4, help="micro batches per batch (pipeline depth)")
    flags.add_argument("--schedule", choices=tuple(SCHEDULES), default="gpipe",
                       help="the order of the micro batches' forwards and backwards")
    flags.add_argument("--dp", type=int, default=1, help="pipelines side by side, on different data (dp x pp ranks)")
    config, args = harness.parse(flags, argv)
    if args.microbatches < 1 or config.batch_size % args.microbatches:
        flags.error(f"argument --microbatches: must divide --batch-size {config.batch_size}, got {args.microbatches}")
    job = distributed.find_job()
    if args.dp < 1 or job.world_size % args.dp:
        flags.error(f"argument --dp: must divide the {job.world_size} ranks into equal pipelines, got {args.dp}")
    dp, pp = args.dp, job.world_size // args.dp
    chunks_per_rank = SCHEDULES[args.schedule][1]
    Schedule = schedule_class(args.schedule)
    data = datasets.for_config(config)
    torch.manual_seed(config.seed)  # every rank builds the same whole model, then keeps its own chunks
    full_model = models.for_config(config, data)
    pieces = split_model(full_model, pp * chunks_per_rank, config.model)  # before joining the group
    device = devices.pick_device(config.device, job.local_rank)
    if device.index is not None:
        torch.accelerator.set_device_index(device.index)
    dist.init_process_group(devices.pick_backend(device, config.backend), rank=job.rank, world_size=job.world_size,
                            **distributed.rendezvous(job, config.timeout))
    # A dp x pp grid: rank r runs stage r % pp of pipeline r // pp (a pipeline's stages on consecutive ranks).
    mesh = init_device_mesh(device.type, (dp, pp), mesh_dim_names=("dp", "pp"))
    dp_rank, pp_rank = mesh["dp"].get_local_rank(), mesh["pp"].get_local_rank()
    rank, is_first, is_last = job.rank, pp_rank == 0, pp_rank == pp - 1

    train_set = sharding.torch_train_set(data)
    # The stages of a pipeline walk the same batches in the same order; the pipelines, 1/dp of the data each.
    sampler = DistributedSampler(train_set, dp, dp_rank, seed=config.seed)
    loader = DataLoader(train_set, batch_size=config.batch_size, sampler=sampler, drop_last=True)
    # Stage s of a pipeline holds chunk s (and, interleaved, chunk s + pp): stage index = chunk index.
    mine = [pp_rank + k * pp for k in range(chunks_per_rank)]
    model = torch.nn.ModuleList(pieces[index].to(device) for index in mine)
    stages = [pipelining.PipelineStage(chunk, index, len(pieces), device, group=mesh["pp"].get_group())
              for chunk, index in zip(model, mine)]
    clock = pipeline_events.Clock(rank)  # each stage's forwards and backwards, timed: the bubble, measured
    for stage in stages:
        clock.watch(stage)
    loss_fn = lambda logits, y: F.cross_entropy(logits.float(), y)  # noqa: E731
    try:
        schedule = Schedule(stages if chunks_per_rank > 1 else stages[0], n_microbatches=args.microbatches,
                            loss_fn=loss_fn)
    except ValueError as error:  # a micro batch count the schedule cannot order, in torch's words
        raise ConfigError(f"--schedule {args.schedule} with --microbatches {args.microbatches} on {pp} "
                          f"stages: {error}") from None
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    num_params = sum(p.numel() for p in full_model.parameters())  # the whole model's: a checkpoint holds it all
    # The global batch is a pipeline's batch times dp: the learning rate scales with dp.  Only a pipeline's last
    # stage sees the loss, so it counts the whole batch (counting_ranks=1) and the other stages count none.
    run = harness.TorchRun(RUNG, config, device, model, optimizer, loader,
                           state=harness.StageState(model, optimizer, num_params),
                           scheduler=harness.lr_scheduler(optimizer, config, dp, len(loader)), replicas=dp,
                           counting_ranks=1)
    if rank == 0:
        pipelines = f", x {dp} pipelines" if dp > 1 else ""
        print(f"{RUNG}: {len(pieces)} stages of {config.model} on {pp} ranks{pipelines}, {args.schedule}, "
              f"{args.microbatches} micro batches a step, {device.type}")

    for epoch in run.epochs():
        sampler.set_epoch(epoch)  # a new order every epoch (the same on every rank)
        for x, y in run.batches(loader):
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            clock.step = run.step
            loss = logits = None  # only the last stage sees the loss: it alone counts samples
            if is_last:  # computes the loss, sends gradients back (and, the only stage, everything)
                losses = []
                logits = schedule.step(x, target=y, losses=losses) if is_first else schedule.step(target=y,
                                                                                                   losses=losses)
                loss = torch.stack(losses).detach().mean()
            elif is_first:  # forward and backward of every micro batch, sending activations on
                schedule.step(x)
            else:  # receives activations, sends them on; receives gradients, sends them back
                schedule.step()
            if dp > 1:  # the pipelines' gradients averaged, each stage with its copies (what DDP would do)
                for parameter in model.parameters():
                    dist.all_reduce(parameter.grad, group=mesh["dp"].get_group())
                    parameter.grad /= dp
            optimizer.step()
            run.scheduler.step()  # this rung's own schedule (the harness steps none it is given)
            run.end_step(loss, logits, y)

    # Gather the chunks into the whole model on every rank, evaluate it there, and save it; and every
    # stage's events: the bubble and the micro batches each stage held, measured against the schedule's.
    parts, events = [None] * job.world_size, [None] * job.world_size
    dist.all_gather_object(parts, {k: v.cpu() for chunk in model for k, v in chunk.state_dict().items()})
    dist.all_gather_object(events, clock.events)
    events = [event for rank_events in events[:pp] for event in rank_events]  # the first pipeline's
    full_model.load_state_dict({k: v for part in parts for k, v in part.items()})
    test_loss, test_accuracy = sharding.evaluate_torch(full_model.to(device), data, 0, 1, device)
    if run.is_main:
        torch.save(full_model.state_dict(), f"{config.out_dir}/model.pt")
        pipeline_events.save(events, f"{config.out_dir}/pipeline_events.json")
    stage_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    run.finish(test_accuracy, stage_param_bytes=stage_bytes, schedule=args.schedule,
               bubble=round(pipeline_events.bubble(events), 4),
               bubble_predicted=round(pipeline_events.predicted_bubble(pp, args.microbatches, chunks_per_rank), 4),
               peak_in_flight=",".join(str(pipeline_events.peak_in_flight(events, index))  # a stage's micro batches
                                       for index in range(len(pieces))))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    harness.exit_process(main())
