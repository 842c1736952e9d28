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
RUN_FILES = ("metrics.jsonl", "summary.json", "checkpoint.pt", "checkpoint", "tensorboard", "metrics.png",
             "model.pt", "model.weights.h5")
RUN_PATTERNS = ("checkpoint.step*.pt", ".checkpoint.pt.*.tmp")
CHECKPOINTS = ("checkpoint.pt", "checkpoint")


class OutDirError(UserError):
    pass


def _run_paths(out_dir: Path) -> list[Path]:
    found = [out_dir / name for name in RUN_FILES if (out_dir / name).exists()]
    return found + [path for pattern in RUN_PATTERNS for path in out_dir.glob(pattern)]


def holds_a_run(out_dir: str | Path) -> bool:
    return bool(_run_paths(Path(out_dir)))


def is_torchrun_restart(env=None) -> bool:
    env = os.environ if env is None else env
    return int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0


def clear(out_dir: Path) -> None:
    """Remove what a run left in OUT_DIR (and nothing else the user keeps there)."""
    for path in _run_paths(out_dir):
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)


def claim(out_dir: str | Path, resume: bool, overwrite: bool, is_main: bool, env=None,
          can_resume: bool = True) -> bool:
    """Check (and with `overwrite`, clear) OUT_DIR when a run starts; return whether it resumes.

    Only the main rank judges and writes.  A torchrun restart (`--max-restarts`) continues from
    the checkpoint when one exists, and otherwise starts the run again over the failed
    attempt's files: either way the restarted job goes on without being asked."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise OutDirError(f"--out-dir {out_dir} is a file: name a directory")
    if is_torchrun_restart(env):
        if can_resume and any((out_dir / name).exists() for name in CHECKPOINTS):
            return True
        if is_main:
            clear(out_dir)
        return False
    if resume or not is_main:
        return resume
    if holds_a_run(out_dir):
        if not overwrite:
            raise OutDirError(f"--out-dir {out_dir} already holds a run: pass --resume to continue it, "
                              "--overwrite to replace it, or name another --out-dir")
        clear(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutDirError(f"cannot create --out-dir {out_dir}: {error.strerror or error}; name a directory "
                          "you can write to") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise OutDirError(f"--out-dir {out_dir} is not writable: name a directory you can write to")
    return resume
