"""Training metrics that cost nothing between log steps.

`History.step()` only adds the step's loss and correct-count tensors to running sums on the
device: no `.item()`, so no host-device synchronization per step.  Every `log_interval` steps
`History.log()` gathers one small vector per rank (a single collective), and rank 0 derives
loss, accuracy, samples/s per rank and in total, and the mean/min/max step time across
ranks, then appends a JSONL line.  The gather is framework-agnostic: pass a function that
turns a 1-D float64 NumPy vector into a (world_size, k) array (see `torch_gather`).
"""
from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from scaledl import devices

Gather = Callable[[np.ndarray], np.ndarray]


def local_gather(vector: np.ndarray) -> np.ndarray:
    return vector[None, :]


def torch_gather(vector: np.ndarray) -> np.ndarray:
    """All-gather over the default torch.distributed group."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return vector[None, :]
    # gloo gathers on CPU; NCCL and xccl need the tensor on the rank's device.
    device = "cpu" if dist.get_backend() in ("gloo", "mpi") else devices.current_device()
    mine = torch.from_numpy(vector).to(device)
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, mine)
    return torch.stack(parts).cpu().numpy()


def summarize(per_rank: np.ndarray) -> dict:
    """Turn gathered rows [loss_sum, correct, samples, steps, seconds] into metrics.

    Exposed on its own so the reduction can be tested with known per-rank values.
    """
    loss_sum, correct, samples, steps, seconds = per_rank[:, :5].T
    step_time_mean = seconds / np.maximum(steps, 1)
    rank_throughput = samples / np.maximum(seconds, 1e-12)
    return {
        "loss": float(loss_sum.sum() / max(samples.sum(), 1)),
        "accuracy": float(correct.sum() / max(samples.sum(), 1)),
        "samples": int(samples.sum()),
        "samples_per_s": float(rank_throughput.sum()),
        "samples_per_s_per_rank": float(rank_throughput.mean()),
        "step_time_mean": float(step_time_mean.mean()),
        "step_time_min": float(step_time_mean.min()),
        "step_time_max": float(step_time_mean.max()),
    }


class History:
    def __init__(self, out_dir: str | Path | None, rank: int = 0, world_size: int = 1,
                 gather: Gather = local_gather, config: dict | None = None, run_info: dict | None = None,
                 resume: bool = False, tensorboard: bool = False, resume_step: int | None = None):
        self.rank, self.world_size, self.gather = rank, world_size, gather
        self.records: list[dict] = []
        self.total_steps = 0
        self.stop_agreed = False  # set by `log` on every rank once any rank asked to stop (`stop=True`)
        self.path = Path(out_dir) / "metrics.jsonl" if out_dir is not None else None
        self._reset()
        self.tensorboard = None
        if tensorboard and rank == 0 and out_dir is not None:
            # PyTorch's writer needs only the tensorboard package (Config checks it is there).
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(Path(out_dir) / "tensorboard"))
        if self.path is not None and rank == 0:
            if resume:
                repair(self.path, resume_step)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            header = {"type": "config", "config": config or {}, "run": {
                **(run_info or {}), "world_size": world_size, "host": platform.node(),
                "python": platform.python_version(), "time": time.time()}}
            with open(self.path, "a" if resume else "w") as f:
                f.write(json.dumps(header) + "\n")

    def _reset(self) -> None:
        self._sums = None  # device tensors: loss sum, correct count
        self._samples = 0
        self._steps = 0
        self._interval_start = time.perf_counter()

    def step(self, loss_sum, correct, batch_size: int) -> None:
        """Add one step: `loss_sum` and `correct` are framework tensors (summed over the batch)."""
        self.add(loss_sum, correct, batch_size)
        self.end_step()

    def add(self, loss_sum, correct, batch_size: int) -> None:
        """Add one micro batch's sums to the step (gradient accumulation: several a step)."""
        pair = (loss_sum, correct)
        self._sums = pair if self._sums is None else (self._sums[0] + loss_sum, self._sums[1] + correct)
        self._samples += batch_size

    def end_step(self) -> None:
        """Count one optimizer step (its micro batches added)."""
        self._steps += 1
        self.total_steps += 1

    @property
    def pending_steps(self) -> int:
        """Steps added since the last log (the last interval of a run may be short)."""
        return self._steps

    def log(self, step: int, epoch: float | None = None, stop: bool = False, **extra) -> dict | None:
        """Reduce across ranks (one collective; every rank must call it), record, reset.

        Reading the sums waits for the device, so the interval's clock is read after it: the
        step time is the interval's wall time over its steps, with no per-step sync.
        `stop` is this rank's request to end the run here; it rides in the same collective, so
        every rank learns at the same step whether any rank asked (`stop_agreed`), at no extra cost.
        Returns the record on rank 0 and None elsewhere."""
        loss_sum, correct = (float(v) for v in self._sums) if self._sums is not None else (0.0, 0.0)
        interval = time.perf_counter() - self._interval_start
        vector = np.array([loss_sum, correct, self._samples, self._steps, interval, float(stop)], np.float64)
        rows = self.gather(vector)
        self.stop_agreed = bool(rows[:, 5].max() > 0)
        self._reset()
        if self.rank != 0:
            return None
        record = {"type": "log", "step": step, "epoch": None if epoch is None else round(epoch, 4),
                  **summarize(rows), **extra}
        return self.write(record)

    def write(self, record: dict) -> dict:
        """Append a record (rank 0 only writes the file)."""
        self.records.append(record)
        if self.path is not None and self.rank == 0:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
        if self.tensorboard is not None and record.get("type") == "log":
            for key, value in record.items():
                if key not in ("type", "step", "epoch") and isinstance(value, (int, float)):
                    self.tensorboard.add_scalar(key, value, record["step"])
            self.tensorboard.flush()
        return record


def repair(path: Path, resume_step: int | None = None) -> None:
    """Before a resumed run appends to metrics.jsonl, drop what the stopped run left half done.

    A run killed in the middle of a write leaves a torn last line, and the resumed run's lines
    would be glued onto it; records logged after the checkpoint it resumes from (`resume_step`)
    describe steps that are trained again.  Both are removed, and said once on stderr."""
    try:
        lines = path.read_bytes().splitlines(keepends=True)
    except OSError:
        return
    kept, torn, later = [], 0, 0
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            torn += bool(line.strip())
            continue
        if resume_step is not None and record.get("type") in ("log", "summary") and \
                (record.get("step") or 0) > resume_step:
            later += 1
            continue
        kept.append(line if line.endswith(b"\n") else line + b"\n")
    if not (torn or later):
        return
    path.write_bytes(b"".join(kept))
    said = [f"{torn} torn line{'s' * (torn != 1)} (cut off mid-write)"] if torn else []
    said += [f"{later} record{'s' * (later != 1)} logged after the checkpoint at step {resume_step} (those steps "
             "are trained again)"] if later else []
    sys.stderr.write(f"{path}: dropped {' and '.join(said)}\n")


def read_jsonl(path: str | Path) -> list[dict]:
    """The records of a metrics.jsonl file; a torn line (a run killed mid-write) is left out."""
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def plot_history(path: str | Path, out_png: str | Path | None = None) -> Path:
    """Loss and throughput against step, from a metrics.jsonl file."""
    from matplotlib.figure import Figure  # no pyplot: leaves a notebook's backend and figures alone

    logs = [r for r in read_jsonl(path) if r.get("type") == "log"]
    out_png = Path(out_png or Path(path).with_suffix(".png"))
    fig = Figure(figsize=(10, 3.5), layout="constrained")
    ax_loss, ax_speed = fig.subplots(1, 2)
    steps = [r["step"] for r in logs]
    ax_loss.plot(steps, [r["loss"] for r in logs])
    ax_loss.set(xlabel="step", ylabel="training loss", yscale="log")
    ax_speed.plot(steps, [r["samples_per_s"] for r in logs])
    ax_speed.set(xlabel="step", ylabel="samples/s (all ranks)")
    fig.savefig(out_png, dpi=100)
    return out_png
