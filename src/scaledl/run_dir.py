"""One run per output directory: a second run never overwrites the first unless asked.

A run owns `OUT_DIR` and writes nothing outside it.  Starting a run in a directory that
already holds one is refused (a typo'd `--out-dir` would otherwise replace yesterday's
results) unless the user asks to continue it (`--resume`) or to replace it (`--overwrite`).
When torchrun restarts a failed job (`--max-restarts`), the restarted ranks continue from
the checkpoint on their own: that is what a restart is for.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from scaledl.errors import UserError

# What a run leaves in its directory; `--overwrite` removes exactly these.
RUN_FILES = ("metrics.jsonl", "summary.json", "checkpoint.pt", "checkpoint", "tensorboard", "metrics.png")


class OutDirError(UserError):
    pass


def holds_a_run(out_dir: str | Path) -> bool:
    return any((Path(out_dir) / name).exists() for name in RUN_FILES)


def is_torchrun_restart(env=None) -> bool:
    env = os.environ if env is None else env
    return int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0


def claim(out_dir: str | Path, resume: bool, overwrite: bool, is_main: bool, env=None) -> bool:
    """Check (and with `overwrite`, clear) OUT_DIR before the run writes; return `resume`,
    switched on for a torchrun restart that finds a checkpoint to continue from."""
    out_dir = Path(out_dir)
    if is_torchrun_restart(env) and any((out_dir / name).exists() for name in ("checkpoint.pt", "checkpoint")):
        return True
    if resume or not is_main:
        return resume
    if out_dir.exists() and not out_dir.is_dir():
        raise OutDirError(f"--out-dir {out_dir} is a file: name a directory")
    if holds_a_run(out_dir):
        if not overwrite:
            raise OutDirError(f"--out-dir {out_dir} already holds a run: pass --resume to continue it, "
                              "--overwrite to replace it, or name another --out-dir")
        for name in RUN_FILES:
            path = out_dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    return resume
