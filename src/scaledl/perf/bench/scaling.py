"""Scaling: weak scaling from 1 to N ranks for every data-parallel rung.

Each rank keeps the same micro batch and one thread (on a GPU node: one device), so with
perfect scaling a step takes as long on N ranks as on one, and the efficiency
t(1 rank) / t(N ranks) is 1.  The N-rank job runs under a real launcher (the rung's own;
with --quick one that starts faster, see `variants.LAUNCHER`); the 1-rank job runs the
same code as one process.  The two alternate (1, N, 1, N, ...) and
rounds continue until the efficiency's 95% interval is within 2% or the cap is hit.
An efficiency above 1.0 is flagged: it means noise or a cache effect, not a free lunch.
"""
from __future__ import annotations

from scaledl.perf.bench import stats
from scaledl.perf.bench.common import Options, headline, result, rounded
from scaledl.perf.bench.launch import run_worker
from scaledl.perf.bench.variants import launcher_for

QUICK_RUNGS = ("ddp", "horovod", "deepspeed", "fsdp")
ALL_RUNGS = ("ddp", "horovod", "deepspeed", "zero1", "zero2", "zero3", "fsdp")
TARGET = 0.95  # for DDP
TOLERANCE = 0.02


def measure(rung: str, ranks: int, options: Options, round_index: int) -> list[float]:
    launcher = launcher_for(rung, options.quick) if ranks > 1 else "python"
    args = ["--variant", rung, "--steps", options.pick(20, 40), "--warmup", options.pick(5, 10),
            "--micro-batch-size", options.micro_batch_size]
    out = options.out_dir / "scaling" / f"{rung}-{ranks}-{round_index}.json"
    return run_worker(launcher, ranks, "steps", args, out, threads=options.threads)["laps"]


def run(options: Options) -> dict:
    ranks = options.ranks
    min_rounds, max_rounds = options.pick((1, 1), (2, 4))
    rows, laps = [], {}
    for rung in options.pick(QUICK_RUNGS, ALL_RUNGS):
        one, many, per_round = [], [], []
        for round_index in range(max_rounds):
            a, b = measure(rung, 1, options, round_index), measure(rung, ranks, options, round_index)
            one, many = one + a, many + b
            per_round.append(stats.summary(a)["median"] / stats.summary(b)["median"])
            interval = (stats.ratio_of_medians(one, many) if len(per_round) == 1 else stats.median_ratio(per_round))
            if round_index + 1 >= min_rounds and stats.converged(interval, TOLERANCE):
                break
        laps[rung] = {"1": one, str(ranks): many}
        t1, tn = stats.summary(one), stats.summary(many)
        rows.append({"rung": rung, "ranks": ranks, "step_ms_1": rounded(t1["median"] * 1e3),
                     "step_ms_n": rounded(tn["median"] * 1e3),
                     "samples_per_s_1": rounded(options.micro_batch_size / t1["median"]),
                     "samples_per_s_n": rounded(ranks * options.micro_batch_size / tn["median"]),
                     "efficiency": rounded(interval["ratio"]), "ci_low": rounded(interval["ci_low"]),
                     "ci_high": rounded(interval["ci_high"]), "rounds": len(per_round),
                     "launcher": launcher_for(rung, options.quick),
                     "flag": "above 1.0" if interval["ratio"] > 1.0 else ""})
    ddp = next(row for row in rows if row["rung"] == "ddp")
    flagged = [row["rung"] for row in rows if row["flag"]]
    text = (f"ddp weak-scaling efficiency 1 -> {ranks} ranks = {ddp['efficiency']:.3f} "
            f"[{ddp['ci_low']:.3f}, {ddp['ci_high']:.3f}] (target >= {TARGET}: "
            f"{'met' if ddp['efficiency'] >= TARGET else 'missed'})"
            + (f"; above 1.0: {', '.join(flagged)}" if flagged else ""))
    return result("scaling", f"Weak scaling, 1 -> {ranks} ranks, same micro batch per rank",
                  ["rung", "ranks", "step_ms_1", "step_ms_n", "samples_per_s_1", "samples_per_s_n", "efficiency",
                   "ci_low", "ci_high", "rounds", "launcher", "flag"], rows,
                  headline("ddp weak-scaling efficiency", ddp["efficiency"], f">= {TARGET}",
                           ddp["efficiency"] >= TARGET, (ddp["ci_low"], ddp["ci_high"]), text=text),
                  laps=laps, threads=options.threads, micro_batch_size=options.micro_batch_size)


def plot(data: dict, fig) -> None:
    ax = fig.subplots()
    rows = data["rows"]
    x = range(len(rows))
    ax.bar(x, [row["efficiency"] for row in rows],
           yerr=[[row["efficiency"] - row["ci_low"] for row in rows],
                 [row["ci_high"] - row["efficiency"] for row in rows]],
           capsize=4, color=["tab:red" if row["flag"] else "tab:blue" for row in rows])
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.axhline(TARGET, color="tab:green", ls="--", lw=0.8, label=f"target {TARGET} (ddp)")
    ax.set_xticks(list(x), [row["rung"] for row in rows])
    ax.set(ylabel=f"efficiency t(1) / t({rows[0]['ranks']})", title="weak scaling (95% interval)")
    ax.legend(loc="lower right")
