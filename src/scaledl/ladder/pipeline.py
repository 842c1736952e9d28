"""Model parallelism: the model split across ranks as a pipeline (`torch.distributed.pipelining`).

    torchrun --nproc_per_node=2 -m scaledl.ladder.pipeline --epochs 3 --microbatches 4

Data parallelism copies the whole model to every rank; when a model does not fit on one
device, split it instead.  Here rank 0 holds the convolutional layers and rank 1 the
classifier: each batch is cut into micro batches, rank 0 sends each micro batch's
activations to rank 1 as soon as they are ready (so both ranks work at once, GPipe's
schedule), and gradients flow back the same way.  Every rank sees every sample; each
updates only its own layers.
"""
from __future__ import annotations

import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from scaledl import config as config_lib, datasets, distributed, models, report, schedule, sharding
from scaledl.errors import exits_cleanly
from scaledl.log import get_logger
from scaledl.metrics import History, torch_gather

RUNG = "pipeline"
SPLIT_AT = 6  # the CNN's index of Flatten: convolutions on rank 0, classifier on rank 1


def split_model(model: torch.nn.Sequential, num_stages: int) -> list[torch.nn.Sequential]:
    if num_stages != 2:
        raise config_lib.ConfigError(f"the pipeline rung splits its model in 2 stages; run it with 2 ranks, not {num_stages}")
    # Slicing a Sequential keeps the layers' names, so the stages' state dicts merge back into the whole.
    return [model[:SPLIT_AT], model[SPLIT_AT:]]


class Trainer:
    def __init__(self, config: config_lib.Config, dist: distributed.Distributed, data: datasets.Dataset, args):
        self.config, self.dist, self.data = config, dist, data
        self.log = get_logger(dist.rank)
        self.is_first, self.is_last = dist.rank == 0, dist.rank == dist.world_size - 1
        # Every rank builds the whole model from the same seed and keeps its own stage.
        self.full_model = models.for_dataset(data)
        self.model = split_model(self.full_model, dist.world_size)[dist.rank].to(dist.device)
        stage = PipelineStage(self.model, dist.rank, dist.world_size, dist.device)
        self.schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches,
                                      loss_fn=lambda logits, y: F.cross_entropy(logits.float(), y))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr, momentum=config.momentum)
        # No data parallelism: every stage walks the same batches in the same order.
        self.train_loader = sharding.torch_train_loader(data, config.batch_size, 0, 1, config.seed)
        self.scheduler = schedule.torch_scheduler(self.optimizer, config, 1, len(self.train_loader))
        self.step = 0
        self.history = History(config.out_dir, dist.rank, dist.world_size, gather=torch_gather,
                               config=config.to_dict(), run_info={"rung": RUNG, "device": str(dist.device)},
                               tensorboard=config.tensorboard)

    def train_step(self, x: torch.Tensor, y: torch.Tensor):
        self.optimizer.zero_grad()
        if self.is_first:
            self.schedule.step(x)
            loss_sum = correct = torch.zeros((), device=self.dist.device)
        else:
            losses = []
            logits = self.schedule.step(target=y, losses=losses)
            loss_sum = torch.stack(losses).detach().mean() * len(y)
            correct = (logits.argmax(1) == y).sum()
        self.optimizer.step()
        self.scheduler.step()
        return loss_sum, correct

    def train(self) -> None:
        steps_per_epoch = len(self.train_loader)
        for epoch in range(self.config.num_epochs):
            self.train_loader.sampler.set_epoch(epoch)
            for x, y in self.train_loader:
                loss_sum, correct = self.train_step(x.to(self.dist.device), y.to(self.dist.device))
                self.step += 1
                # Only the last stage sees the loss: it alone counts the samples.
                self.history.step(loss_sum, correct, len(y) if self.is_last else 0)
                if self.step % self.config.log_interval == 0:
                    record = self.history.log(self.step, self.step / steps_per_epoch, lr=self.scheduler.get_last_lr()[0])
                    if record:
                        self.log.info("epoch %d step %d loss %.4f acc %.3f %.0f samples/s", epoch, self.step,
                                      record["loss"], record["accuracy"], record["samples_per_s"])
                if self.config.max_steps and self.step >= self.config.max_steps:
                    return

    def evaluate(self) -> tuple[float, float]:
        """Gather the stages into the whole model on every rank and evaluate it there."""
        stages = [None] * self.dist.world_size
        torch_dist.all_gather_object(stages, {k: v.cpu() for k, v in self.model.state_dict().items()})
        self.full_model.load_state_dict({k: v for stage in stages for k, v in stage.items()})
        return sharding.evaluate_torch(self.full_model.to(self.dist.device), self.data, 0, 1, self.dist.device)


def run(config: config_lib.Config, args) -> dict:
    dist = distributed.setup(config.device, config.backend, config.timeout, config.seed)
    try:
        data = datasets.load_dataset(config.dataset, config.data_dir, config.train_limit)
        trainer = Trainer(config, dist, data, args)
        trainer.train()
        test_loss, test_accuracy = trainer.evaluate()
        if dist.is_main:
            torch.save(trainer.full_model.state_dict(), f"{config.out_dir}/model.pt")
        stage_bytes = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
        return report.finish(RUNG, dist.world_size, trainer.history, test_accuracy, config.out_dir,
                             report.peak_memory_bytes(dist.device), dist.is_main, stage_param_bytes=stage_bytes,
                             state_bytes_per_rank=report.model_state_bytes(trainer.model, trainer.optimizer))
    finally:
        distributed.teardown()


@exits_cleanly
def main(argv=None) -> int:
    parser = config_lib.build_parser(prog=f"python -m scaledl.ladder.{RUNG}")
    parser.add_argument("--microbatches", type=int, default=4, help="micro batches per batch (pipeline depth)")
    config, args = config_lib.config_from_args(parser, argv)
    if config.precision != "fp32":
        parser.error("argument --precision: the pipeline rung trains in fp32 only")
    if args.microbatches < 1 or config.batch_size % args.microbatches:
        parser.error(f"argument --microbatches: must divide --batch-size {config.batch_size}, got {args.microbatches}")
    run(config, args)
    return 0


if __name__ == "__main__":
    distributed.exit_process(main())
