"""How a command ends: an error a user can fix is one line and exit status 2, a signal one line and 128 + it.

`exits_cleanly` wraps a command's main(argv).  Under a launcher every rank hits the same mistake, so
only the main rank prints it; each rank also leaves its line in `$SCALEDL_ERROR_DIR` when a launcher
the package started set it (`scaledl.hpc.launchers.run_launcher`), which prints the line again after
everything the launcher said, and exits with the rank's status.  The errors themselves are
`scaledl.errors`; which rank this is, `scaledl.launch_env`.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys

from scaledl import errors, signals
from scaledl.errors import (ERROR_DIR_VAR, FlagsChecked, NothingToDo, RunError, StoppedOnRequest, UserError,
                            _lost_a_peer, as_user_error)


def _place() -> tuple[int, int]:
    """(rank, world size) from the launcher's variables; (0, 1) when they cannot be read."""
    from scaledl.launch_env import detect  # imports scaledl.errors: not at the top

    try:
        info = detect()
    except Exception:  # noqa: BLE001  a half-set environment is itself the error being reported
        return 0, 1
    return info.rank, info.world_size


def _leave_for_launcher(rank: int, code: int, line: str, consequence: bool = False) -> None:
    """Tell the launcher wrapper (run_launcher) this rank's status and line; `consequence`: this
    rank stopped because another did (the wrapper prints a cause last, not a consequence)."""
    folder = os.environ.get(ERROR_DIR_VAR)
    if not folder or not os.path.isdir(folder):
        return
    try:
        with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "code": code, "line": line, "consequence": consequence}, f)
    except OSError:
        pass


def _first_cause(rank: int) -> int | None:
    """The lowest other rank that left its own error (not a consequence) for the launcher wrapper."""
    folder = os.environ.get(ERROR_DIR_VAR)
    if not folder or not os.path.isdir(folder):
        return None
    causes = []
    for name in os.listdir(folder):
        try:
            with open(os.path.join(folder, name)) as f:
                record = json.load(f)
            if record["rank"] != rank and not record.get("consequence"):
                causes.append(int(record["rank"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return min(causes) if causes else None


def consequence_line(prog: str, rank: int, world_size: int) -> str:
    """`prog: rank 1: stopping because rank 0 stopped; see its line above`, for a rank that lost a peer.

    Which peer is known when it left its line for the launcher wrapper (`scaledl launch`, the
    demo); in a job of two it can only be the other rank; otherwise it is not known here."""
    cause = _first_cause(rank)
    if cause is not None:
        return f"{prog}: rank {rank}: stopping because rank {cause} stopped; see its line above"
    who = f"rank {1 - rank}" if world_size == 2 else "another rank"
    return (f"{prog}: rank {rank}: stopping because {who} is gone (it stopped, crashed or hung); its line above, "
            "or the launcher's report, says why")


def _consequence(prog: str) -> int:
    signals.leave()  # stopping: the launcher's SIGTERM, which may come now, must not cut this rank's line short
    rank, world_size = _place()
    line = consequence_line(prog, rank, world_size)
    _say(line)
    _leave_for_launcher(rank, 1, line, consequence=True)
    return 1


def _report(prog: str, message: str, code: int, every_rank: bool = False) -> int:
    signals.leave()  # as in _consequence
    rank, world_size = _place()
    line = f"{prog}: error: {message}"
    if rank == 0 or every_rank:
        _say(line)
    _leave_for_launcher(rank, code, line)
    return code


def _say(line: str) -> None:
    """One write per line: ranks share the launcher's stderr, and print() writes the text and the
    newline apart, so two ranks' lines could run together.  A reader that is gone (a launcher
    that exited and closed the pipe) is not an error of this rank's."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        _silence()


def _silence() -> None:
    """Point stdout and stderr at /dev/null: their reader is gone, and a later write (Python's own
    flush at exit) would fail again, this time with a traceback."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            os.dup2(null, fd)
        os.close(null)
    except OSError:
        pass


def interrupted_line(prog: str, signum: int | None = None) -> str:
    """`prog: stopped by SIGTERM (rank 1 of 2)`; with no signum, "{signal}" stands for its name."""
    rank, world_size = _place()
    where = f" (rank {rank} of {world_size})" if world_size > 1 else ""
    return f"{prog}: stopped by {signals.signal_name(signum) if signum else '{signal}'}{where}"


def _interrupted(prog: str, signum: int | None) -> int:
    signum = signum or signals.received or 2
    signals.run_cleanups()
    if not signals.reported:
        signals.reported = True
        rank, world_size = _place()
        # The launcher ends the other ranks with a signal when one stopped on an error: say that.
        if signum == signal.SIGTERM and _first_cause(rank) is not None:
            _say(consequence_line(prog, rank, world_size))
        else:
            _say(interrupted_line(prog, signum))
    return signals.exit_status(signum)


class _UsageExit(Exception):
    """argparse's error exit inside a command, caught so that only the main rank prints it."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _raise_usage_exit(parser, status=0, message=None):
    if status and message:
        raise _UsageExit(status, message.strip())
    _argparse_exit(parser, status, message)


_argparse_exit = argparse.ArgumentParser.exit


def _release_deepspeed_buffers() -> None:
    """DeepSpeed's /dev/shm all-reduce buffers this rank mapped (they outlive every process otherwise)."""
    for path in signals.mapped_shared_memory():
        try:
            os.unlink(path)
        except OSError:
            pass


def exits_cleanly(main):
    """Wrap a command's main(argv): a UserError becomes `prog: error: message` and exit 2;
    a RunError or a collective that lost its peer becomes one line and exit 1; SIGINT, SIGTERM
    and SIGHUP become one line `prog: stopped by SIGTERM` and exit 128 + the signal."""

    @functools.wraps(main)
    def wrapper(argv=None):
        spec = getattr(sys.modules.get(main.__module__), "__spec__", None)  # the -m name when run with -m
        prog = spec.name if spec else sys.argv[0]
        # A flag error is a user error too: every rank parses the same flags, one prints.
        argparse.ArgumentParser.exit = _raise_usage_exit
        try:
            # Inside the try: the handler is in place before the watcher process has started, and a
            # launcher's SIGTERM in between (horovodrun stopping a rank whose peer failed at once, on
            # a busy machine) is this rank's one line too, not a traceback from inside install().
            signals.install(interrupted_line(prog))
            signals.at_interrupt(_release_deepspeed_buffers)
            return _run(main, argv, prog)
        except signals.Interrupted as interrupt:
            # The launcher's signal came while this rank was handling its own error, before the
            # line about it was out (horovodrun stops every rank the moment one fails): the signal
            # is how it ends, in one line, never a traceback from inside the handler.
            return _interrupted(prog, interrupt.signum)
        finally:
            argparse.ArgumentParser.exit = _argparse_exit

    return wrapper


def _run(main, argv, prog: str) -> int:
    """main(argv), with each way it can fail turned into its line and exit status (see `exits_cleanly`)."""
    try:
        return main(argv)
    except _UsageExit as usage:
        rank, _ = _place()
        if rank == 0:
            _say(str(usage))
        _leave_for_launcher(rank, usage.status, str(usage))
        return usage.status
    except FlagsChecked:
        return 0
    except NothingToDo as done:
        if _place()[0] == 0:
            print(f"{prog}: {done}", flush=True)
        return 0
    except StoppedOnRequest as stopped:
        if _place()[0] == 0:
            _say(f"{prog}: {stopped}")
        return 0
    except signals.Interrupted as interrupt:
        return _interrupted(prog, interrupt.signum)
    except KeyboardInterrupt:
        return _interrupted(prog, 2)
    except UserError as error:
        if signals.received:
            return _interrupted(prog, None)
        return _report(prog, str(error), 2)
    except RunError as error:
        if signals.received:
            return _interrupted(prog, None)
        return _report(prog, str(error), 1, every_rank=True)
    except BrokenPipeError:
        # Whoever read this rank's output is gone (the launcher exited): nobody to tell.
        _silence()
        return 1
    except Exception as error:
        if signals.received:
            # Peers stopped by the same signal make this rank's collectives fail: not news.
            return _interrupted(prog, None)
        mapped = as_user_error(error)
        if mapped is not None:
            return _report(prog, str(mapped), 2)
        if not _lost_a_peer(error):
            raise
        text = str(error).strip()
        if "timed out" in text.lower() or "timeout" in text.lower():
            # The peer may hang without a word: this rank's line is the only one.
            timeout_s = errors.collective_timeout_s
            waited = f"the --timeout of {timeout_s:g} s" if timeout_s else "its timeout"
            detail = text.splitlines()[0][:200] if text else type(error).__name__
            return _report(prog, f"a collective waited {waited} for a peer rank that hung or died; check the "
                           f"other ranks' output ({detail})", 1, every_rank=True)
        return _consequence(prog)
