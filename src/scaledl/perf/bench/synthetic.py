"""Synthetic throughput, after Horovod's `pytorch_synthetic_benchmark.py`: random images,
one DDP rank per local device, images/s per device.

On a GPU node the model is torchvision's ResNet-50 (Horovod's default) when torchvision is
installed; otherwise, and on CPU, the ladder's CNN on MNIST-sized images.  Horovod reports
the mean +- 1.96 standard deviations over iterations; here it is the median over timed
batches with a bootstrap 95% interval, the same on every suite.
"""
from __future__ import annotations

import importlib.util
import os

from scaledl.perf.bench import stats
from scaledl.perf.bench.common import Options, headline, result, rounded
from scaledl.perf.bench.launch import run_worker


def pick_model(devices: int) -> str:
    return "resnet50" if devices and importlib.util.find_spec("torchvision") else "cnn"


def run(options: Options) -> dict:
    from scaledl.devices import accelerator_count

    devices = accelerator_count()
    ranks = devices or 1
    model = pick_model(devices)
    # On CPU the one "device" is the whole processor: give it every core.
    threads = options.threads if devices else (os.cpu_count() or 1)
    batch = 64 if model == "resnet50" else options.micro_batch_size
    launcher = "torchrun" if ranks > 1 else "python"
    measured = run_worker(launcher, ranks, "steps", [
        "--variant", "ddp", "--model", model, "--micro-batch-size", batch,
        "--steps", options.pick(20, 100), "--warmup", options.pick(5, 10)],
        options.out_dir / "synthetic" / "steps.json", threads=threads)
    laps = measured["laps"]
    per_device = [batch / lap for lap in laps]
    summary = stats.summary(per_device)
    low, high = stats.bootstrap_ci(per_device)
    row = {"model": model, "params": measured["num_params"], "device": measured["device"].split(":")[0],
           "devices": ranks, "threads": threads, "batch_per_device": batch,
           "images_per_s_per_device": rounded(summary["median"]), "ci_low": rounded(low), "ci_high": rounded(high),
           "images_per_s_total": rounded(summary["median"] * ranks), "timed_batches": summary["n"]}
    text = (f"images/s per device = {summary['median']:.1f} [{low:.1f}, {high:.1f}] on {ranks} "
            f"{row['device']} device(s), {model}; total {summary['median'] * ranks:.1f}")
    return result("synthetic", "Synthetic throughput (random images, DDP, one rank per device)",
                  list(row), [row], headline("images/s per device", summary["median"], ci=(low, high), text=text),
                  images_per_s=per_device)


def plot(data: dict, fig) -> None:
    ax = fig.subplots()
    ax.plot(data["images_per_s"], ".")
    row = data["rows"][0]
    ax.axhline(row["images_per_s_per_device"], color="tab:red", label="median")
    ax.set(xlabel="timed batch", ylabel="images/s per device",
           title=f"{row['model']} on {row['devices']} {row['device']}")
    ax.legend()
