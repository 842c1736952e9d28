"""What every lesson's checks share: the one-line verdict, and reading a name off every live rank."""
from __future__ import annotations


def _verdict(ok: bool, message: str) -> bool:
    print(("PASS: " if ok else "FAIL: ") + message)
    return ok


def _unfinished(name: str) -> bool:
    return _verdict(False, f"`{name}` is not set: finish the exercise cell above and run it")


def from_ranks(view, name: str) -> list | None:
    """`name` as every rank of an ipyparallel view holds it, or None (with a FAIL line) when
    the exercise cell that sets it has not run to the end on every rank."""
    try:
        return view.pull(name, block=True)
    except Exception:  # ipyparallel wraps the engines' NameError in a CompositeError
        _verdict(False, f"`{name}` is not set on every rank: finish the exercise cell above and run it")
        return None


def gather(view, expression: str) -> list:
    """`expression` evaluated on every rank, in rank order; None on a rank where it fails (a name
    the exercise never set), so a check can say which part is missing."""
    view.execute(f"try:\n    _checks_value = {expression}\nexcept Exception:\n    _checks_value = None", block=True)
    return view.pull("_checks_value", block=True)
