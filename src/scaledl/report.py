"""The one line every run ends with, and the numbers in it.

    summary rung=ddp world_size=2 samples_per_s=5012.3 test_accuracy=0.9805 peak_memory_mb=412.0

A language model's line adds tokens_per_s, mfu (a fraction) and the peak it is against.
The same fields go to OUT_DIR/summary.json, which `scaledl demo` collects into its table.
"""
from __future__ import annotations

import hashlib
import json
import resource
import statistics
from pathlib import Path


def peak_memory_bytes(device) -> int:
    """Peak device memory allocated by this process; peak resident memory on CPU."""
    kind = getattr(device, "type", device)
    if kind in ("cuda", "xpu"):
        import torch

        return int(getattr(torch, kind).max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def model_state_bytes(model, optimizer) -> int:
    """Bytes of parameters, gradients and optimizer states this rank holds during a step (its shards
    only, for sharded models), counted from the tensors; the demo's state_bytes_per_rank.  A gradient
    freed between steps (`zero_grad()` sets it to None) counts as its parameter's size: backward
    allocates it again every step."""
    import torch

    local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731  DTensor shards
    tensors = [local(p) for p in model.parameters()]
    tensors += [local(p.grad if p.grad is not None else p) for p in model.parameters() if p.requires_grad]
    tensors += [local(v) for state in optimizer.state.values() for v in state.values()
                if isinstance(v, torch.Tensor) and v.dim() > 0]
    return sum(t.numel() * t.element_size() for t in tensors)


def fingerprint(buffers) -> str:
    """A hash of raw parameter bytes: equal on two ranks <=> bit-identical parameters."""
    digest = hashlib.sha256()
    for buffer in buffers:
        digest.update(buffer)
    return digest.hexdigest()


def steady_throughput(records: list[dict]) -> float:
    """Median samples/s over log intervals, the first one (warm-up) left out when there are more."""
    rates = [r["samples_per_s"] for r in records if r.get("type") == "log"]
    return statistics.median(rates[1:] if len(rates) > 1 else rates) if rates else float("nan")


def finish(rung: str, world_size: int, history, test_accuracy: float, out_dir: str | Path,
           memory_bytes: int, is_main: bool, language_model: dict | None = None, **extra) -> dict:
    """Write summary.json and print the summary line (main rank only); return the summary.

    `language_model` (seq_len, flops_per_token, peak_tflops, peak_source) adds tokens/s and MFU
    (`scaledl.flops`).  Every rank must call it: it logs the steps left since the last log
    interval (a collective)."""
    if history.pending_steps:
        history.log(history.total_steps)
    samples_per_s = steady_throughput(history.records)
    summary = {"rung": rung, "world_size": world_size, "samples_per_s": round(samples_per_s, 1)}
    if language_model:
        from scaledl import flops

        tokens_per_s = samples_per_s * language_model["seq_len"]
        summary |= {"tokens_per_s": round(tokens_per_s, 1),
                    "mfu": round(flops.mfu(tokens_per_s, language_model["flops_per_token"], world_size,
                                           language_model["peak_tflops"]), 4),
                    "peak_tflops": round(language_model["peak_tflops"], 4),
                    "peak_source": language_model["peak_source"]}
    summary |= {"test_accuracy": round(test_accuracy, 4), "memory_bytes_per_rank": memory_bytes, **extra}
    if is_main:
        history.write({"type": "summary", **summary})
        Path(out_dir, "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        fields = {**summary, "memory_bytes_per_rank": None, "peak_source": None,
                  "peak_memory_mb": round(memory_bytes / 2**20, 1)}
        print("summary " + " ".join(f"{k}={v}" for k, v in fields.items() if v is not None), flush=True)
    return summary
