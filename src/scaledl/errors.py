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


def exits_cleanly(main):
    """Wrap a command's main(argv): a UserError becomes `prog: error: message` and exit 2."""

    @functools.wraps(main)
    def wrapper(argv=None):
        try:
            return main(argv)
        except UserError as error:
            spec = getattr(sys.modules.get(main.__module__), "__spec__", None)  # the -m name when run with -m
            prog = spec.name if spec else sys.argv[0]
            print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
            return 2

    return wrapper
