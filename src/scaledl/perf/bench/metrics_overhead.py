"""Helper overhead: the training loop with `scaledl.metrics.History` on and off.

Both loops are the ladder's step (forward, loss, backward, SGD step, plus the loss sum and
correct count it returns); the "on" loop also calls `History.step` every step and
`History.log` every `log_interval` steps, writing metrics.jsonl as a rung does.  Blocks
alternate in this process (off, on, off, on, ...), each a whole number of log intervals,
and each block's mean step time is compared (a median would hide the logging step).
"""
from __future__ import annotations

import time

from scaledl.perf.bench import stats
from scaledl.perf.bench.common import Options, headline, result, rounded
from scaledl.timing import synchronize

TARGET = 1.01
LOG_INTERVAL = 20  # the rungs' default --log-interval


def _ladder_step(micro_batch_size: int):
    """The rungs' train_step on a fixed batch: returns the loss sum and correct count."""
    import torch
    import torch.nn.functional as F

    from scaledl import distributed
    from scaledl.perf.bench.variants import model_and_batch

    device = distributed.pick_device(0)
    model, x, y = model_and_batch(device, micro_batch_size, 0, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach() * len(y), (logits.argmax(1) == y).sum()

    return step, device, len(y)


def time_block(step, device, steps: int, history=None, batch_size: int = 0) -> float:
    """Mean seconds per step over a block (device synchronized at both ends)."""
    synchronize(device)
    start = time.perf_counter()
    for index in range(1, steps + 1):
        loss_sum, correct = step()
        if history is not None:
            history.step(loss_sum, correct, batch_size)
            if index % LOG_INTERVAL == 0:
                history.log(history.total_steps)
    synchronize(device)
    return (time.perf_counter() - start) / steps


def run(options: Options) -> dict:
    import torch

    from scaledl.metrics import History

    torch.set_num_threads(options.threads)
    step, device, batch_size = _ladder_step(options.micro_batch_size)
    history = History(options.out_dir / "metrics", config={"suite": "metrics"})
    steps = LOG_INTERVAL * options.pick(2, 5)
    min_rounds, max_rounds = options.pick((4, 8), (8, 30))
    time_block(step, device, 10)  # warm-up
    off, on, ratios = [], [], []
    for round_index in range(max_rounds):
        blocks = {}
        for name in ("off", "on") if round_index % 2 == 0 else ("on", "off"):  # alternate which goes first
            blocks[name] = time_block(step, device, steps, history if name == "on" else None, batch_size)
        off.append(blocks["off"])
        on.append(blocks["on"])
        ratios.append(blocks["on"] / blocks["off"])
        interval = stats.median_ratio(ratios)
        if round_index + 1 >= min_rounds and stats.converged(interval, 0.005):
            break
    rows = [{"history": name, "step_ms": rounded(stats.summary(values)["median"] * 1e3),
             "p10_ms": rounded(stats.summary(values)["p10"] * 1e3),
             "p90_ms": rounded(stats.summary(values)["p90"] * 1e3),
             "blocks": len(values), "steps_per_block": steps} for name, values in (("off", off), ("on", on))]
    met = interval["ratio"] <= TARGET
    text = (f"history on/off time ratio = {interval['ratio']:.4f} "
            f"[{interval['ci_low']:.4f}, {interval['ci_high']:.4f}] "
            f"(target <= {TARGET}: {'met' if met else 'missed'})")
    return result("metrics", f"Metrics history on vs off (log every {LOG_INTERVAL} steps), mean step time per block",
                  ["history", "step_ms", "p10_ms", "p90_ms", "blocks", "steps_per_block"], rows,
                  headline("history on/off time ratio", interval["ratio"], f"<= {TARGET}", met,
                           (interval["ci_low"], interval["ci_high"]), text=text),
                  blocks={"off": off, "on": on})


def plot(data: dict, fig) -> None:
    ax = fig.subplots()
    ax.plot([t * 1e3 for t in data["blocks"]["off"]], "o-", label="history off")
    ax.plot([t * 1e3 for t in data["blocks"]["on"]], "o-", label="history on")
    ax.set(xlabel="round", ylabel="mean ms per step", title="interleaved blocks")
    ax.legend()
