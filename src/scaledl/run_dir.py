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
          can_resume: bool = True, share=None) -> bool:
    """Check (and with `overwrite`, clear) OUT_DIR when a run starts; return whether it resumes.

    Only the main rank judges and writes; with `share` (an all-gather of one object per rank)
    every rank learns its verdict, so a refused OUT_DIR stops every rank at once with the main
    rank's one line, instead of leaving the others to find their peer gone.  A torchrun restart
    (`--max-restarts`) continues from the checkpoint when one exists, and otherwise starts the
    run again over the failed attempt's files: either way the restarted job goes on without
    being asked."""
    refused = None
    try:
        resumes = _claim(Path(out_dir), resume, overwrite, is_main, env, can_resume)
    except OutDirError as error:
        refused, resumes = str(error), False
    if share is not None:
        verdicts = [verdict for verdict in share(refused) if verdict]
        refused = refused or (verdicts[0] if verdicts else None)
    if refused:
        raise OutDirError(refused)
    return resumes


def _claim(out_dir: Path, resume: bool, overwrite: bool, is_main: bool, env, can_resume: bool) -> bool:
    if out_dir.exists() and not out_dir.is_dir():
        raise OutDirError(f"--out-dir {out_dir} is a file: name a directory")
    if is_torchrun_restart(env):
        if can_resume and has_checkpoint(out_dir):
            return True
        if is_main:
            clear(out_dir)
        return False
    if resume:
        # Every rank loads the checkpoint, so every rank checks it is there; each piece of advice
        # is a command line that works on this directory.
        if overwrite:
            raise OutDirError("--resume continues the run in --out-dir and --overwrite replaces it: pass one of them")
        if not holds_a_run(out_dir):
            raise OutDirError(f"--out-dir {out_dir} holds no run to resume: leave out --resume to start one there")
        if not has_checkpoint(out_dir):
            raise OutDirError(f"--out-dir {out_dir} holds a run but no checkpoint to continue from (a run saves one "
                              "every --checkpoint-every steps, and at its end): start it over with --overwrite "
                              "instead of --resume, or name another --out-dir")
        return True
    if not is_main:
        return False
    if holds_a_run(out_dir):
        if not overwrite:
            # --resume only where there is a checkpoint to continue from: advice must lead somewhere.
            choices = ["--resume to continue it"] if can_resume and has_checkpoint(out_dir) else []
            choices.append("--overwrite to replace it")
            raise OutDirError(f"--out-dir {out_dir} already holds a run: pass {', '.join(choices)}, "
                              "or name another --out-dir")
        clear(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutDirError(f"cannot create --out-dir {out_dir}: {error.strerror or error}; name a directory "
                          "you can write to") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise OutDirError(f"--out-dir {out_dir} is not writable: name a directory you can write to")
    return False


def has_checkpoint(out_dir: str | Path) -> bool:
    return any((Path(out_dir) / name).exists() for name in CHECKPOINTS)
