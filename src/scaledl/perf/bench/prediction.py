"""Predict, then measure: the scaling model (scaledl.perf.predict) against real multi-rank runs here.

First the links: all-reduce, reduce-scatter and all-gather times over message sizes on N ranks,
timed where a training step meets them (between the layers of a small synthetic step) and in a
loop after a barrier (for what follows without compute between; `fit_links`), fitted to
alpha + beta n and read back to ring links (scaledl.perf.predict.link_from_fit).  Nothing below feeds
back into those fits.  Then, for each setting (model
width, micro batch, DDP bucket size, ZeRO stage, tensor parallelism: each moves the share of the
step that is communication), the same variant runs as N one-rank copies side by side (the
single-device step the model takes as input: the node as full as in the real job, and per step
the slowest copy, since a synchronous step waits for its slowest rank) and on N ranks under a real
launcher (what it must predict).  Tensor parallelism splits one model, so its input is one rank's
share instead: the N-rank job with every all-reduce skipped (worker --no-comm), its compute alone.
The prediction is that step plus the exposed communication of the strategy; the table gives
predicted / measured for every setting and the headline their median and worst.
DDP overlaps its buckets with backward only where the link allows it (`Link.overlaps`: not on
a CPU whose every core computes); the column without overlap is there to explain.
"""
from __future__ import annotations

import math
import os

import numpy as np

from scaledl.perf import predict
from scaledl.perf.bench import stats
from scaledl.perf.bench.common import Options, headline, result, rounded
from scaledl.perf.bench.launch import run_together, run_worker
from scaledl.perf.bench.variants import launcher_for, transformer_sizes

MEDIAN_TARGET, WORST_TARGET = 0.10, 0.25
SMALL, MID, WIDE = "transformer:64,2,4,32", "transformer:256,2,4,32", "transformer:512,2,8,32"
STRATEGY = {"ddp": "ddp", "zero1": "zero1", "zero2": "zero2", "zero3": "zero3", "fsdp": "fsdp2",
            "tensor_parallel": "tensor_parallel"}


def settings(quick: bool) -> list[dict]:
    """(variant, model, micro batch, DDP bucket MB, recompute, grad_accum): small to wide models, small to
    large batches; full recomputation and gradient accumulation, predicted from the step without them."""
    if quick:  # each path of the predictor once, on the small model: a run that shows the suite works, in minutes
        rows = [("ddp", SMALL, 8, None), ("ddp", SMALL, 8, 1.0, "full", 4), ("zero2", SMALL, 8, None),
                ("zero3", SMALL, 8, None)]
    else:
        rows = [("ddp", SMALL, 8, None), ("ddp", MID, 8, None), ("ddp", MID, 8, 1.0), ("zero2", MID, 8, None),
                ("zero3", MID, 8, None), ("ddp", MID, 8, None, "full"), ("ddp", MID, 8, None, "none", 4),
                ("ddp", MID, 32, None), ("ddp", SMALL, 32, None), ("ddp", WIDE, 8, None), ("ddp", WIDE, 8, 5.0),
                ("zero1", MID, 8, None), ("zero3", WIDE, 8, None), ("fsdp", MID, 8, None),
                ("tensor_parallel", MID, 8, None), ("tensor_parallel", WIDE, 8, None), ("ddp", WIDE, 8, None, "full"),
                ("ddp", SMALL, 8, None, "none", 4)]
    return [{"variant": row[0], "model": row[1], "micro_batch_size": row[2], "bucket_cap_mb": row[3],
             "recompute": row[4] if len(row) > 4 else "none", "grad_accum": row[5] if len(row) > 5 else 1}
            for row in rows]


def fit_links(options: Options, ranks: int) -> tuple[dict, dict, dict]:
    """The links the predictions read, each from an alpha-beta fit on `ranks` ranks (the comm suite's
    worker; nothing here sees a training step of the settings below):

    * inside a step (worker --in-step): what a collective adds to a step when the ranks reach it
      from compute, blocking.  FSDP2's per-unit gathers and scatters, DeepSpeed's, the first of
      DDP's buckets and tensor parallelism's all-reduces are reached so.  On this kind of machine
      that costs more than a collective in a loop: the peer arrives later (its compute ran slower
      this time), and the thread that runs the collective wakes from sleep.  Tensor parallelism's
      all-reduces are DTensor's functional collectives (an output allocated, then waited), timed
      as such;
    * in a loop after a barrier (as `scaledl bench comm` and nccl-tests time them): what follows
      without compute between, DDP's later buckets (queued behind the first on the communication
      thread) and DeepSpeed's stage 3 gathers of its persistent parameters, one after another.

    All-reduce reads back to one ring link (`link_from_fit`); reduce-scatter and all-gather get
    fits of their own (`half_link_from_fit`: Gloo does not run them as half its all-reduce's ring).
    Where communication cannot overlap (every core computes), the step pays both in turn.
    Returns the links by name (`link`, `exposed_comm_s`'s keywords, and `tensor_parallel_link`, the
    link for tensor parallelism's steps), the fits inside a step, and the fits in a loop."""
    sizes = [4096 * 8**i for i in range(5)]  # 4 KB to 16 MB: the gradients here are 0.5 to 25 MB
    measured = run_worker("torchrun", ranks, "comm", [
        "--sizes", *sizes, "--iters", options.pick(10, 20), "--warmup", 3, "--steps", 3, "--rounds", 1,
        "--bucket-sizes-mb", 25.0, "--in-step"], options.out_dir / "predict" / "collectives.json",
        threads=options.threads)

    def fit(points):
        return stats.fit_alpha_beta([p["bytes"] for p in points], [stats.summary(p["laps"])["median"] for p in points])

    fits = {name: fit(points) for name, points in measured["collectives_in_step"].items()}
    loop_fits = {name: fit(measured["collectives"][name]) for name in ("allreduce", "reducescatter", "allgather")}
    # Gloo reduces on the host: with every core computing, no bucket hides behind backward.
    overlaps = not (measured["device"] == "cpu" and ranks * options.threads >= (os.cpu_count() or 1))
    backend = measured["backend"]

    def ring(fit_, what):
        return predict.link_from_fit(fit_, ranks, f"{what} ({backend})", overlaps)

    def half(fit_, what):
        return predict.half_link_from_fit(fit_, ranks, f"{what} ({backend})", overlaps)

    links = {"link": ring(fits["allreduce"], f"all-reduce fit inside a step on {ranks} ranks"),
             "bucket_link": ring(loop_fits["allreduce"], "all-reduce fit in a loop"),
             "scatter_link": half(fits["reducescatter"], "reduce-scatter fit inside a step"),
             "gather_link": half(fits["allgather"], "all-gather fit inside a step"),
             "persistent_link": half(loop_fits["allgather"], "all-gather fit in a loop"),
             "tensor_parallel_link": ring(fits["allreduce_functional"], "functional all-reduce fit inside a step")}
    return links, fits, loop_fits


def measure(setting: dict, ranks: int, options: Options, index: int, copies: int = 1, no_comm: bool = False) -> dict:
    launcher = launcher_for(setting["variant"], options.quick) if ranks > 1 else "python"
    args = ["--no-comm"] if no_comm else []
    args += ["--variant", setting["variant"], "--model", setting["model"], "--steps", options.pick(20, 30),
            "--warmup", 5, "--micro-batch-size", setting["micro_batch_size"]]
    if setting["bucket_cap_mb"] is not None:
        args += ["--bucket-cap-mb", setting["bucket_cap_mb"]]
    if setting.get("recompute", "none") != "none":
        args += ["--recompute", setting["recompute"]]
    if setting.get("grad_accum", 1) > 1:
        args += ["--grad-accum", setting["grad_accum"]]
    name = f"setting{index}-{setting['variant']}-{ranks}{'-no-comm' if no_comm else ''}"
    out = options.out_dir / "predict" / f"{name}.json"
    if copies > 1:
        results = run_together(copies, "steps", args, out, threads=options.threads)
        # A synchronous step waits for its slowest rank: step i of the copies, timed side by side,
        # costs the slowest copy's step i.
        return {**results[0], "laps": [max(laps) for laps in zip(*(r["laps"] for r in results))]}
    return run_worker(launcher, ranks, "steps", args, out, threads=options.threads)


def gather_knobs(model_name: str, variant: str) -> dict:
    """What is gathered and scattered, in how many collectives, counted from the model's structure (not
    fitted to any step time): the FSDP2 rung shards each top-level layer with weights
    (scaledl.ladder.fsdp.wrap; scaledl.perf.predict.fsdp2_collectives); DeepSpeed's stage 3 fetches and
    prefetches along the modules' order (scaledl.perf.predict.deepspeed_zero3_gathers).
    tests/perf/test_predict.py counts both in real steps."""
    from scaledl.perf.bench.variants import model_and_batch

    model, _, _ = model_and_batch("cpu", 1, 0, 0, model_name)
    if variant == "fsdp":
        return predict.fsdp2_collectives([sum(p.numel() for p in layer.parameters()) for layer in model])
    units, backward_order = predict.module_orders(model)
    return predict.deepspeed_zero3_gathers(units, backward_order=backward_order)


def label(setting: dict) -> str:
    sizes = transformer_sizes(setting["model"])
    bucket = f" bucket {setting['bucket_cap_mb']:g}MB" if setting["bucket_cap_mb"] is not None else ""
    recompute = f" recompute {setting['recompute']}" if setting.get("recompute", "none") != "none" else ""
    accum = f" accum {setting['grad_accum']}" if setting.get("grad_accum", 1) > 1 else ""
    return f"{setting['variant']} w{sizes['width']} b{setting['micro_batch_size']}{bucket}{recompute}{accum}"


def run(options: Options) -> dict:
    ranks = max(2, options.ranks)
    links, fits, loop_fits = fit_links(options, ranks)
    link = links["link"]
    sharded = {name: links[name] for name in ("scatter_link", "gather_link", "persistent_link")}
    rows = []
    for index, setting in enumerate(settings(options.quick)):
        tensor_parallel = setting["variant"] == "tensor_parallel"
        if tensor_parallel:  # the input is one rank's step at the TP degree, measured without communication
            sizes = transformer_sizes(setting["model"])
            knobs = {**predict.tensor_parallel_collectives(sizes["depth"], setting["micro_batch_size"],
                                                          sizes["seq_len"], sizes["width"]), "split_share": 0.0}
        elif setting["variant"] == "ddp":  # the buckets after the first queue behind it
            knobs = {"bucket_link": links["bucket_link"]}
            if setting["bucket_cap_mb"] is not None:
                knobs["bucket_bytes"] = setting["bucket_cap_mb"] * 2**20
        else:  # the ZeRO stages and FSDP2 gather (and at 3, scatter) on their own fits
            knobs = dict(sharded)
            if setting["variant"] in ("zero3", "fsdp"):
                knobs.update(gather_knobs(setting["model"], setting["variant"]))
        setting_link = links["tensor_parallel_link"] if tensor_parallel else link
        strategy = STRATEGY[setting["variant"]]
        pairs = []
        # 1 rank, then N ranks, back to back, so that each pair runs under the same load; full mode
        # repeats the pair 3 times and keeps the pair of median ratio: on a shared machine whole runs
        # come out slower, not single steps (the spread of the 3 ratios is in the table).
        # The model's input is the plain micro batch's step: recomputation and accumulation are what it
        # predicts, not what it is given.
        plain = {**setting, "recompute": "none", "grad_accum": 1}
        learned = {"recompute": setting["recompute"], "grad_accum": setting["grad_accum"]}
        for _ in range(options.pick(1, 3)):
            a = (measure(plain, ranks, options, index, no_comm=True) if tensor_parallel
                 else measure(plain, 1, options, index, copies=ranks))
            b = measure(setting, ranks, options, index)
            single_s, measured_s = stats.summary(a["laps"])["median"], stats.summary(b["laps"])["median"]
            predicted_s = predict.predict_step_s(strategy, single_s, a["num_params"] * 4, ranks, setting_link,
                                                 **learned, **knobs)
            pairs.append((predicted_s / measured_s, single_s, predicted_s, measured_s, a["num_params"]))
        pairs.sort()
        ratio, single_s, predicted_s, measured_s, num_params = pairs[len(pairs) // 2]
        no_overlap_s = (predict.predict_step_s("ddp_no_overlap", single_s, num_params * 4, ranks, link, **learned,
                                               **knobs) if strategy == "ddp" else None)
        rows.append({"setting": label(setting), "variant": setting["variant"], "model": setting["model"],
                     "micro_batch_size": setting["micro_batch_size"], "bucket_cap_mb": setting["bucket_cap_mb"],
                     "params": num_params, "ranks": ranks, "single_ms": rounded(single_s * 1e3),
                     "predicted_ms": rounded(predicted_s * 1e3), "measured_ms": rounded(measured_s * 1e3),
                     "ratio": rounded(ratio), "ratio_range": f"{pairs[0][0]:.3f}-{pairs[-1][0]:.3f}",
                     "no_overlap_ms": rounded(no_overlap_s * 1e3) if no_overlap_s else None,
                     "comm_share": rounded((predicted_s - single_s) / predicted_s)})
    ratios = np.array([row["ratio"] for row in rows], np.float64)
    median = float(np.median(ratios))
    worst_row = max(rows, key=lambda row: abs(math.log(row["ratio"])))
    worst = worst_row["ratio"]
    met = abs(median - 1) <= MEDIAN_TARGET and abs(worst - 1) <= WORST_TARGET
    text = (f"predicted/measured step time over {len(rows)} settings on {ranks} ranks: median {median:.3f}, "
            f"worst {worst:.3f} ({worst_row['setting']}) (targets: median within {MEDIAN_TARGET:.0%}, worst within "
            f"{WORST_TARGET:.0%}: {'met' if met else 'missed'})")
    return result("predict", f"Predicted against measured step time on {ranks} ranks (link: {link.source})",
                  ["setting", "params", "single_ms", "predicted_ms", "measured_ms", "ratio", "ratio_range",
                   "no_overlap_ms", "comm_share"], rows,
                  headline("predicted/measured step time (median)", median,
                           f"median within {MEDIAN_TARGET:.0%}, worst within {WORST_TARGET:.0%}", met, text=text),
                  link={"alpha_s": rounded(link.alpha_s), "bandwidth_Bps": rounded(link.bandwidth_Bps),
                        "overlaps": link.overlaps,
                        "fits": {name: {k: rounded(v) for k, v in fit.items()} for name, fit in fits.items()},
                        "loop_fits": {name: {k: rounded(v) for k, v in fit.items()}
                                      for name, fit in loop_fits.items()}},
                  notes=[f"single_ms: the model's input, the slowest of {ranks} one-rank copies of the same variant "
                         "run side by side, step by step (a synchronous step waits for its slowest rank); for "
                         f"tensor parallelism, one rank's share: the {ranks}-rank job with its all-reduces skipped, "
                         "the slowest rank each step; "
                         "predicted_ms: single_ms (with recomputation, plus its extra forward; with accumulation, "
                         "times the micro batches) plus the exposed communication (scaledl.perf.predict); "
                         "ratio = predicted / measured; ratio_range: the lowest and highest ratio of the repeated "
                         "pairs (1-rank copies, then N ranks), the row showing the pair of median ratio.",
                         f"link per ring step: alpha {link.alpha_s * 1e6:.3g} us, bandwidth "
                         f"{link.bandwidth_Bps / 1e9:.3g} GB/s, from the all-reduce fit inside a step (ZeRO and "
                         "FSDP2 gather and scatter on their own fits inside a step, DeepSpeed's persistent "
                         "parameters on the all-gather's fit in a loop, DDP's buckets after the first on the "
                         "all-reduce's fit in a loop, tensor parallelism on DTensor's functional all-reduce's "
                         "fit inside a step"
                         f"{_loop_note(links['bucket_link'])}); communication " + (
                             "overlaps backward." if link.overlaps
                             else "cannot overlap backward (every core computes).")],
                  # the comm suite's shape too, so `scaledl predict --comm-json predict.json` reads the fit
                  fits={name: {k: rounded(v) for k, v in fit.items()} for name, fit in fits.items()}, ranks=ranks,
                  median=median, worst=worst, threads=options.threads)


def _loop_note(loop: predict.Link) -> str:
    return (f"; the all-reduce in a loop after a barrier: alpha {loop.alpha_s * 1e6:.3g} us, "
            f"bandwidth {loop.bandwidth_Bps / 1e9:.3g} GB/s")


def plot(data: dict, fig) -> None:
    ax = fig.subplots()
    rows = data["rows"]
    measured = [row["measured_ms"] for row in rows]
    predicted = [row["predicted_ms"] for row in rows]
    grid = np.geomspace(min(measured + predicted) * 0.7, max(measured + predicted) * 1.4, 10)
    ax.plot(grid, grid, color="gray", lw=0.8, label="predicted = measured")
    ax.fill_between(grid, grid * (1 - WORST_TARGET), grid * (1 + WORST_TARGET), color="tab:orange", alpha=0.15,
                    label=f"within {WORST_TARGET:.0%}")
    ax.fill_between(grid, grid * (1 - MEDIAN_TARGET), grid * (1 + MEDIAN_TARGET), color="tab:green", alpha=0.2,
                    label=f"within {MEDIAN_TARGET:.0%}")
    for row in rows:
        ax.plot(row["measured_ms"], row["predicted_ms"], "o", color="tab:blue")
        ax.annotate(row["setting"], (row["measured_ms"], row["predicted_ms"]), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    ax.set(xscale="log", yscale="log", xlabel="measured ms per step", ylabel="predicted ms per step",
           title=f"{rows[0]['ranks']} ranks: median ratio {data['median']:.3f}, worst {data['worst']:.3f}")
    ax.legend(fontsize=8, loc="upper left")
