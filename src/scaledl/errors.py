"""Errors a user can fix, and how a command reports them: one line, exit status 2.

A wrong flag, missing data, a half-set launcher environment or a corrupt checkpoint is not
a bug in the program: it gets one line that says what is wrong and what to do, not a
traceback, and the run stops before it writes anything.
"""
from __future__ import annotations

import functools
import sys


class UserError(Exception):
    """Base of every error whose message tells the user what to change."""


class RunError(Exception):
    """A run that went wrong on its own (diverged, lost a peer): one line, exit status 1."""


# Set by scaledl.distributed.setup, so that a collective's timeout can be named in the error.
collective_timeout_s: float | None = None


def _lost_a_peer(error: BaseException) -> bool:
    """A collective failed because another rank died or stopped answering."""
    names = {cls.__name__ for cls in type(error).__mro__}
    text = str(error).lower()
    return bool(names & {"DistBackendError", "DistNetworkError", "HorovodInternalError"}) or (isinstance(error, RuntimeError) and any(
        sign in text for sign in ("timed out", "connection closed by peer", "connection reset by peer")))


def exits_cleanly(main):
    """Wrap a command's main(argv): a UserError becomes `prog: error: message` and exit 2;
    a RunError or a collective that lost its peer becomes one line and exit 1."""

    @functools.wraps(main)
    def wrapper(argv=None):
        spec = getattr(sys.modules.get(main.__module__), "__spec__", None)  # the -m name when run with -m
        prog = spec.name if spec else sys.argv[0]
        try:
            return main(argv)
        except UserError as error:
            print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
            return 2
        except RunError as error:
            print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
            return 1
        except Exception as error:
            if not _lost_a_peer(error):
                raise
            text = str(error).strip()
            if "timed out" in text.lower() or "timeout" in text.lower():
                waited = f"the --timeout of {collective_timeout_s:g} s" if collective_timeout_s else "its timeout"
                what = f"a collective waited {waited} for a peer rank that hung or died"
            else:
                what = "a collective lost a peer rank (it died or stopped answering)"
            detail = text.splitlines()[0][:200] if text else type(error).__name__
            print(f"{prog}: error: {what}; check the other ranks' output ({detail})", file=sys.stderr, flush=True)
            return 1

    return wrapper
