"""`scaledl demo`: every rung of the ladder, one table.

Each rung runs as its own job with its real launcher (2 processes on a CPU machine, one per
device on a GPU node), writes OUT_DIR/<rung>/summary.json, and the table of those summaries
goes to OUT_DIR/demo.json and OUT_DIR/demo.png.  The rungs train the CNN on the embedded MNIST,
but for the tensor-parallel ones, which split a small transformer (DEMO_FLAGS) on the token task;
the 2D rung runs on a 2 x 2 mesh, 4 ranks, where the machine has no GPUs.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from scaledl import devices, output_paths
from scaledl.hpc import launchers
from scaledl.errors import CHECK_FLAGS_VAR, UserError
from scaledl.launch_env import host_name_problem
from scaledl.ladder import RUNGS

# tokens_per_s and mfu: a language model's rows (--model gpt passed on to the rungs), empty for the others.
COLUMNS = ("rung", "world_size", "samples_per_s", "tokens_per_s", "mfu", "test_accuracy", "state_bytes_per_rank",
           "peak_memory_mb", "ok")
# A transformer small enough for seconds on a laptop's CPU (the rungs' defaults make sense on GPUs).
SMALL_TRANSFORMER = ["--width", "64", "--depth", "2", "--heads", "4", "--seq-len", "32"]
DEMO_FLAGS = {"tensor_parallel": SMALL_TRANSFORMER, "fsdp_tp": [*SMALL_TRANSFORMER, "--tp", "2"]}
CPU_RANKS = {"fsdp_tp": 4}  # 2 x 2 (dp x tp): both dimensions of the mesh


class OutDirError(UserError):
    pass


def check(out: Path, rungs, overwrite: bool, nproc: int | None, extra_args=()) -> None:
    """Everything the demo will use, checked before it writes anything: --nproc, --out-dir (it
    can be written, and holds no demo unless --overwrite), and the flags passed on to the rungs,
    which each selected rung parses and checks itself (`errors.CHECK_FLAGS_VAR`) without running."""
    if nproc is not None and nproc < 1:
        raise UserError(f"argument -n/--nproc: must be at least 1, got {nproc}")
    try:
        output_paths.check_dir(out, "--out-dir")
    except output_paths.OutputPathError as error:
        raise OutDirError(str(error)) from None
    held = [out / "demo.json", *(out / rung for rung in rungs if (out / rung).exists())]
    if not overwrite and any(path.exists() for path in held):
        raise OutDirError(f"--out-dir {out} already holds a demo: pass --overwrite to replace it, or name another "
                          "--out-dir")
    if extra_args:
        check_rung_flags(rungs, extra_args)
    problem = host_name_problem() if any(RUNGS[rung][1] != "python" for rung in rungs) else None
    if problem:  # the launchers' rendezvous would retry for minutes, or Horovod's Gloo crash
        raise UserError(f"{problem}; the multi-process rungs' launchers need it")


def check_rung_flags(rungs, extra_args) -> None:
    """Each selected rung parses the flags the demo would pass it, and stops there."""
    env = {**os.environ, CHECK_FLAGS_VAR: "1"}
    checked = set()
    for rung in rungs:
        module, _, rung_args = RUNGS[rung]
        if module in checked:
            continue  # one parser per module (ZeRO's stages are one module): check it once
        checked.add(module)
        command = launchers.python_module(f"scaledl.ladder.{module}",
                                          [*rung_args, *DEMO_FLAGS.get(rung, []), *extra_args])
        result = subprocess.run(command, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            said = [line for line in result.stderr.splitlines() if ": error: " in line]
            reason = said[-1].split(": error: ", 1)[1] if said else f"exit status {result.returncode}"
            raise UserError(f"rung {rung} refuses the flags the demo passes on ({' '.join(extra_args)}): {reason}")


def claim(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutDirError(f"cannot create --out-dir {out}: {error.strerror or error}") from None


def world_size_of(rung: str, nproc: int, gpus: int) -> int:
    """1 for a single-device rung; else nproc, or more where a CPU-only machine runs a rung that needs them."""
    if RUNGS[rung][1] == "python":
        return 1
    return nproc if gpus else max(nproc, CPU_RANKS.get(rung, nproc))


def run_rung(rung: str, nproc: int, out_dir: Path, extra_args=(), gpus: int | None = None) -> dict:
    module, launcher, rung_args = RUNGS[rung]
    world_size = world_size_of(rung, nproc, devices.device_count() if gpus is None else gpus)
    rung_dir = out_dir / rung
    # The demo's directory is a scratch area that each `make demo` replaces.
    args = ["--out-dir", str(rung_dir), "--overwrite", *rung_args, *DEMO_FLAGS.get(rung, []), *extra_args]
    command = launchers.for_launcher(launcher, world_size, f"scaledl.ladder.{module}", args)
    rung_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(rung_dir / "output.log", "w") as log:
        # As `scaledl launch` runs it: a Ctrl-C or a scheduler's signal ends every rank, and a
        # rank's one-line error comes last in the log with its exit status.
        returncode = launchers.run_launcher(command, env=launchers.local_env(world_size), stdout=log,
                                            stderr=subprocess.STDOUT)
    summary_path = rung_dir / "summary.json"
    row = {"rung": rung, "world_size": world_size, "samples_per_s": None, "test_accuracy": None,
           "state_bytes_per_rank": None, "ok": False, "seconds": round(time.perf_counter() - started, 1),
           "command": " ".join(command)}
    if returncode == 0 and summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        row.update(samples_per_s=summary["samples_per_s"], test_accuracy=summary["test_accuracy"],
                   state_bytes_per_rank=summary.get("state_bytes_per_rank"),
                   tokens_per_s=summary.get("tokens_per_s"), mfu=summary.get("mfu"),
                   peak_memory_mb=round(summary["memory_bytes_per_rank"] / 2**20, 1),
                   ok=True)
    else:
        log_text = (rung_dir / "output.log").read_text(errors="replace")
        errors = [line.strip() for line in log_text.splitlines() if "error:" in line]
        row["error"] = f"exit {returncode}: {errors[-1] if errors else 'see ' + str(rung_dir / 'output.log')}"
    return row


def format_table(rows: list[dict]) -> str:
    cells = [["" if row.get(c) is None else str(row[c]) for c in COLUMNS] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(COLUMNS)]
    line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths))  # noqa: E731
    return "\n".join([line(COLUMNS), line(["-" * w for w in widths]), *map(line, cells)])


def plot(rows: list[dict], path: Path) -> None:
    """Throughput, accuracy and the state each rank holds, one bar per rung, names on the left."""
    from matplotlib.figure import Figure  # no pyplot: leaves a notebook's backend and figures alone

    done = [r for r in rows if r["ok"]]
    names = [f"{r['rung']} (x{r['world_size']})" for r in done]
    colors = ["tab:orange" if r["rung"] in DEMO_FLAGS else "tab:blue" for r in done]  # the transformer's rows
    fig = Figure(figsize=(12, 0.45 * len(done) + 1.6), layout="constrained")
    panels = fig.subplots(1, 3, sharey=True)
    state = [r.get("state_bytes_per_rank") for r in done]
    values = [[r["samples_per_s"] for r in done], [r["test_accuracy"] for r in done],
              [(v or 0) / 2**20 for v in state]]
    labels = ["samples/s (all ranks)", "test accuracy", "model state per rank, MiB\n(params, grads, optimizer)"]
    formats = ["{:.0f}", "{:.3f}", "{:.2f}"]
    for ax, value, label, fmt in zip(panels, values, labels, formats):
        bars = ax.barh(names, value, color=colors)
        texts = [fmt.format(v) for v in value]
        if ax is panels[2]:  # TensorFlow rungs do not count their state: say so rather than draw 0
            texts = [t if v is not None else "not counted" for t, v in zip(texts, state)]
        ax.bar_label(bars, labels=texts, fontsize=8, padding=2)
        ax.set_xlabel(label)
        ax.grid(axis="x", alpha=0.3)
        ax.margins(x=0.25)
    panels[0].invert_yaxis()  # the ladder reads top to bottom
    accuracy = [v for v in values[1] if v]
    if accuracy:
        panels[1].set_xlim(max(0.0, min(accuracy) - 0.05), 1.0)
    fig.suptitle("scaledl demo: every rung (blue: the CNN on the embedded MNIST; orange: a small transformer on "
                 "the token task)", fontsize=10)
    fig.savefig(path, dpi=110)


def main(out_dir: str = "runs/demo", rungs=None, nproc: int | None = None, extra_args=(),
         overwrite: bool = False) -> list[dict]:
    out = Path(out_dir)
    check(out, rungs or RUNGS, overwrite, nproc, extra_args)
    claim(out)
    nproc = nproc or launchers.local_device_count()
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
