"""The layout chooser against runs: `scaledl predict --layouts`' ranking (scaledl.perf.choose) of the layouts the
rungs run here, each then run for real on N ranks (2 by default) and timed.

`choose.layouts` ranks dp x tp x pp, ZeRO stage, recomputation and micro batch by a predicted step on a machine
it is told about.  Here the machine is this one, measured before any layout runs and never fitted to them:
- the device's rate, what the chooser calls peak x MFU: N copies of the one-process rung on the language model,
  run side by side at the data-parallel micro batch (the node as full as in an N-rank job), the slowest copy's
  tokens/s times the model's flops per token (`models.gpt_flops_per_token`);
- the link: the all-reduce fitted inside a training step on N ranks (`prediction.fit_links`, the same fit
  `scaledl bench predict` reads), for tensor parallelism's all-reduces, the pipeline's sends and the data-
  parallel reduction alike;
- tensor parallelism's all-reduces a block: the rung's 6, not Megatron-LM's 4.
Then every layout below is predicted by `choose.evaluate` (fp32, the rungs' precision here) and run by its rung:
dp with ZeRO 0 (the ddp rung) or 1-3 (the deepspeed rung), tp (tensor_parallel), pp under 1F1B (pipeline).
The rungs cover one kind of parallelism at a time on N ranks, so the layouts mixing two are not run.

The headline is Spearman's rank correlation between the predicted and the measured step times, and how much
slower than the fastest measured layout the chooser's first pick ran: what choosing by the prediction costs.
On a CPU the chooser's model leaves out what matters most here (a micro batch's efficiency, the sends' cost
on cores that also compute: its docstring lists what it leaves out), so expect the two orders to differ where
those dominate; the table says where.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import numpy as np

from scaledl import models
from scaledl.hpc import launchers
from scaledl.perf import choose, predict
from scaledl.perf.bench.common import Options, headline, result, rounded

SIZES = {"width": 64, "depth": 4, "heads": 2, "seq_len": 64}
GLOBAL_BATCH_SIZE = 16  # sequences a step, in every layout
STEPS, LOG_INTERVAL = 22, 2  # the rung's summary: the median of the 10 log intervals after the first
RHO_TARGET = 0.8


def layouts(ranks: int, quick: bool) -> list[dict]:
    """(dp, tp, pp, zero, recompute, micro_batch_size) the rungs run on `ranks` ranks, one kind of parallelism
    at a time."""
    n, g = ranks, GLOBAL_BATCH_SIZE
    rows = [(n, 1, 1, 0, "none", g // n), (n, 1, 1, 2, "none", g // n), (1, n, 1, 0, "none", g),
            (1, 1, n, 0, "none", g // 4)]  # with --quick: one layout a rung
    if not quick:
        rows += [(n, 1, 1, 0, "full", g // n), (1, 1, n, 0, "none", g // 8), (n, 1, 1, 0, "none", g // (2 * n)),
                 (n, 1, 1, 1, "none", g // n), (n, 1, 1, 3, "none", g // n), (1, n, 1, 0, "full", g),
                 (1, n, 1, 0, "none", g // 2), (1, 1, n, 0, "full", g // 4)]
    keys = ("dp", "tp", "pp", "zero", "recompute", "micro_batch_size")
    return [dict(zip(keys, row)) for row in rows]


def label(layout: dict) -> str:
    recompute = " recompute" if layout["recompute"] == "full" else ""
    return (f"dp{layout['dp']} tp{layout['tp']} pp{layout['pp']} zero{layout['zero']} "
            f"b{layout['micro_batch_size']}{recompute}")


def _language_model_run(out_dir: Path) -> list[str]:
    """The flags every run here shares: the model at SIZES, STEPS steps, logged every LOG_INTERVAL."""
    return ["--model", "gpt", *(f"--{k.replace('_', '-')}={v}" for k, v in SIZES.items()), "--max-steps", str(STEPS),
            "--log-interval", str(LOG_INTERVAL), "--out-dir", str(out_dir), "--overwrite"]


def rung_command(layout: dict, out_dir: Path) -> tuple[str, list[str]]:
    """The rung and its flags that run `layout` at the global batch."""
    dp, tp, pp, mbs = layout["dp"], layout["tp"], layout["pp"], layout["micro_batch_size"]
    args = [*_language_model_run(out_dir), "--recompute", layout["recompute"]]
    if pp > 1:  # the pipeline's batch is split into its micro batches
        return "pipeline", [*args, "--schedule", "1f1b", "--batch-size", str(GLOBAL_BATCH_SIZE),
                            "--microbatches", str(GLOBAL_BATCH_SIZE // mbs)]
    accum = ["--grad-accum", str(GLOBAL_BATCH_SIZE // (dp * mbs)), "--batch-size", str(mbs)]
    if tp > 1:
        return "tensor_parallel", [*args, *accum]
    if layout["zero"]:
        return "deepspeed", [*args, *accum, "--zero-stage", str(layout["zero"])]
    return "ddp", [*args, *accum]


def _run(command: list[str], env: dict, log: Path) -> None:
    with open(log, "w") as output:
        done = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, env=env, timeout=600)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}; see {log}\n{log.read_text()[-2000:]}")


def device_rate(ranks: int, out_dir: Path) -> tuple[float, str]:
    """FLOP/s of one rank with the node full: `ranks` one-process runs side by side, the slowest."""
    mbs = GLOBAL_BATCH_SIZE // ranks
    env = launchers.local_env(ranks)  # each copy gets its share of the cores, as a rank does
    started = []
    for copy in range(ranks):
        folder = out_dir / f"rate{copy}"
        command = launchers.python_module("scaledl.ladder.single_torch",
                                          [*_language_model_run(folder), "--batch-size", str(mbs)])
        log = open(out_dir / f"rate{copy}.log", "w")
        started.append((folder, log, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)))
    tokens = []
    for folder, log, process in started:
        code = process.wait(timeout=600)
        log.close()
        if code:
            raise RuntimeError(f"a one-process copy exited {code}; see {log.name}")
        tokens.append(json.loads((folder / "summary.json").read_text())["tokens_per_s"])
    rate = min(tokens) * models.gpt_flops_per_token(SIZES["width"], SIZES["depth"], SIZES["seq_len"])
    return rate, (f"{ranks} one-process copies side by side at micro batch {mbs}, the slowest: "
                  f"{min(tokens):,.0f} tokens/s, {rate / 1e9:.3g} GFLOP/s")


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (no ties expected among measured times)."""
    rank_a, rank_b = (np.argsort(np.argsort(values)).astype(float) for values in (a, b))
    return float(np.corrcoef(rank_a, rank_b)[0, 1])


def pairs_in_order(rows: list[dict]) -> tuple[int, int]:
    """How many pairs of layouts the runs put in the model's order (the faster predicted ran faster), of all
    pairs: a figure title a reader parses without Spearman's correlation."""
    pairs = list(itertools.combinations(rows, 2))
    same = sum((a["predicted_ms"] - b["predicted_ms"]) * (a["measured_ms"] - b["measured_ms"]) > 0 for a, b in pairs)
    return same, len(pairs)


def agreement(rows: list[dict]) -> tuple[float, dict, dict, float]:
    """How the chooser's order agrees with the runs': Spearman's correlation, its first pick, the fastest layout
    measured, and how much slower than that one the pick ran."""
    rho = spearman([row["predicted_ms"] for row in rows], [row["measured_ms"] for row in rows])
    pick = min(rows, key=lambda row: row["predicted_ms"])
    fastest = min(rows, key=lambda row: row["measured_ms"])
    return rho, pick, fastest, pick["measured_ms"] / fastest["measured_ms"] - 1


def compare(chosen: list[dict], ranks: int, folder: Path, options: Options | None = None) -> tuple[list[dict], dict]:
    """Predict each layout of `chosen` (dicts of dp, tp, pp, zero, recompute, micro_batch_size) from this
    machine's measured rate and link, then run it by its rung, writing under `folder`.  Returns the rows (the
    chooser's step and its parts, the rung's measured step, both orders) and what was measured."""
    from scaledl.perf.bench.prediction import fit_links

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    links, _, _ = fit_links(options or Options(out_dir=folder, quick=True), ranks)
    link = links["link"]
    rate, rate_source = device_rate(ranks, folder)
    system = predict.System("here", ranks, link, link, "this machine, measured")
    memory = (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // ranks
    device = choose.Device("this machine's rank", memory, rate, rate_source)
    env = launchers.local_env(ranks)
    rows = []
    for index, layout in enumerate(chosen):
        refused = choose.refusal(SIZES, system, 1, GLOBAL_BATCH_SIZE, layout["dp"], layout["tp"], layout["pp"],
                                 layout["zero"], layout["recompute"], layout["micro_batch_size"])
        if refused:  # a rank count the model's heads or blocks do not divide
            continue
        predicted = choose.evaluate(SIZES, system, device, 1, GLOBAL_BATCH_SIZE, precision="fp32", mfu=1.0,
                                    tp_allreduces_per_block=predict.RUNG_TP_ALLREDUCES_PER_BLOCK,
                                    **{k: layout[k] for k in ("dp", "tp", "pp", "recompute", "micro_batch_size")},
                                    stage=layout["zero"])
        rung, args = rung_command(layout, folder / f"layout{index}")
        launcher = "deepspeed" if rung == "deepspeed" else "torchrun"
        _run(launchers.for_launcher(launcher, ranks, f"scaledl.ladder.{rung}", args), env,
             folder / f"layout{index}.log")
        summary = json.loads((folder / f"layout{index}" / "summary.json").read_text())
        measured_s = GLOBAL_BATCH_SIZE / summary["samples_per_s"]
        rows.append({"layout": label(layout), "rung": rung, **layout, "micro_batches": predicted["micro_batches"],
                     "predicted_ms": rounded(predicted["step_s"] * 1e3), "measured_ms": rounded(measured_s * 1e3),
                     "ratio": rounded(predicted["step_s"] / measured_s),
                     "compute_ms": rounded((predicted["step_s"] - predicted["tp_s"] - predicted["pp_s"]
                                            - predicted["dp_s"]) * 1e3),
                     **{f"{part}_ms": rounded(predicted[f"{part}_s"] * 1e3) for part in ("tp", "pp", "dp")},
                     "bubble": rounded(predicted["bubble"])})
    predicted_order = sorted(rows, key=lambda row: row["predicted_ms"])
    measured_order = sorted(rows, key=lambda row: row["measured_ms"])
    for row in rows:
        row["predicted_rank"] = predicted_order.index(row) + 1
        row["measured_rank"] = measured_order.index(row) + 1
    return rows, {"rate_flops": rate, "rate_source": rate_source, "link": link}


def run(options: Options) -> dict:
    ranks = max(2, options.ranks)
    rows, machine = compare(layouts(ranks, options.quick), ranks, options.out_dir / "layouts", options)
    rate, rate_source, link = machine["rate_flops"], machine["rate_source"], machine["link"]
    rho, pick, fastest, cost = agreement(rows)
    text = (f"the chooser's order against the measured one over {len(rows)} layouts on {ranks} ranks: Spearman "
            f"{rho:.2f} (target {RHO_TARGET:g}: {'met' if rho >= RHO_TARGET else 'missed'}); its first pick, "
            f"{pick['layout']}, ran {cost:.0%} slower than the fastest, {fastest['layout']}")
    return result("layouts", f"The chooser's predicted step against the rungs' measured one, {ranks} ranks, "
                             f"gpt {SIZES}, {GLOBAL_BATCH_SIZE} sequences a step",
                  ["layout", "rung", "micro_batches", "predicted_ms", "measured_ms", "ratio", "predicted_rank",
                   "measured_rank", "compute_ms", "tp_ms", "pp_ms", "dp_ms", "bubble"], rows,
                  headline("Spearman rank correlation, predicted against measured step", rho, f">= {RHO_TARGET:g}",
                           rho >= RHO_TARGET, text=text),
                  rho=rho, pick_cost=cost, ranks=ranks,
                  methodology=(f"The device's rate and the link are measured before any layout runs, and nothing is "
                               f"fitted to the layouts' runs. Each layout runs by its rung for {STEPS} steps, one "
                               f"layout after another; its step is the global batch over the rung's samples/s, the "
                               f"median of its log intervals of {LOG_INTERVAL} steps after the first "
                               f"({STEPS - LOG_INTERVAL} timed steps). Targets are reported, not asserted."),
                  device={"rate_flops": rounded(rate), "source": rate_source},
                  link={"alpha_s": rounded(link.alpha_s), "bandwidth_Bps": rounded(link.bandwidth_Bps),
                        "overlaps": link.overlaps, "source": link.source},
                  notes=[f"device: {rate_source} (the chooser's peak x MFU, one rate for every layout); link: "
                         f"{link.source}, alpha {link.alpha_s * 1e6:.3g} us, bandwidth "
                         f"{link.bandwidth_Bps / 1e9:.3g} GB/s" + ("" if link.overlaps else
                                                                    ", no overlap (every core computes)"),
                         "predicted_ms: choose.evaluate, compute_ms (the flops at the measured rate, stretched by "
                         "the bubble) plus tp_ms, pp_ms and dp_ms; measured_ms: the rung's summary, the global "
                         "batch over its samples/s (the median of its log intervals after the first); "
                         "ratio = predicted / measured; the ranks: 1 is the fastest."])


def plot(data: dict, fig) -> None:
    draw(fig.subplots(), data["rows"], data["ranks"])


def draw(ax, rows: list[dict], ranks: int) -> None:
    """Predicted against measured step, one point a layout; the title gives how many pairs of layouts ran in the
    model's order and what the chooser's first pick cost."""
    values = [row["measured_ms"] for row in rows] + [row["predicted_ms"] for row in rows]
    grid = np.geomspace(min(values) * 0.7, max(values) * 1.4, 10)
    ax.plot(grid, grid, color="gray", lw=0.8, label="predicted = measured")
    for row in rows:
        ax.plot(row["measured_ms"], row["predicted_ms"], "o", color="tab:blue")
        ax.annotate(row["layout"], (row["measured_ms"], row["predicted_ms"]), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    _, _, _, cost = agreement(rows)
    same, pairs = pairs_in_order(rows)
    ax.set(xscale="log", yscale="log", xlabel="measured ms per step", ylabel="predicted ms per step")
    ax.set_title(f"{ranks} ranks: {same} of {pairs} pairs of layouts ran in the model's order;\nits first pick ran "
                 f"{cost:.0%} slower than the fastest", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")


def figure(rows: list[dict], ranks: int):
    """`compare`'s rows as a figure (a notebook shows it with scaledl.workshop.plots.image)."""
    from matplotlib.figure import Figure  # no pyplot: leaves a notebook's backend and figures alone

    fig = Figure(figsize=(8, 4))
    draw(fig.subplots(), rows, ranks)
    fig.tight_layout()
    return fig
