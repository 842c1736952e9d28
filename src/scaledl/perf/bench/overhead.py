"""Overhead: the plain loop against DDP, Horovod and DeepSpeed (stage 0) at world size 1.

Each variant lives in its own process, built once, and the suite asks them in turn for a
block of timed steps: A B C D, then B C D A, ... (the order rotates so that no variant
always runs first after a pause).  Separate processes keep one framework's background
threads (Horovod's cycle loop, gloo's) and allocator state out of another's numbers, and
only the one being asked works while the others block on a read, so every variant sees
the same idle machine; building them once keeps process start-up out of every block.
One round gives a ratio per variant (its median step time over the plain loop's, same
round); rounds continue until each ratio's 95% interval is within 1% or the cap is hit.
"""
from __future__ import annotations

from scaledl.perf.bench import stats
from scaledl.perf.bench.common import Options, headline, result, rounded
from scaledl.perf.bench.launch import ServeWorker

VARIANTS = ("plain", "ddp", "horovod", "deepspeed")
TARGETS = {"ddp": 1.03, "horovod": 1.05, "deepspeed": 1.05}  # time ratio over the plain loop
TOLERANCE = 0.01


def run(options: Options) -> dict:
    steps = options.pick(20, 50)
    min_rounds, max_rounds = options.pick((3, 5), (5, 15))
    workers = [ServeWorker(name, options.out_dir / "logs", options.threads, options.micro_batch_size,
                           warmup=options.pick(5, 10)) for name in VARIANTS]
    laps = {name: [] for name in VARIANTS}
    ratios = {name: [] for name in TARGETS}
    try:
        for worker in workers:
            worker.ready()
        for round_index in range(max_rounds):
            medians = {}
            shift = round_index % len(workers)
            for worker in workers[shift:] + workers[:shift]:
                block = worker.time_steps(steps)
                laps[worker.variant] += block
                medians[worker.variant] = stats.summary(block)["median"]
            for name in TARGETS:
                ratios[name].append(medians[name] / medians["plain"])
            intervals = {name: stats.median_ratio(values) for name, values in ratios.items()}
            if round_index + 1 >= min_rounds and all(stats.converged(i, TOLERANCE) for i in intervals.values()):
                break
    finally:
        for worker in workers:
            worker.close()
    rows = []
    for name in VARIANTS:
        summary = stats.summary(laps[name])
        interval = intervals.get(name, {"ratio": 1.0, "ci_low": 1.0, "ci_high": 1.0})
        rows.append({"variant": name, "step_ms": rounded(summary["median"] * 1e3),
                     "p10_ms": rounded(summary["p10"] * 1e3), "p90_ms": rounded(summary["p90"] * 1e3),
                     "steps_per_s": rounded(1 / summary["median"]), "time_ratio": rounded(interval["ratio"]),
                     "ci_low": rounded(interval["ci_low"]), "ci_high": rounded(interval["ci_high"]),
                     "target": f"<= {TARGETS[name]}" if name in TARGETS else "",
                     "met": interval["ratio"] <= TARGETS[name] if name in TARGETS else None,
                     "timed_steps": summary["n"]})
    parts = [f"{name}/plain {intervals[name]['ratio']:.3f} [{intervals[name]['ci_low']:.3f}, "
             f"{intervals[name]['ci_high']:.3f}] "
             f"(<= {target}: {'met' if intervals[name]['ratio'] <= target else 'missed'})"
             for name, target in TARGETS.items()]
    ddp = intervals["ddp"]
    return result("overhead", "Framework overhead at world size 1 (time per step over the plain loop)",
                  ["variant", "step_ms", "p10_ms", "p90_ms", "steps_per_s", "time_ratio", "ci_low", "ci_high",
                   "target", "met", "timed_steps"], rows,
                  headline("ddp/plain time ratio", ddp["ratio"], "<= 1.03", ddp["ratio"] <= TARGETS["ddp"],
                           (ddp["ci_low"], ddp["ci_high"]), text="time ratio: " + "; ".join(parts)),
                  rounds=len(ratios["ddp"]), steps_per_block=steps, threads=options.threads,
                  micro_batch_size=options.micro_batch_size, laps={k: v for k, v in laps.items()})


def plot(data: dict, fig) -> None:
    ax = fig.subplots()
    names = [row["variant"] for row in data["rows"]]
    ax.boxplot([data["laps"][name] for name in names], showfliers=False)
    ax.set_xticks(range(1, len(names) + 1), names)
    ax.set(ylabel="seconds per step", title=f"world size 1, {data['threads']} thread(s), "
           f"batch {data['micro_batch_size']}, {data['rounds']} interleaved rounds")
