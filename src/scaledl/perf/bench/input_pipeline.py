"""Input pipeline: can the loader feed the training step?

The ladder's loader (`sharding.torch_train_loader` over the embedded MNIST, in memory) is
timed batch by batch, including the copy to the device, and the plain training step is
timed on a batch already there; blocks of each alternate in this process, with the same
threads.  The ratio of the loader's samples/s to the step's is the headline: above 1 the
loader keeps up, below 1 the device waits for data (then raise DataLoader's num_workers,
pin memory, or pre-stage the data).
"""
from __future__ import annotations

import time

from scaledl.perf.bench import stats
from scaledl.perf.bench.common import Options, headline, result, rounded
from scaledl.timing import synchronize


def _loader_batches(loader, device):
    """Batches forever, epoch after epoch, each moved to the device."""
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        epoch += 1


def time_loader(batches, device, count: int) -> list[float]:
    laps = []
    for _ in range(count):
        start = time.perf_counter()
        next(batches)
        synchronize(device)
        laps.append(time.perf_counter() - start)
    return laps


def run(options: Options) -> dict:
    import torch

    from scaledl import datasets, sharding
    from scaledl.perf.bench import variants
    from scaledl.perf.bench.worker import time_steps

    torch.set_num_threads(options.threads)
    variant = variants.build("plain", options.micro_batch_size, options.threads)
    data = datasets.load_dataset("mnist-embedded")
    loader = sharding.torch_train_loader(data, options.micro_batch_size, 0, 1, seed=0)
    batches = _loader_batches(loader, variant.device)
    count, rounds = options.pick(20, 50), options.pick(3, 8)
    time_loader(batches, variant.device, 5)  # warm-up
    time_steps(variant, 0, 5)
    loader_laps, step_laps, ratios = [], [], []
    for _ in range(rounds):
        a, b = time_loader(batches, variant.device, count), time_steps(variant, count, 0)
        loader_laps, step_laps = loader_laps + a, step_laps + b
        ratios.append(stats.summary(b)["median"] / stats.summary(a)["median"])  # supply rate / demand rate
    interval = stats.median_ratio(ratios)
    rows = []
    for name, laps in (("loader (next batch, to device)", loader_laps), ("training step (plain)", step_laps)):
        summary = stats.summary(laps)
        rows.append({"stage": name, "ms_per_batch": rounded(summary["median"] * 1e3),
                     "p10_ms": rounded(summary["p10"] * 1e3), "p90_ms": rounded(summary["p90"] * 1e3),
                     "samples_per_s": rounded(options.micro_batch_size / summary["median"]), "batches": summary["n"]})
    keeps_up = interval["ratio"] >= 1
    text = (f"loader supply / step demand = {interval['ratio']:.3f} "
            f"[{interval['ci_low']:.3f}, {interval['ci_high']:.3f}] "
            f"({'the loader keeps up' if keeps_up else 'the step waits for data'})")
    return result("input", f"Input pipeline vs the training step, batch {options.micro_batch_size}, "
                  f"{options.threads} thread(s)",
                  ["stage", "ms_per_batch", "p10_ms", "p90_ms", "samples_per_s", "batches"],
                  rows, headline("loader supply / step demand", interval["ratio"], ">= 1", keeps_up,
                                 (interval["ci_low"], interval["ci_high"]), text=text),
                  laps={"loader": loader_laps, "step": step_laps})


def plot(data: dict, fig) -> None:
    ax = fig.subplots()
    ax.boxplot([data["laps"]["loader"], data["laps"]["step"]], showfliers=False)
    ax.set_xticks([1, 2], ["loader batch", "training step"])
    ax.set(ylabel="seconds per batch", title="the loader must be faster than the step")
