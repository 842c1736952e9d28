"""Rung 1: one device, PyTorch.  The baseline every other PyTorch rung is a diff of.

    python -m scaledl.ladder.single_torch --epochs 3

Read it top to bottom: flags -> config -> device -> data -> model -> loop -> metrics.
The next rung (`ddp.py`) changes only the lines marked `# New Code #` there.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from scaledl import (checkpoint, config as config_lib, datasets, distributed, models, numerics, precision, report,
                     schedule, sharding)
from scaledl.errors import exits_cleanly
from scaledl.log import get_logger
from scaledl.metrics import History

RUNG = "single_torch"


class Trainer:
    def __init__(self, config: config_lib.Config, dist: distributed.Distributed, data: datasets.Dataset):
        self.config, self.dist, self.data = config, dist, data
        self.log = get_logger(dist.rank)
        self.model = models.for_dataset(data).to(dist.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr, momentum=config.momentum)
        self.train_loader = sharding.torch_train_loader(data, config.batch_size, dist.rank, dist.world_size, config.seed)
        self.scheduler = schedule.torch_scheduler(self.optimizer, config, dist.world_size, self._steps_per_epoch())
        self.scaler = precision.grad_scaler(dist.device, config.precision)
        self.checkpoint_path = f"{config.out_dir}/checkpoint.pt"
        self.guard = numerics.NonFiniteGuard(config.on_nonfinite, dist.rank, self.checkpoint_path,
                                             enabled=not self.scaler.is_enabled(), log=self.log)
        self.epoch, self.step = 0, 0
        if config.resume:
            state = checkpoint.load(self.checkpoint_path, model=self.model, optimizer=self.optimizer,
                                    scheduler=self.scheduler)
            self.epoch, self.step = state["epoch"], state["step"]
            self.train_loader.sampler.skip_batches(self.step - self.epoch * self._steps_per_epoch())
        self.history = History(config.out_dir, dist.rank, dist.world_size, config=config.to_dict(),
                               run_info={"rung": RUNG, "device": str(dist.device)}, resume=config.resume, tensorboard=config.tensorboard)

    def _steps_per_epoch(self) -> int:
        return len(self.data.y_train) // (self.config.batch_size * self.dist.world_size)

    def train_step(self, x: torch.Tensor, y: torch.Tensor):
        with precision.autocast(self.dist.device, self.config.precision):
            logits = self.model(x)
            loss = F.cross_entropy(logits.float(), y)
        self.optimizer.zero_grad()
        self.scaler.scale(loss).backward()
        if self.guard.allows_step(self.model.parameters(), loss, self.step + 1):
            self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        return loss.detach() * len(y), (logits.argmax(1) == y).sum()

    def train(self) -> None:
        steps_per_epoch = self._steps_per_epoch()
        for epoch in range(self.epoch, self.config.num_epochs):
            self.train_loader.sampler.set_epoch(epoch)
            for x, y in self.train_loader:
                x, y = x.to(self.dist.device, non_blocking=True), y.to(self.dist.device, non_blocking=True)
                loss_sum, correct = self.train_step(x, y)
                self.step += 1
                self.history.step(loss_sum, correct, len(y))
                if self.step % self.config.log_interval == 0:
                    record = self.history.log(self.step, self.step / steps_per_epoch, lr=self.scheduler.get_last_lr()[0])
                    if record:
                        self.log.info("epoch %d step %d loss %.4f acc %.3f %.0f samples/s", epoch, self.step,
                                      record["loss"], record["accuracy"], record["samples_per_s"])
                if self.config.checkpoint_every and self.step % self.config.checkpoint_every == 0:
                    self.save(epoch)
                if self.config.max_steps and self.step >= self.config.max_steps:
                    return self.save(epoch)
            self.epoch = epoch + 1
        self.save(self.epoch)

    def save(self, epoch: int) -> None:
        checkpoint.save(self.checkpoint_path, model=self.model, optimizer=self.optimizer,
                        scheduler=self.scheduler, epoch=epoch, step=self.step, is_main=self.dist.is_main)

    def evaluate(self) -> tuple[float, float]:
        return sharding.evaluate_torch(self.model, self.data, self.dist.rank, self.dist.world_size, self.dist.device)


def run(config: config_lib.Config) -> dict:
    dist = distributed.setup(config.device, config.backend, config.timeout, config.seed, init_process_group=False)
    data = datasets.load_dataset(config.dataset, config.data_dir, config.train_limit)
    trainer = Trainer(config, dist, data)
    trainer.train()
    test_loss, test_accuracy = trainer.evaluate()
    return report.finish(RUNG, dist.world_size, trainer.history, test_accuracy, config.out_dir,
                         report.peak_memory_bytes(dist.device), dist.is_main,
                         state_bytes_per_rank=report.model_state_bytes(trainer.model, trainer.optimizer))


@exits_cleanly
def main(argv=None) -> int:
    config = config_lib.parse_args(argv, prog=f"python -m scaledl.ladder.{RUNG}")
    run(config)
    return 0


if __name__ == "__main__":
    distributed.exit_process(main())
