"""Rung 4: Horovod with PyTorch.

    horovodrun -np 2 -H localhost:2 python -m scaledl.ladder.horovod_torch     # or mpirun -np 2 ...

A diff against `single_torch.py`; every change is marked `# New Code #`.  Horovod wraps the
optimizer: each gradient is all-reduced (averaged) as soon as backward produces it, and
`step()` waits for the averages.  Options: `--fp16-allreduce` halves the bytes sent;
`--adasum` combines gradients with Adasum instead of averaging (then use `--scale-lr false`).
"""
from __future__ import annotations

import math  # New Code #
import os  # New Code #

import torch
import horovod.torch as hvd  # New Code #
import torch.nn.functional as F

from scaledl import (checkpoint, config as config_lib, datasets, distributed, models, numerics, precision, report,
                     schedule, sharding)
from scaledl.errors import exits_cleanly
from scaledl.log import get_logger
from scaledl.metrics import History

RUNG = "horovod_torch"


class Trainer:
    def __init__(self, config: config_lib.Config, dist: distributed.Distributed, data: datasets.Dataset, args):  # New Code #
        self.config, self.dist, self.data = config, dist, data
        self.log = get_logger(dist.rank)
        self.model = models.for_dataset(data).to(dist.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr, momentum=config.momentum)
        # New Code #: gradients are all-reduced in backward hooks, one tensor (or fused group) at a time.
        self.optimizer = hvd.DistributedOptimizer(
            self.optimizer, named_parameters=self.model.named_parameters(),
            compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none,
            op=hvd.Adasum if args.adasum else hvd.Average)
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
        # New Code #: every rank starts from rank 0's weights and optimizer state.
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
        self.history = History(config.out_dir, dist.rank, dist.world_size, config=config.to_dict(),
                               gather=lambda vector: hvd.allgather(torch.from_numpy(vector)[None]).numpy(),  # New Code #
                               run_info={"rung": RUNG, "device": str(dist.device)}, resume=config.resume, tensorboard=config.tensorboard)

    def _steps_per_epoch(self) -> int:
        return len(self.data.y_train) // (self.config.batch_size * self.dist.world_size)

    def train_step(self, x: torch.Tensor, y: torch.Tensor):
        with precision.autocast(self.dist.device, self.config.precision):
            logits = self.model(x)
            loss = F.cross_entropy(logits.float(), y)
        self.optimizer.zero_grad()
        self.scaler.scale(loss).backward()
        self.optimizer.synchronize()  # New Code #: wait for the averaged gradients before the scaler reads them
        if self.guard.allows_step(self.model.parameters(), loss, self.step + 1):
            with self.optimizer.skip_synchronize():  # New Code #
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
        return sharding.evaluate_torch(self.model, self.data, self.dist.rank, self.dist.world_size, self.dist.device,
                                       all_reduce=lambda totals: hvd.allreduce(totals, op=hvd.Sum))  # New Code #


def run(config: config_lib.Config, args) -> dict:  # New Code #
    # New Code #: under gloo (horovodrun's default here), a peer that stops answering fails the job after --timeout.
    os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(math.ceil(config.timeout)))
    hvd.init()  # New Code #
    dist = distributed.setup(config.device, config.backend, config.timeout, config.seed, init_process_group=False)
    data = datasets.load_dataset(config.dataset, config.data_dir, config.train_limit)
    trainer = Trainer(config, dist, data, args)  # New Code #
    trainer.train()
    test_loss, test_accuracy = trainer.evaluate()
    return report.finish(RUNG, dist.world_size, trainer.history, test_accuracy, config.out_dir,
                         report.peak_memory_bytes(dist.device), dist.is_main,
                         state_bytes_per_rank=report.model_state_bytes(trainer.model, trainer.optimizer),
                         params_in_sync=distributed.params_in_sync(trainer.model, hvd.allgather_object))  # New Code #


@exits_cleanly
def main(argv=None) -> int:
    parser = config_lib.build_parser(prog=f"python -m scaledl.ladder.{RUNG}")
    # New Code #: Horovod's options.
    parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as fp16")
    parser.add_argument("--adasum", action="store_true", help="combine gradients with Adasum instead of averaging")
    run(*config_lib.config_from_args(parser, argv))  # New Code #
    return 0


if __name__ == "__main__":
    distributed.exit_process(main())
