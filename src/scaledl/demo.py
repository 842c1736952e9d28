"""`scaledl demo`: every rung of the ladder on the embedded MNIST, one table.

Each rung runs as its own job with its real launcher (2 processes on a CPU machine, one per
device on a GPU node), writes OUT_DIR/<rung>/summary.json, and the table of those summaries
goes to OUT_DIR/demo.json and OUT_DIR/demo.png.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from scaledl import launchers
from scaledl.ladder import RUNGS

COLUMNS = ("rung", "world_size", "samples_per_s", "test_accuracy", "state_bytes_per_rank", "peak_memory_mb", "ok")


def local_device_count() -> int:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count()
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.xpu.device_count()
    return 2


def run_rung(rung: str, nproc: int, out_dir: Path, extra_args=(), timeout_s: float = 900) -> dict:
    module, launcher, rung_args = RUNGS[rung]
    world_size = 1 if launcher == "python" else nproc
    rung_dir = out_dir / rung
    # The demo's directory is a scratch area that each `make demo` replaces.
    args = ["--out-dir", str(rung_dir), "--overwrite", *rung_args, *extra_args]
    command = launchers.for_launcher(launcher, world_size, f"scaledl.ladder.{module}", args)
    rung_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(rung_dir / "output.log", "w") as log:
        try:
            result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s,
                                    env=launchers.local_env(world_size))
            returncode = result.returncode
        except subprocess.TimeoutExpired:
            returncode = "timeout"
    summary_path = rung_dir / "summary.json"
    row = {"rung": rung, "world_size": world_size, "samples_per_s": None, "test_accuracy": None,
           "state_bytes_per_rank": None, "ok": False, "seconds": round(time.perf_counter() - started, 1),
           "command": " ".join(command)}
    if returncode == 0 and summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        row.update(samples_per_s=summary["samples_per_s"], test_accuracy=summary["test_accuracy"],
                   state_bytes_per_rank=summary.get("state_bytes_per_rank"),
                   peak_memory_mb=round(summary["memory_bytes_per_rank"] / 2**20, 1),
                   ok=True)
    else:
        row["error"] = f"exit {returncode}; see {rung_dir / 'output.log'}"
    return row


def format_table(rows: list[dict]) -> str:
    cells = [[str(row.get(c, "")) for c in COLUMNS] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(COLUMNS)]
    line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths))  # noqa: E731
    return "\n".join([line(COLUMNS), line(["-" * w for w in widths]), *map(line, cells)])


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["ok"]]
    fig, (ax_speed, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.5))
    names = [f"{r['rung']}\n(x{r['world_size']})" for r in done]
    ax_speed.bar(names, [r["samples_per_s"] for r in done])
    ax_speed.set(ylabel="samples/s (all ranks)")
    ax_acc.bar(names, [r["test_accuracy"] for r in done])
    ax_acc.set(ylabel="test accuracy", ylim=(0.8, 1.0))
    for ax in (ax_speed, ax_acc):
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(out_dir: str = "runs/demo", rungs=None, nproc: int | None = None, extra_args=()) -> list[dict]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    nproc = nproc or local_device_count()
    rows = []
    for rung in rungs or RUNGS:
        print(f"running {rung} ...", flush=True)
        rows.append(run_rung(rung, nproc, out, extra_args))
        print(format_table(rows[-1:]).splitlines()[-1], flush=True)
    (out / "demo.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot(rows, out / "demo.png")
    print()
    print(format_table(rows))
    print(f"\nwrote {out / 'demo.json'} and {out / 'demo.png'}")
    return rows
