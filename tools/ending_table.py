"""How jobs end under each launcher: normally, by a rank's error, by SIGINT (Ctrl-C) and by SIGTERM.

    python tools/ending_table.py --runs 3 --launchers torchrun mpirun

Each cell runs real ranks on this machine N times and counts what a user would see and what is
left: tracebacks printed by our processes (a launcher's own report, which starts in its entry
script, is not counted), seconds from the ending (the signal; for a normal or failed run, the
launcher's exit) until the last rank is gone, and processes or /dev/shm/deepspeed_* files left
15 s later.  Prints a markdown table.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
from scaledl.hpc import launchers  # noqa: E402

RUNGS = {"torchrun": "ddp", "mpirun": "ddp", "horovodrun": "horovod_torch", "deepspeed": "deepspeed",
         "scaledl launch": "ddp"}
SHORT = ["--epochs", "1", "--train-limit", "512", "--timeout", "20"]
LONG = ["--epochs", "500", "--train-limit", "2048", "--log-interval", "5", "--timeout", "20"]
LAUNCHER_ENTRIES = ("/bin/torchrun", "/bin/horovodrun", "/bin/deepspeed", "deepspeed/launcher/")
ENDINGS = ("normal", "error", "SIGINT", "SIGTERM")


def command(launcher: str, ending: str, out_dir: Path) -> list[str]:
    rung = RUNGS[launcher]
    args = [*(LONG if ending.startswith("SIG") else SHORT), "--out-dir", str(out_dir)]
    module, args = ("fault_probe", [f"scaledl.ladder.{rung}", *args]) if ending == "error" else \
        (f"scaledl.ladder.{rung}", args)
    if launcher == "scaledl launch":
        return [launchers.tool("scaledl"), "launch", "-n", "2", "--", module, *args]
    return launchers.for_launcher(launcher, 2, module, args)


def our_tracebacks(text: str) -> int:
    """Tracebacks whose first frame is not a launcher's own entry script."""
    lines = text.splitlines()
    return sum(1 for i, line in enumerate(lines) if line.rstrip().endswith("Traceback (most recent call last):")
               and not (i + 1 < len(lines) and any(entry in lines[i + 1] for entry in LAUNCHER_ENTRIES)))


def alive(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            if process.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(process.info["cmdline"] or ()):
                found.append(process)
        except psutil.Error:
            continue
    return found


def shm() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("deepspeed_*")}


def once(launcher: str, ending: str, work: Path) -> dict:
    out_dir = work / f"{launcher.replace(' ', '_')}-{ending}-{time.monotonic_ns()}"
    env = launchers.local_env(2, {k: v for k, v in os.environ.items() if not k.startswith(("PBS_", "SLURM_"))})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "probes"), env.get("PYTHONPATH", "")])
    if ending == "error":
        env.update(FAULT="error", FAULT_RANK="0", FAULT_STEP="2")
    shm_before = shm()
    process = subprocess.Popen(command(launcher, ending, out_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env, start_new_session=True)
    ended_at = None
    if ending.startswith("SIG"):
        metrics = out_dir / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            if metrics.is_file() and '"type": "log"' in metrics.read_text():
                break
            time.sleep(0.2)
        signum = getattr(signal, ending)
        if signum == signal.SIGINT:
            os.killpg(process.pid, signum)  # a terminal's Ctrl-C reaches the whole foreground group
        else:
            process.send_signal(signum)  # a scheduler or wrapper signals the launcher alone
        ended_at = time.monotonic()
    output, _ = process.communicate(timeout=600)
    ended_at = ended_at or time.monotonic()
    left = alive(str(out_dir))
    while left and time.monotonic() - ended_at < 15:
        time.sleep(0.1)
        left = alive(str(out_dir))
    gone_s = time.monotonic() - ended_at
    for child in left:
        child.kill()
    return {"tracebacks": our_tracebacks(output), "gone_s": gone_s, "left": len(left),
            "shm_left": len(shm() - shm_before), "code": process.returncode}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--launchers", nargs="+", choices=list(RUNGS), default=list(RUNGS))
    parser.add_argument("--endings", nargs="+", choices=ENDINGS, default=list(ENDINGS))
    args = parser.parse_args(argv)
    print("| launcher | ending | runs | exit status | tracebacks (ours) | last rank gone, s (max) | processes left "
          "| /dev/shm left |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="scaledl-endings-") as work:
        for launcher in args.launchers:
            for ending in args.endings:
                rows = [once(launcher, ending, Path(work)) for _ in range(args.runs)]
                codes = sorted({r["code"] for r in rows})
                print(f"| {launcher} | {ending} | {len(rows)} | {', '.join(map(str, codes))} | "
                      f"{sum(r['tracebacks'] for r in rows)} | {max(r['gone_s'] for r in rows):.1f} | "
                      f"{sum(r['left'] for r in rows)} | {sum(r['shm_left'] for r in rows)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
