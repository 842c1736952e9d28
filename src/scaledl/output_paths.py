"""Where a command will write, checked before it writes anything.

A path that is empty (an unset shell variable), names a file where a directory is needed,
or lies on a read-only or unwritable file system gets one line naming the flag, the path and
the reason, instead of a traceback halfway through the output.  Nothing is created here: the
nearest existing parent is what is checked.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

from scaledl.errors import UserError


class OutputPathError(UserError, ValueError):
    """An output path a command cannot write to."""


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def _writable(folder: Path) -> str | None:
    """Why files cannot be made in `folder`, or None when they can."""
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "it is on a read-only file system"
    except OSError as error:
        return error.strerror or str(error)
    if not os.access(folder, os.W_OK | os.X_OK):
        return "you may not write there" if os.access(folder, os.F_OK) else "it cannot be reached"
    return None


def check_dir(path: str | os.PathLike, flag: str) -> Path:
    """A directory the command may create (with its parents) and write into."""
    text = os.fspath(path)
    if not str(text).strip():
        raise OutputPathError(f"{flag} is empty (an unset variable?): name a directory")
    if "\n" in str(text) or "\0" in str(text):
        raise OutputPathError(f"{flag} {text!r} holds a newline or NUL: name a directory")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{flag} {path} is a file, not a directory: name a directory")
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise OutputPathError(f"{flag} {path}: {existing} is a file, so {path} cannot be made under it")
    reason = _writable(existing)
    if reason:
        raise OutputPathError(f"{flag} {path} cannot be written: {reason} ({existing}); choose another directory")
    return path


def check_file(path: str | os.PathLike, flag: str) -> Path:
    """A file the command may create or replace."""
    text = os.fspath(path)
    if not str(text).strip():
        raise OutputPathError(f"{flag} is empty (an unset variable?): name a file")
    path = Path(text)
    if path.is_dir():
        raise OutputPathError(f"{flag} {path} is a directory: name a file in it")
    check_dir(path.parent, flag)
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputPathError(f"{flag} {path} cannot be replaced: you may not write it")
    return path


def describe_os_error(error: OSError, path: str | os.PathLike) -> str:
    """One line for an OSError met while writing `path` after the checks (a disk that filled up)."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left to write {path}: free some space or write elsewhere"
    return f"cannot write {path}: {error.strerror or error}"
