"""What every rung does the same way, written once, so that a rung shows only its framework.

    config = harness.parse_args("single_torch")
    ...
    run = harness.TorchRun("single_torch", config, device, model, optimizer, loader)
    for epoch in run.epochs():
        for x, y in run.batches(loader):             # micro batches
            ...forward, loss, backward (gradients add up)...
            if not run.end_micro_batch(loss, logits, y):
                continue                             # until the step's --grad-accum-th
            ...optimizer step, zero the gradients...
            run.end_step()
    run.finish(test_accuracy)

A run owns OUT_DIR: it claims it when training starts (not when the flags are parsed), writes
`metrics.jsonl` (one line per `--log-interval`), checkpoints (`--checkpoint-every`, bounded by
`--keep-checkpoints`, each recording what a resume must match), and ends with `summary.json` and
the one-line summary.  `TorchRun` adds the PyTorch pieces every PyTorch rung shares: the
learning-rate schedule, mixed precision (`autocast`, the fp16 loss scaler), and the guard that
stops or skips a step whose gradients are NaN or infinite.

It knows no framework's distributed API: the ranks' view of the job comes from a small `Comm`
(torch.distributed when a process group is up, else one process; Horovod's rung passes its
own), and the frameworks that own their checkpoints (DeepSpeed, FSDP2) pass a `state` adapter
(`scaledl.ladder.harness.run_state`).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from scaledl import class_records, config as config_lib, flops, launch_env, models, report, run_dir, schedule, signals
from scaledl.ladder.harness import run_state
# What a rung saves when the model's state is not one process's plain state dict: a rung names one here.
from scaledl.ladder.harness.run_state import DeepSpeedState, FullState, StageState  # noqa: F401
from scaledl.config import Config
from scaledl.datasets import DataError
from scaledl.distributed import exit_process  # noqa: F401  (the rungs leave through it)
from scaledl.errors import NothingToDo, StoppedOnRequest
from scaledl.log import get_logger
from scaledl.metrics import History, local_gather, torch_gather

# Flags a rung leaves out when it does not honour them (`parser(..., without=...)`).
CHECKPOINT_FLAGS = ("resume", "checkpoint_every", "keep_checkpoints")
GUARD_FLAGS = ("on_nonfinite",)
COLLECTIVE_FLAGS = ("backend", "timeout")  # a single process has no collectives to pick or bound
MODEL_FLAGS = config_lib.MODEL_FLAGS  # a rung without them trains the CNN only


def parser(rung: str, without: tuple[str, ...] = ()):
    """The flags every rung shares, minus `without`; a rung adds its own to what it gets back."""
    return config_lib.build_parser(prog=f"python -m scaledl.ladder.{rung}", without=without)


def parse(flags, argv=None):
    """(Config, namespace with the rung's own flags). Parsing writes nothing anywhere; a class
    directory named by SCALEDL_CLASS_DIR is checked here, before anything runs."""
    parsed = config_lib.config_from_args(flags, argv)
    class_records.from_env()
    return parsed


def parse_args(rung: str, argv=None, without: tuple[str, ...] = ()) -> Config:
    return parse(parser(rung, without), argv)[0]


def lr_scheduler(optimizer, config: Config, world_size: int, steps_per_epoch: int):
    """Linear scaling of --lr with the global batch, after a warm-up (scaledl.schedule), as a LambdaLR."""
    return schedule.torch_scheduler(optimizer, config, world_size, steps_per_epoch)


@dataclass
class Comm:
    """The ranks' view of the job: enough for metrics, checkpoints and the in-sync check."""

    rank: int = 0
    world_size: int = 1
    gather: Callable[[np.ndarray], np.ndarray] = local_gather  # (k,) -> (world_size, k)
    barrier: Callable[[], None] = lambda: None
    all_gather_object: Callable | None = None  # obj -> list, one per rank

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def torch_comm() -> Comm:
    """torch.distributed's default group when one is up (DDP, FSDP2, DeepSpeed), else one process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return Comm()

    def all_gather_object(obj):
        found = [None] * dist.get_world_size()
        dist.all_gather_object(found, obj)
        return found

    return Comm(dist.get_rank(), dist.get_world_size(), torch_gather, dist.barrier, all_gather_object)


def horovod_comm(hvd) -> Comm:
    """Horovod's collectives (horovod.torch or horovod.tensorflow, after hvd.init())."""
    def gather(vector):
        if hasattr(hvd, "allgather_object"):
            return np.stack(hvd.allgather_object(vector))
        return np.asarray(hvd.allgather(vector[None]))

    return Comm(hvd.rank(), hvd.size(), gather, lambda: hvd.allgather_object(0), hvd.allgather_object)


class Run:
    """Steps, epochs, metrics, OUT_DIR and the summary: the part that is the same in every framework."""

    def __init__(self, rung: str, config: Config, *, steps_per_epoch: int, num_samples: int, device: str,
                 comm: Comm | None = None, can_resume: bool = False, replicas: int | None = None):
        self.rung, self.config = rung, config
        self.comm = comm or Comm()
        self.rank, self.world_size, self.is_main = self.comm.rank, self.comm.world_size, self.comm.is_main
        # Model replicas that train on different data: the global batch is batch_size * replicas.  All ranks
        # but under tensor parallelism, whose world_size / replicas ranks share each batch (and count it once).
        self.replicas = replicas or self.world_size
        if steps_per_epoch < 1:
            accum = f" x --grad-accum {config.grad_accum}" if config.grad_accum > 1 else ""
            raise DataError(
                f"{num_samples} training samples give each of {self.world_size} ranks "
                f"{num_samples // self.world_size}, fewer than one --batch-size of {config.batch_size}{accum}: use "
                f"more data (--train-limit), a smaller --batch-size{' or --grad-accum' if accum else ''}, or fewer "
                "ranks")
        self.steps_per_epoch = steps_per_epoch
        self.log = get_logger(self.rank)
        self.epoch = self.step = 0
        self.micro_batch = 0  # of the step being trained: 0 .. --grad-accum - 1
        self.device = device
        # Rank 0 checks OUT_DIR (and with --overwrite clears it) before anything is written.
        self.resume = run_dir.claim(config.out_dir, config.resume, config.overwrite, self.is_main,
                                    can_resume=can_resume, share=self.comm.all_gather_object)
        self.history: History | None = None

    def start(self) -> None:
        """Open metrics.jsonl (its first line: the run's config); `epochs()` does it for you."""
        if self.history is not None:
            return
        self.history = History(self.config.out_dir, self.rank, self.world_size, gather=self.comm.gather,
                               config=self.config.to_dict(), resume=self.resume, tensorboard=self.config.tensorboard,
                               run_info={"rung": self.rung, "device": str(self.device)},
                               resume_step=self.step if self.resume else None)

    @property
    def done(self) -> bool:
        return bool(self.config.max_steps) and self.step >= self.config.max_steps

    def epochs(self):
        """The epochs left to train (all of them, or from the checkpoint's on --resume)."""
        self.start()
        for epoch in range(self.epoch, self.config.num_epochs):
            if self.done:
                break
            self.epoch = epoch
            yield epoch
            if not self.done:
                self.epoch = epoch + 1
        if self.history.pending_steps:  # the last interval ends at its last step, not after the test and the save
            self.history.log(self.history.total_steps)  # the record report.finish would write, without a log line
        self.end_training()

    def batches(self, loader):
        """The loader's (micro) batches, --grad-accum of them a step, skipping those a resumed run already
        trained, until --max-steps.  An epoch's last micro batches that make no whole step are left out
        (their gradients would leak into the next epoch's first step)."""
        accum = self.config.grad_accum
        skip = max(self.step - self.epoch * self.steps_per_epoch, 0) * accum
        for index, batch in enumerate(itertools.islice(loader, skip, self.steps_per_epoch * accum)):
            if self.done:
                return
            self.micro_batch = index % accum
            yield batch

    @property
    def last_micro_batch(self) -> bool:
        """Is the batch being trained the step's last (the one whose backward must reduce the gradients)?"""
        return self.micro_batch == self.config.grad_accum - 1

    def lr(self, step: int | None = None) -> float:
        """The learning rate for the next step (or `step`): linear scaling with warm-up (`scaledl.schedule`)."""
        return schedule.for_config(self.config, self.replicas, self.steps_per_epoch)(
            self.step if step is None else step)

    def record(self, loss_sum, correct, count: int) -> None:
        """Add a finished (micro) batch's sums (they stay on the device until the next log line), and count
        a step at the step's last micro batch (--grad-accum)."""
        self.history.add(loss_sum, correct, count)
        if self.last_micro_batch:
            self.count_step()

    def count_step(self) -> None:
        """One optimizer step done (its batches' sums already added to the history)."""
        self.step += 1
        self.history.end_step()
        if self.step % self.config.log_interval == 0:
            self.log_metrics()
            if self.history.stop_agreed:
                self.stop_on_request()

    def log_metrics(self) -> None:
        # A stop request (SIGUSR1) rides in the metrics' collective: every rank learns of it at this step.
        record = self.history.log(self.step, self.step / self.steps_per_epoch, stop=signals.stop_requested is not None,
                                  lr=self.current_lr())
        if record:
            self.log.info("epoch %d step %d loss %.4f acc %.3f %.0f samples/s", self.epoch, self.step,
                          record["loss"], record["accuracy"], record["samples_per_s"])

    def stop_on_request(self) -> None:
        """Every rank, at the same step, once one was sent SIGUSR1 (a scheduler's time-limit warning)."""
        raise StoppedOnRequest(f"stopped at step {self.step} on SIGUSR1; this rung keeps no checkpoint, so running it "
                               "again starts over")

    def current_lr(self) -> float:
        return schedule.for_config(self.config, self.replicas, self.steps_per_epoch)(max(self.step - 1, 0))

    def end_training(self) -> None:
        """Called once the last epoch (or --max-steps) is done."""

    def finish(self, test_accuracy: float, **extra) -> dict:
        """Write summary.json and print the summary line (every rank calls it: it is a collective)."""
        memory = report.peak_memory_bytes(self.device)
        summary = report.finish(self.rung, self.world_size, self.history, test_accuracy, self.config.out_dir,
                                memory, self.is_main, language_model=self._language_model(), **extra)
        if self.is_main:
            self._to_class(summary)
        self.comm.barrier()  # every rank leaves together (see distributed.teardown)
        return summary

    def _language_model(self) -> dict | None:
        """What tokens/s and MFU need, for --model gpt (scaledl.flops)."""
        config = self.config
        if config.model != "gpt":
            return None
        peak_tflops, source = flops.peak(self.device, config.precision)
        return {"seq_len": config.seq_len, "peak_tflops": peak_tflops, "peak_source": source,
                "flops_per_token": models.gpt_flops_per_token(config.width, config.depth, config.seq_len)}

    def _to_class(self, summary: dict) -> None:
        """In a class (SCALEDL_CLASS_DIR), the run's summary and what it ran on, for the class's curve."""
        try:
            job = launch_env.detect()
            nodes = job.world_size // job.local_world_size if job.local_world_size else None
        except launch_env.LaunchError:
            nodes = None
        try:
            class_records.write_run(summary, nodes=nodes, batch_size=self.config.batch_size,
                                    global_batch_size=self.config.batch_size * self.config.grad_accum * self.replicas,
                                    model=self.config.model, precision=self.config.precision,
                                    num_params=getattr(self, "meta", {}).get("num_params"), device=str(self.device))
        except OSError as error:  # the run itself is saved in OUT_DIR: say so, and end as it would have
            self.log.warning(f"the class directory did not take this run's summary ({error}); it is in "
                             f"{self.config.out_dir}/summary.json")


class TorchRun(Run):
    """Run, plus what every PyTorch rung shares: lr schedule, precision, NaN guard, checkpoints.

    `model` and `optimizer` are what a checkpoint holds (pass DDP's `.module`, the plain model);
    `state` replaces how they are saved and loaded (FSDP2's full state dicts, DeepSpeed's
    engine); `scheduler` is one the framework steps itself (DeepSpeed's engine does);
    `replicas` is the data-parallel size when it is not the world size (tensor parallelism);
    `counting_ranks` is how many ranks count each batch, a share each: world_size / replicas by default (every
    rank of a tensor-parallel group sees the loss), 1 for a pipeline (its last stage alone sees it).
    """

    def __init__(self, rung: str, config: Config, device, model, optimizer, loader, *, comm: Comm | None = None,
                 state: run_state.State | None = None, scheduler=None, replicas: int | None = None,
                 counting_ranks: int | None = None):
        comm = comm or torch_comm()
        # The loader serves micro batches: --grad-accum of them make a step.
        super().__init__(rung, config, steps_per_epoch=len(loader) // config.grad_accum,
                         num_samples=len(loader.dataset),
                         device=device, comm=comm, can_resume=True, replicas=replicas)
        import torch

        from scaledl import numerics, precision

        self.model, self.optimizer = model, optimizer
        self.counting_ranks = counting_ranks or self.world_size // self.replicas
        self._counted = False  # this step's micro batches already added to the metrics (end_micro_batch)
        self.engine_steps_scheduler = scheduler is not None
        self.scheduler = scheduler or lr_scheduler(optimizer, config, self.replicas, self.steps_per_epoch)
        self.scaler = precision.grad_scaler(device, config.precision)
        self._autocast = lambda: precision.autocast(device, config.precision)
        self.state = state or run_state.TorchState(model, optimizer)
        self.meta = {"rung": rung, "world_size": self.world_size, "dataset": config.dataset,
                     "train_limit": config.train_limit, "batch_size": config.batch_size,
                     "grad_accum": config.grad_accum, "seed": config.seed, "replicas": self.replicas,
                     # ZeRO-3 leaves each parameter a partition; ds_numel is its whole size.
                     "num_params": self.state.num_params or sum(getattr(p, "ds_numel", p.numel())
                                                                for p in model.parameters())}
        self.store = run_state.Store(config.out_dir, self.state, self.meta, config.keep_checkpoints,
                                     self.is_main, comm.barrier)
        # With fp16 the loss scaler skips overflowing steps itself; the guard stands aside.
        self.guard = numerics.NonFiniteGuard(config.on_nonfinite, self.rank, self.store.path,
                                             enabled=config.precision != "fp16", log=self.log,
                                             step=lambda: self.step + 1)
        if self.resume:
            # Every rank checks what the checkpoint was written by before loading anything.
            found = self.store.load(self.scheduler)
            self.epoch, self.step = found["epoch"], found["step"]
            total = min(config.max_steps or float("inf"), config.num_epochs * self.steps_per_epoch)
            if self.step >= total:
                # Training on would do nothing and then rewrite the finished run's summary.
                raise NothingToDo(f"the run in {config.out_dir} has finished (step {self.step} of {total}; its "
                                  f"results are in {config.out_dir}/summary.json), so there is nothing to resume: "
                                  "to train it further, resume with a larger --epochs")
        self._torch = torch

    def autocast(self):
        """bf16 or fp16 autocast with --precision; nothing with fp32."""
        return self._autocast()

    def current_lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def end_micro_batch(self, loss, logits, y) -> bool:
        """After a micro batch's backward: add its loss and accuracy to the metrics; True when it was
        the step's last (time for the optimizer step), False while gradients are still adding up."""
        self._add(loss, logits, y)
        self._counted = True
        return self.last_micro_batch

    def end_step(self, loss=None, logits=None, y=None) -> None:
        """After the optimizer step: schedule, metrics, --checkpoint-every.  A rung that called
        `end_micro_batch` passes nothing; one that did not passes its batch's loss, logits and
        targets; a rank that sees no loss (a pipeline's first stage) passes nothing and counts no samples."""
        if not self.engine_steps_scheduler:
            self.scheduler.step()
        if not self._counted:
            self._add(loss, logits, y)
        self._counted = False
        self.count_step()
        if self.config.checkpoint_every and self.step % self.config.checkpoint_every == 0:
            self.save()

    def _add(self, loss, logits, y) -> None:
        if loss is None:
            zero = self._torch.zeros((), device=self.device)
            self.history.add(zero, zero, 0)
            return
        share = self.counting_ranks  # ranks that count this same batch: each counts its share
        per_sample = y[0].numel()  # targets per sample: 1 for a class, seq_len for next tokens
        self.history.add(loss.detach().float() * len(y) / share, (logits.argmax(1) == y).sum() / (share * per_sample),
                         len(y) / share)

    def log_metrics(self) -> None:
        self.guard.check()  # a non-finite step since the last line stops the run here (the guard reads it now)
        super().log_metrics()

    def save(self) -> None:
        self.guard.check()  # never save what came after a non-finite step
        self.store.save(self.scheduler, self.epoch, self.step)

    def stop_on_request(self) -> None:
        # Called from `record`, after the optimizer and scheduler stepped: the same state as --checkpoint-every's.
        self.save()
        raise StoppedOnRequest(f"saved a checkpoint at step {self.step} on SIGUSR1 and stopped: run the same command "
                               f"with --resume to go on from there ({self.store.path}; the run is not finished: "
                               "no summary.json yet)")

    def end_training(self) -> None:
        self.save()

    def finish(self, test_accuracy: float, **extra) -> dict:
        extra.setdefault("state_bytes_per_rank", self.state.bytes_per_rank())
        in_sync = self.state.in_sync(self.comm)  # data parallelism's invariant, checked on every run
        if in_sync is not None:
            extra.setdefault("params_in_sync", in_sync)
        return super().finish(test_accuracy, **extra)
