"""Rung 6 and 7: DeepSpeed, with ZeRO stages 0-3 and CPU offload as flags.

    deepspeed --num_gpus=2 --module scaledl.ladder.deepspeed --zero-stage 2     # or torchrun, mpiexec, ...
    torchrun --nproc_per_node=2 -m scaledl.ladder.deepspeed --zero-stage 3 --offload-optimizer

A diff against `ddp.py`; every change is marked `# New Code #`.  `deepspeed.initialize` wraps
model, optimizer and scheduler in an engine that owns backward and step.  The engine's
config is built from the same flags as every rung.  ZeRO partitions what each rank keeps
across ranks: stage 1 the optimizer states, stage 2 also the gradients, stage 3 also the
parameters; offload moves optimizer states (and with stage 3, parameters) to CPU memory.
"""
from __future__ import annotations

import argparse  # New Code #

import deepspeed  # New Code #
import torch
import torch.nn.functional as F

from scaledl import (checkpoint, config as config_lib, datasets, distributed, models, numerics, precision, report,
                     schedule, sharding)
from scaledl import zero_memory  # New Code #
from scaledl.errors import exits_cleanly
from scaledl.log import get_logger
from scaledl.metrics import History, torch_gather  # New Code #

RUNG = "deepspeed"


class Trainer:
    def __init__(self, config: config_lib.Config, dist: distributed.Distributed, data: datasets.Dataset, args):  # New Code #
        self.config, self.dist, self.data = config, dist, data
        self.log = get_logger(dist.rank)
        self.model = models.for_dataset(data)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr, momentum=config.momentum)
        self.train_loader = sharding.torch_train_loader(data, config.batch_size, dist.rank, dist.world_size, config.seed)
        self.scheduler = schedule.torch_scheduler(self.optimizer, config, dist.world_size, self._steps_per_epoch())
        # New Code #: the engine moves the model to the device, broadcasts rank 0's weights,
        # and from now on does backward (averaging, partitioning) and the step (and the scheduler's).
        self.model, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=self.model, optimizer=self.optimizer, lr_scheduler=self.scheduler,
            config=deepspeed_config(config, args, dist.world_size))
        distributed.release_deepspeed_shared_memory()  # New Code #: DeepSpeed never removes its /dev/shm buffers
        self.input_dtype = precision.torch_dtype(config.precision)  # New Code #: the engine casts the weights, not the data
        self.checkpoint_dir = f"{config.out_dir}/checkpoint"  # New Code #: every rank saves its partition
        self.guard = numerics.NonFiniteGuard(config.on_nonfinite, dist.rank, self.checkpoint_dir,  # New Code #
                                             enabled=config.precision != "fp16", log=self.log)  # on the loss: ZeRO keeps the gradients inside
        self.epoch, self.step = 0, 0
        if config.resume:
            _, state = self.model.load_checkpoint(self.checkpoint_dir)  # New Code #
            if state is None:
                raise checkpoint.CheckpointError(f"no DeepSpeed checkpoint in {self.checkpoint_dir}: run without --resume")
            self.epoch, self.step = state["epoch"], state["step"]
            self.train_loader.sampler.skip_batches(self.step - self.epoch * self._steps_per_epoch())
        self.history = History(config.out_dir, dist.rank, dist.world_size, gather=torch_gather,  # New Code #
                               config=config.to_dict(),
                               run_info={"rung": RUNG, "device": str(dist.device)}, resume=config.resume, tensorboard=config.tensorboard)

    def _steps_per_epoch(self) -> int:
        return len(self.data.y_train) // (self.config.batch_size * self.dist.world_size)

    def train_step(self, x: torch.Tensor, y: torch.Tensor):
        logits = self.model(x.to(self.input_dtype))  # New Code #
        loss = F.cross_entropy(logits.float(), y)
        if self.guard.allows_loss(loss, self.step + 1):  # New Code #: before backward, so a skip leaves nothing behind
            self.model.backward(loss)  # New Code #: loss scaling, gradient averaging or reduce-scatter
            self.model.step()  # New Code #: optimizer and scheduler step, then zero the gradients
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
        # New Code #: a collective; ZeRO stages write one optimizer partition per rank.
        self.model.save_checkpoint(self.checkpoint_dir, client_state={"epoch": epoch, "step": self.step})

    def evaluate(self) -> tuple[float, float]:
        return sharding.evaluate_torch(self.model, self.data, self.dist.rank, self.dist.world_size, self.dist.device)


def deepspeed_config(config: config_lib.Config, args, world_size: int) -> dict:  # New Code #
    """DeepSpeed's JSON config, from the flags every rung shares plus the ZeRO ones."""
    zero = {"stage": args.zero_stage}
    if args.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if args.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": config.batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": config.batch_size * world_size,
        "zero_optimization": zero,
        # DeepSpeed clips the gradient norm to 1.0 unless told otherwise; no other rung clips,
        # and a silent clip makes the same run train differently here.
        "gradient_clipping": 0.0,
        "bf16": {"enabled": config.precision == "bf16"},
        "fp16": {"enabled": config.precision == "fp16", "initial_scale_power": 16},
        # ZeRO partitions any torch optimizer's state; DeepSpeed only tests its own Adam variants
        # and asks to be told, and with offload it would swap in its CPU Adam unless told not to.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9,
    }


def params_in_sync(engine) -> bool:  # New Code #: ZeRO-3 must gather its partitioned parameters first
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=engine.zero_optimization_stage() == 3):
        return distributed.params_in_sync(engine.module)


def run(config: config_lib.Config, args) -> dict:  # New Code #
    dist = distributed.setup(config.device, config.backend, config.timeout, config.seed)  # New Code #
    try:
        data = datasets.load_dataset(config.dataset, config.data_dir, config.train_limit)
        trainer = Trainer(config, dist, data, args)  # New Code #
        trainer.train()
        test_loss, test_accuracy = trainer.evaluate()
        return report.finish(RUNG, dist.world_size, trainer.history, test_accuracy, config.out_dir,
                             report.peak_memory_bytes(dist.device), dist.is_main,
                             state_bytes_per_rank=zero_memory.predict_for_engine(trainer.model)["total"],  # New Code #
                             params_in_sync=params_in_sync(trainer.model), zero_stage=args.zero_stage)  # New Code #
    finally:
        distributed.teardown()  # New Code #


@exits_cleanly
def main(argv=None) -> int:
    parser = config_lib.build_parser(prog=f"python -m scaledl.ladder.{RUNG}")
    # New Code #: ZeRO's options.
    parser.add_argument("--zero-stage", type=int, default=0, choices=[0, 1, 2, 3], help="ZeRO stage")
    parser.add_argument("--offload-optimizer", action="store_true", help="keep optimizer states in CPU memory")
    parser.add_argument("--offload-params", action="store_true", help="keep parameters in CPU memory (stage 3)")
    parser.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # the deepspeed launcher passes it
    config, args = config_lib.config_from_args(parser, argv)
    if args.offload_params and args.zero_stage != 3:
        parser.error("argument --offload-params: needs --zero-stage 3")
    run(config, args)
    return 0


if __name__ == "__main__":
    distributed.exit_process(main())
