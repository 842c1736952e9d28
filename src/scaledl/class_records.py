"""A workshop class as one experiment: what a learner's checks and runs leave in the class's directory.

    export SCALEDL_CLASS_DIR=/eagle/YOUR_PROJECT/class    # or class_records.join(DIR) in a notebook
    # from then on every check's verdict and every rung's summary land there

One shared directory is the class (a project directory on the site's shared file system; any
directory on a laptop): no server, no database.  `scaledl class init DIR` writes:

    DIR/class.json                  the class: its id, the salt of its pseudonyms, real names or not
    DIR/README.md                   for the instructor
    DIR/assignments.json            `scaledl class assign`: which node count each learner runs
    DIR/verdicts/<learner>.jsonl    one line per check the learner ran, appended
    DIR/runs/<learner>-....json     one file per rung run, written whole and then renamed into place

Many learners write at once, from login and compute nodes: a verdict is one `write` of one line
to the learner's own file, opened for appending (O_APPEND: each write lands whole at the end),
and a run is a new file of its own, renamed into place once complete, so no reader ever sees a
torn record.  A learner is a pseudonym, a hash of the user name with the class's salt, unless
the instructor turned real names on.  `scaledl.workshop.classroom` reads the records back.
"""
from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import secrets
import socket
import time
from pathlib import Path
from typing import Mapping

from scaledl.errors import UserError

ENV = "SCALEDL_CLASS_DIR"
# A learner's name where the user name does not tell learners apart (a training account shared by
# several attendees, one laptop for two): it stands in for the user name, pseudonymized alike.
LEARNER_ENV = "SCALEDL_CLASS_LEARNER"
FORMAT = 1  # the layout's version, in class.json and every record
CLASS_FILE, ASSIGNMENTS, VERDICTS, RUNS = "class.json", "assignments.json", "verdicts", "runs"
_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class ClassError(UserError, ValueError):
    """A class directory that is missing, not a class, or not writable."""


def new_class(name: str, real_names: bool = False, system: str = "polaris") -> dict:
    """class.json's content for a new class: a random id and salt of its own."""
    if not _ID.fullmatch(name):
        raise ClassError(f"--name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
    return {"format": FORMAT, "name": name, "id": secrets.token_hex(8), "salt": secrets.token_hex(16),
            "real_names": real_names, "system": system, "created": round(time.time())}


def read_class(folder: str | os.PathLike) -> dict:
    """The class that `folder` holds; ClassError saying what to do when it holds none."""
    path = Path(folder, CLASS_FILE)
    if not Path(folder).is_dir():
        raise ClassError(f"{folder} is not a directory: ask your instructor for the class directory, or unset {ENV}")
    try:
        klass = json.loads(path.read_text())
    except FileNotFoundError:
        raise ClassError(f"{folder} is not a class directory (no {CLASS_FILE}): ask your instructor for its path, "
                         f"or make one with `scaledl class init {folder}`") from None
    except (OSError, ValueError) as error:
        raise ClassError(f"{path} cannot be read as a class ({error}): `scaledl class init` writes it") from None
    if not (isinstance(klass, dict) and klass.get("format") == FORMAT and _ID.fullmatch(str(klass.get("id", "")))
            and isinstance(klass.get("salt"), str)):
        raise ClassError(f"{path} is not a class file of this scaledl (format {FORMAT}): make the class again "
                         "with `scaledl class init` in an empty directory")
    return klass


def learner(klass: Mapping, user: str | None = None) -> str:
    """This learner's name in the class: a pseudonym from the user name and the class's salt (the
    same in every session and on every node of the site), or the user name if real names are on."""
    user = user or os.environ.get(LEARNER_ENV, "").strip() or getpass.getuser()
    if klass.get("real_names"):
        return re.sub(r"[^A-Za-z0-9_.-]", "_", user)[:64]
    return "learner-" + hashlib.sha256(f"{klass['salt']}:{user}".encode()).hexdigest()[:8]


def from_env(env: Mapping[str, str] | None = None) -> Path | None:
    """The class directory that SCALEDL_CLASS_DIR names, checked (ClassError), or None when unset."""
    joined = _from_env(env)
    return joined[0] if joined else None


def _from_env(env: Mapping[str, str] | None = None) -> tuple[Path, dict] | None:
    """(the class directory SCALEDL_CLASS_DIR names, its class), checked; None when unset."""
    value = (os.environ if env is None else env).get(ENV, "")
    if not value.strip():
        return None
    folder = Path(value).expanduser()
    klass = read_class(folder)
    for part in (VERDICTS, RUNS):
        if not os.access(folder / part, os.W_OK | os.X_OK):
            raise ClassError(f"{ENV}={value}: cannot write to {folder / part}: ask your instructor to make the class "
                             "directory writable for the class's group (`scaledl class init` does)")
    return folder, klass


def _joined(folder: Path | None) -> tuple[Path, dict] | None:
    """(`folder`, its class), or SCALEDL_CLASS_DIR's when no folder is given; None without a class."""
    return (Path(folder), read_class(folder)) if folder is not None else _from_env()


def join(folder: str | os.PathLike) -> str:
    """Join a class from a notebook: checks the directory, sets SCALEDL_CLASS_DIR for this kernel and
    what it starts (live ranks, jobs), and returns the learner's name in the class."""
    path = Path(folder).expanduser().resolve()
    os.environ[ENV] = str(path)
    try:
        _, klass = _from_env()
    except ClassError:
        del os.environ[ENV]
        raise
    return learner(klass)


def _record(klass: Mapping, kind: str, **fields) -> dict:
    return {"format": FORMAT, "class": klass["id"], "kind": kind, "learner": learner(klass),
            "time": round(time.time(), 3), "host": socket.gethostname(), **fields}


def append_verdict(lesson: str, exercise: str, ok: bool, message: str, folder: Path | None = None) -> bool:
    """Append one check's verdict to this learner's file; False (and the class unchanged) without a class."""
    joined = _joined(folder)
    if joined is None:
        return False
    folder, klass = joined
    record = _record(klass, "verdict", lesson=lesson, exercise=exercise, verdict="PASS" if ok else "FAIL",
                     line=message)
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    path = Path(folder, VERDICTS, f"{record['learner']}.jsonl")
    # One write of the whole line to a file opened with O_APPEND: each lands whole at the end of the file.
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o664)
    try:
        os.write(descriptor, line)
    finally:
        os.close(descriptor)
    return True


def write_run(summary: Mapping, folder: Path | None = None, **context) -> Path | None:
    """Write one rung run's summary (and `context`: nodes, batch sizes, ...) as a file of its own in
    runs/, complete before it appears there; None without a class."""
    joined = _joined(folder)
    if joined is None:
        return None
    folder, klass = joined
    record = _record(klass, "run", **context, summary=dict(summary))
    name = (f"{record['learner']}-{summary.get('rung', 'run')}-{summary.get('world_size', 0)}r-"
            f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(record['time']))}-{secrets.token_hex(3)}.json")
    final = Path(folder, RUNS, name)
    partial = final.with_name(f".{name}.partial")
    partial.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(partial, final)  # atomic within one directory: a reader sees the whole file or none
    return final


def assignment(folder: Path | None = None, user: str | None = None) -> dict | None:
    """This learner's part of the class's curve (`scaledl class assign`): {learner, nodes, rung,
    run_flags}; None without a class or before the instructor assigned.  A learner the assignment
    does not list (joined later) gets a count from their pseudonym, the same every time."""
    joined = _joined(folder)
    if joined is None:
        return None
    folder, klass = joined
    try:
        plan = json.loads(Path(folder, ASSIGNMENTS).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise ClassError(f"{Path(folder, ASSIGNMENTS)} cannot be read ({error}): ask your instructor to run "
                         "`scaledl class assign` again") from None
    counts = plan.get("nodes") if isinstance(plan, dict) else None
    if plan.get("class") != klass["id"] or not counts or not all(isinstance(n, int) and n > 0 for n in counts):
        raise ClassError(f"{Path(folder, ASSIGNMENTS)} is not this class's assignment: ask your instructor to run "
                         "`scaledl class assign` again")
    name = learner(klass, user)
    nodes = plan.get("by_learner", {}).get(name) or counts[int(hashlib.sha256(name.encode()).hexdigest(), 16)
                                                             % len(counts)]
    return {"learner": name, "nodes": nodes, "rung": plan.get("rung", "ddp"),
            "run_flags": plan.get("run_flags", "")}
