"""Checkpoints that survive a kill at any moment and resume a run exactly.

A checkpoint holds the model, optimizer and scheduler states, the epoch and step (which,
with the seeded sampler, fixes the position in the data), and the RNG states of Python,
NumPy and torch.  Rank 0 writes it to a temporary file in the same directory, flushes it to
disk and renames it over the old one: a rename is atomic, so a reader sees the old
checkpoint or the new one, never half of one.  Every rank loads it.
"""
from __future__ import annotations

import errno
import os
import pickle
import random
import shutil
import zipfile
from pathlib import Path

import numpy as np
from scaledl.errors import UserError


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be read; the message names the file and what to do."""


class DiskFullError(CheckpointError):
    """No room to write a checkpoint: the message names the file system's free space."""


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def rng_state() -> dict:
    import torch

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             # As plain lists, so the file loads with torch.load(weights_only=True).
             "numpy": [kind, keys.tolist(), pos, has_gauss, gauss]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    import torch

    random.setstate(_tuples(state["python"]))
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def save(path: str | Path, *, model, optimizer=None, scheduler=None, epoch: int = 0, step: int = 0,
         extra: dict | None = None, is_main: bool = True) -> Path | None:
    """Write atomically on the main rank; other ranks return None at once.

    `model` and `optimizer` are objects with `state_dict()` or state dicts themselves (a
    sharded model's full state, gathered first).  Pass the unwrapped model when it is
    wrapped (DDP's `.module`) so the file loads into a plain model too."""
    if not is_main:
        return None
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    as_state = lambda obj: obj if isinstance(obj, dict) else obj.state_dict()  # noqa: E731
    state = {"model": as_state(model), "epoch": epoch, "step": step, "rng": rng_state(),
             "extra": extra or {}}
    if optimizer is not None:
        state["optimizer"] = as_state(optimizer)
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a writer that was killed
        stale.unlink(missing_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(partial, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    except (OSError, RuntimeError) as error:
        full = _disk_full(error, partial)
        partial.unlink(missing_ok=True)  # a partial file would keep the disk full
        if full:
            free = _size(_free_bytes(path.parent))
            raise DiskFullError(f"no space left to write checkpoint {path}: its file system has {free} free and the "
                                f"checkpoint needs about {_size(_tensor_bytes(state))}; free some space or use "
                                "another --out-dir (the previous checkpoint, if any, is intact)") from None
        raise
    finally:
        partial.unlink(missing_ok=True)  # interrupted (Ctrl-C, SIGTERM) in the middle of the write
    return path


def _disk_full(error: BaseException, partial: Path) -> bool:
    """Did a write fail for want of space?  torch.save hides the ENOSPC behind its own
    RuntimeError ("unexpected pos N vs M"), so also ask the file system."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
            return True
        if isinstance(error, OSError) and error.errno is not None:
            return False
        error = error.__cause__ or error.__context__
    try:
        written = partial.stat().st_size
        free = shutil.disk_usage(partial.parent).free
    except OSError:
        return False
    return free < max(written // 10, 1 << 20)  # less than a tenth of what was written, or 1 MiB


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _tensor_bytes(value) -> int:
    """Bytes of the tensors in a (nested) state: what the file will hold, within a few KiB."""
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return value.numel() * value.element_size() if hasattr(value, "element_size") else 0


def _size(count: int | None) -> str:
    if count is None:
        return "an unknown amount"
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024


def load(path: str | Path, *, model=None, optimizer=None, scheduler=None, map_location="cpu",
         restore_rng: bool = True) -> dict:
    """Read a checkpoint into the given objects; return the whole state (epoch, step, extra)."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}: run without --resume to start fresh")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, pickle.UnpicklingError) as error:
        raise CheckpointError(
            f"checkpoint {path} is corrupt or truncated ({type(error).__name__}); delete it or "
            "resume from an older copy") from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a scaledl checkpoint (no model state in it)")
    if model is not None:
        model.load_state_dict(state["model"])
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and "scheduler" in state:
        scheduler.load_state_dict(state["scheduler"])
    if restore_rng:
        set_rng_state(state["rng"])
    return state
