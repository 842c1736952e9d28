"""What every lesson's checks share: the one-line verdict, and reading a name off every live rank."""
from __future__ import annotations

import math
import sys

from scaledl import class_records


def _verdict(ok: bool, message: str) -> bool:
    print(("PASS: " if ok else "FAIL: ") + message)
    _to_class(ok, message)
    return ok


def _to_class(ok: bool, message: str) -> None:
    """In a class (SCALEDL_CLASS_DIR), append the verdict to the learner's file: the lesson and the
    check are the calling `check_...` function's module and name (scaledl.workshop.checks.lesson_NN)."""
    frame = sys._getframe(2)
    while frame is not None and not (frame.f_code.co_name.startswith("check_")
                                     and frame.f_globals.get("__name__", "").startswith(_LESSON_MODULES)):
        frame = frame.f_back
    if frame is None:
        return
    lesson = frame.f_globals["__name__"].rsplit("lesson_", 1)[1]
    try:
        class_records.append_verdict(lesson, frame.f_code.co_name, ok, message)
    except (class_records.ClassError, OSError) as error:  # the check's verdict stands; the class misses it
        print(f"(not recorded in the class: {error})")


_LESSON_MODULES = "scaledl.workshop.checks.lesson_"


_FAILED = object()  # what `_attempt` returns once it has printed the case's FAIL line


def _attempt(name: str, where: str, call):
    """`call()`, the learner's function `name` on one case (`where` says which), or _FAILED after the
    one-line FAIL verdict: still unfinished, or the learner's error, its type and first line."""
    try:
        return call()
    except NotImplementedError:
        _verdict(False, f"{name} still raises NotImplementedError: finish the exercise cell")
    except Exception as error:  # a learner's error, reported in one line
        _verdict(False, f"{where}: {name} raised {type(error).__name__}: {(str(error).splitlines() or [''])[0]}")
    return _FAILED


def _number(name: str, where: str, call, positive: bool = False):
    """`_attempt` for an exercise that returns bytes: the number, or _FAILED after the one-line FAIL
    verdict (unfinished, the learner's error, or something that is not a finite number)."""
    found = _attempt(name, where, call)
    if found is _FAILED:
        return _FAILED
    if isinstance(found, bool) or not isinstance(found, (int, float)) or not math.isfinite(found) \
            or (positive and found <= 0):
        _verdict(False, f"{where}: {name} returned {found!r}: return a number of bytes")
        return _FAILED
    return found


UNATTEMPTED = "NOT ATTEMPTED YET: "  # the line's start for an exercise whose variable is still unset


def _unfinished(name: str, where: str = "") -> bool:
    """False, after one line that says the exercise is not attempted yet: its variable `name` is still
    None (or empty), as on a page run before the learner fills it.  Not a FAIL: nothing was graded, so a
    class records nothing.  `where`: " on every rank" for a name read off live ranks."""
    print(f"{UNATTEMPTED}`{name}` is not set{where}: finish the exercise cell above and run it")
    return False


def from_ranks(view, name: str) -> list | None:
    """`name` as every rank of an ipyparallel view holds it, or None (with a NOT ATTEMPTED YET line)
    when the exercise cell that sets it has not run to the end on every rank."""
    try:
        return view.pull(name, block=True)
    except Exception:  # ipyparallel wraps the engines' NameError in a CompositeError
        _unfinished(name, " on every rank")
        return None


def gather(view, expression: str) -> list:
    """`expression` evaluated on every rank, in rank order; None on a rank where it fails (a name
    the exercise never set), so a check can say which part is missing."""
    view.execute(f"try:\n    _checks_value = {expression}\nexcept Exception:\n    _checks_value = None", block=True)
    return view.pull("_checks_value", block=True)
