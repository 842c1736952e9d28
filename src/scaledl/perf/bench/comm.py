"""Communication: collective bandwidth, the alpha-beta model, DDP buckets, Horovod fusion.

Bandwidths follow nccl-tests (PERFORMANCE.md there): algbw = size / time, and busbw
scales algbw by what each rank must move, so that it is comparable with the link's speed
whatever the collective and the rank count:

    allreduce      busbw = algbw * 2 (n - 1) / n
    allgather      busbw = algbw * (n - 1) / n      (size: the gathered output)
    reducescatter  busbw = algbw * (n - 1) / n      (size: the input each rank reduces)
    broadcast      busbw = algbw

The time of one message of n bytes is modelled as t = alpha + beta * n (latency plus
bytes over bandwidth), fitted to the measured points for each collective and drawn
against them.  Then the two knobs that trade these terms off in training: DDP's bucket
size (`bucket_cap_mb`) and Horovod's fusion threshold (HOROVOD_FUSION_THRESHOLD).
"""
from __future__ import annotations

import numpy as np

from scaledl.perf.bench import stats
from scaledl.perf.bench.common import Options, headline, result, rounded
from scaledl.perf.bench.launch import run_worker
from scaledl.perf.bench.variants import launcher_for

BUS_FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
              "reducescatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


def sizes(quick: bool) -> list[int]:
    """4 KB to 64 MB by factors of 4 (quick: by factors of 8, up to 2 MB)."""
    return [4096 * 8**i for i in range(4)] if quick else [4096 * 4**i for i in range(8)]


def run(options: Options) -> dict:
    ranks = options.ranks
    buckets_mb = options.pick([0.1, 25.0], [0.05, 0.25, 1.0, 5.0, 25.0])
    measured = run_worker("torchrun", ranks, "comm", [
        "--sizes", *sizes(options.quick), "--iters", 20, "--warmup", 5, "--steps", 20, "--rounds", options.pick(2, 4),
        "--micro-batch-size", options.micro_batch_size, "--bucket-sizes-mb", *buckets_mb],
        options.out_dir / "comm" / "collectives.json", threads=options.threads)
    thresholds = options.pick([0, 64 * 2**20], [0, 2**18, 2**20, 2**22, 64 * 2**20])
    fused = run_worker(launcher_for("horovod", options.quick), ranks, "fusion", [
        "--thresholds", *thresholds, "--steps", 20, "--warmup", 5, "--micro-batch-size", options.micro_batch_size],
        options.out_dir / "comm" / "fusion.json", threads=options.threads)
    rows, fits = [], {}
    for name, points in measured["collectives"].items():
        seconds = [stats.summary(p["laps"])["median"] for p in points]
        fits[name] = stats.fit_alpha_beta([p["bytes"] for p in points], seconds)
        for point, t in zip(points, seconds):
            algbw = point["bytes"] / t / 1e9
            rows.append({"collective": name, "bytes": point["bytes"], "time_us": rounded(t * 1e6),
                         "p90_us": rounded(stats.summary(point["laps"])["p90"] * 1e6),
                         "algbw_GBps": rounded(algbw), "busbw_GBps": rounded(algbw * BUS_FACTOR[name](ranks)),
                         "model_us": rounded((fits[name]["alpha_s"]
                                              + fits[name]["beta_s_per_byte"] * point["bytes"]) * 1e6)})
    bucket_rows = [{"bucket_cap_mb": b["bucket_cap_mb"], **_step_columns(b["laps"])}
                   for b in measured["ddp_buckets"]]
    fusion_rows = [{"fusion_threshold_bytes": f["threshold_bytes"], **_step_columns(f["laps"])}
                   for f in fused["fusion"]]
    largest = max((r for r in rows if r["collective"] == "allreduce"), key=lambda r: r["bytes"])
    allreduce = fits["allreduce"]
    model_over_measured = largest["model_us"] / largest["time_us"]
    text = (f"allreduce on {ranks} ranks: busbw {largest['busbw_GBps']:.3g} GB/s at {largest['bytes']} B; "
            f"alpha-beta fit: alpha {allreduce['alpha_s'] * 1e6:.3g} us, "
            f"1/beta {allreduce['bandwidth_Bps'] / 1e9:.3g} GB/s; "
            f"model/measured time at the largest size = {model_over_measured:.3f}")
    return result("comm", f"Collectives on {ranks} ranks ({measured['backend']}), time per call",
                  ["collective", "bytes", "time_us", "p90_us", "algbw_GBps", "busbw_GBps", "model_us"], rows,
                  headline("allreduce alpha-beta model / measured time (largest size)", model_over_measured, text=text),
                  fits={k: {n: rounded(v) for n, v in fit.items()} for k, fit in fits.items()},
                  tables={"DDP bucket size sweep (training step)": bucket_rows,
                          "Horovod fusion threshold sweep (training step)": fusion_rows},
                  ranks=ranks, backend=measured["backend"])


def _step_columns(laps: list[float]) -> dict:
    summary = stats.summary(laps)
    return {"step_ms": rounded(summary["median"] * 1e3), "p10_ms": rounded(summary["p10"] * 1e3),
            "p90_ms": rounded(summary["p90"] * 1e3), "timed_steps": summary["n"]}


def plot(data: dict, fig) -> None:
    ax_time, ax_buckets, ax_fusion = fig.subplots(1, 3, gridspec_kw={"width_ratios": [2, 1, 1]})
    for name, fit in data["fits"].items():
        points = [row for row in data["rows"] if row["collective"] == name]
        x = np.array([row["bytes"] for row in points], np.float64)
        line, = ax_time.plot(x, [row["time_us"] for row in points], "o", label=name)
        grid = np.geomspace(x.min(), x.max(), 50)
        ax_time.plot(grid, (fit["alpha_s"] + fit["beta_s_per_byte"] * grid) * 1e6, "-", color=line.get_color(), lw=1)
    ax_time.set(xscale="log", yscale="log", xlabel="message bytes", ylabel="time per call (us)",
                title="points: measured, lines: alpha + beta n")
    ax_time.legend()
    for ax, key, label, title in ((ax_buckets, "DDP bucket size sweep (training step)", "bucket_cap_mb", "DDP buckets"),
                                  (ax_fusion, "Horovod fusion threshold sweep (training step)",
                                   "fusion_threshold_bytes", "Horovod fusion")):
        table = data["tables"][key]
        ax.bar(range(len(table)), [row["step_ms"] for row in table],
               yerr=[[row["step_ms"] - row["p10_ms"] for row in table],
                     [row["p90_ms"] - row["step_ms"] for row in table]],
               capsize=3)
        scale, unit = (2**20, "MiB") if label.endswith("bytes") else (1, "MB")
        ax.set_xticks(range(len(table)), [f"{row[label] / scale:g}" for row in table], fontsize=8)
        ax.set(xlabel=f"{label.removesuffix('_bytes').removesuffix('_mb')} ({unit})", ylabel="ms per step (p10-p90)",
               title=title)
