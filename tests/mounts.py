"""Real file systems for tests: a small tmpfs (a full disk) and a read-only bind mount.

Both need root (or CAP_SYS_ADMIN); where mounting is refused the test is skipped with the reason.
"""
from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest


def _mount(*args: str) -> None:
    result = subprocess.run(["mount", *args], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount here ({(result.stderr or result.stdout).strip() or result.returncode})")


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A tmpfs of `size` (mount's syntax: 256k, 4m) at `path`: writing past it fails with ENOSPC."""
    path.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    try:
        yield path
    finally:
        _umount(path)


@contextlib.contextmanager
def read_only(source: Path, path: Path):
    """`source` seen read-only at `path` (a bind mount remounted ro): writes fail with EROFS."""
    path.mkdir(parents=True, exist_ok=True)
    _mount("--bind", str(source), str(path))
    try:
        result = subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot remount read-only here ({result.stderr.strip()})")
        yield path
    finally:
        _umount(path)
