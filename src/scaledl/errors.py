"""Errors a user can fix, and how a command reports them: one line, exit status 2.

A wrong flag, missing data, a half-set launcher environment or a corrupt checkpoint is not
a bug in the program: it gets one line that says what is wrong and what to do, not a
traceback, and the run stops before it writes anything.

Under a launcher every rank hits the same mistake, so only the main rank prints it; each rank
also leaves its line in `$SCALEDL_ERROR_DIR` when a launcher the package started set it
(`scaledl.launchers.run_launcher`), which prints the line again after everything the
launcher said, and exits with the rank's status.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import signal
import sys

from scaledl import signals

ERROR_DIR_VAR = "SCALEDL_ERROR_DIR"


class UserError(Exception):
    """Base of every error whose message tells the user what to change."""


class RunError(Exception):
    """A run that went wrong on its own (diverged, lost a peer): one line, exit status 1."""


CHECK_FLAGS_VAR = "SCALEDL_CHECK_FLAGS"  # set: a rung checks its flags and stops (`scaledl demo` asks)


class FlagsChecked(Exception):
    """Raised once the flags are parsed and checked, when $SCALEDL_CHECK_FLAGS asks for nothing more."""


class NothingToDo(Exception):
    """The command has nothing to do (a resumed run that had already finished): one line from the
    main rank, exit status 0."""


class StoppedOnRequest(Exception):
    """Every rank stopped together at an agreed step because one was asked to (SIGUSR1, a
    scheduler's warning before its time limit), after saving a checkpoint where the rung keeps
    them: one line from the main rank, exit status 0.  What was asked for was done, and a
    non-zero status would make torchrun print a screenful per rank; the run is not finished
    (no summary.json), which the line says."""


# Set by scaledl.distributed.setup, so that a collective's timeout can be named in the error.
collective_timeout_s: float | None = None


def _lost_a_peer(error: BaseException) -> bool:
    """A collective failed because another rank died or stopped answering."""
    names = {cls.__name__ for cls in type(error).__mro__}
    text = str(error).lower()
    signs = ("timed out", "connection closed by peer", "connection reset by peer")
    return bool(names & {"DistBackendError", "DistNetworkError", "HorovodInternalError"}) or (
        isinstance(error, RuntimeError) and any(sign in text for sign in signs))


def _frames(error: BaseException):
    """(module name, function name, locals) of each frame the exception passed through."""
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        yield frame.f_globals.get("__name__", ""), frame.f_code.co_name, frame.f_locals
        tb = tb.tb_next


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0][:160] if text else "") or type(error).__name__


def as_user_error(error: Exception) -> UserError | None:
    """The user's mistake behind an exception a library raised, when it is one; else None.

    Libraries report these in their own words, as RuntimeErrors deep in a traceback: a port
    that another process holds, a backend this PyTorch was built without, a DeepSpeed
    checkpoint that is truncated or half-deleted.  Matched by where they were raised and
    what they say."""
    text = str(error)
    if "EADDRINUSE" in text or "address already in use" in text.lower():
        port = re.search(r"port:? (\d+)", text) or re.search(r":(\d{2,5})\b", text)
        which = f"port {port.group(1)}" if port else "the rendezvous port"
        return UserError(f"{which} is already taken on this host (another job or process holds it): pick a free one "
                         "with MASTER_PORT=<port> (torchrun: --master-port, deepspeed: --master_port), or use "
                         "`scaledl launch`, which picks one")
    if "No Adasum operation enabled" in text:  # horovod/common/operations.cc: Adasum ops exist for MPI only
        return UserError("Horovod's Adasum runs over MPI only and this job's Horovod runs on Gloo (horovodrun --gloo, "
                         "or a Horovod built without MPI): start it with horovodrun --mpi or mpirun, or leave out "
                         "op=hvd.Adasum (--adasum)")
    frames = list(_frames(error))
    for module, function, local_vars in frames:
        if module.startswith("deepspeed.runtime") and function == "load_checkpoint":
            where = local_vars.get("load_dir")
            return UserError(f"DeepSpeed checkpoint {where or ''} is damaged or incomplete ({type(error).__name__}: "
                             f"{_first_line(error)}): start the run over with --overwrite instead of --resume, or name "
                             "another --out-dir")
    in_init = any(module.startswith("torch.distributed") and function in ("init_process_group", "new_group")
                  for module, function, _ in frames)
    missing = re.search(r"doesn't have (\w+) built in", text)
    if missing:
        return UserError(f"this PyTorch was built without the {missing.group(1)} backend: leave out --backend "
                         "(gloo on CPU, nccl on CUDA GPUs) or install a PyTorch that has it")
    if in_init and "no GPUs found" in text:
        return UserError("--backend nccl needs CUDA GPUs and this host has none: leave out --backend, or use gloo")
    if in_init and re.search(r"invalid backend|unknown backend type", text, re.IGNORECASE):
        return UserError(f"PyTorch does not know this backend ({_first_line(error)}): leave out --backend, or use gloo")
    # NCCL refuses two ranks of one node on one GPU (ncclInvalidUsage), in words that changed: "Duplicate GPU
    # detected : rank 1 and rank 0 both on CUDA device ..." up to 2.29 (src/init.cc), "Multiple ranks detected using
    # the same GPU on this node" in 2.30.3-2.30.4 (src/graph/topo.cc), "Multiple Ranks are using the same
    # GPU/Partition" from 2.30.7 (src/init.cc).
    shared = re.search(r"Duplicate GPU detected\s*:\s*([^\n]*)|Multiple ranks[^\n]*?using the same GPU", text,
                       re.IGNORECASE)
    if shared:
        return UserError(f"two ranks share one GPU ({(shared.group(1) or shared.group(0)).strip()}), and "
                         "NCCL needs one GPU per rank: start at most as many ranks on a node as it has GPUs "
                         "(torchrun --nproc_per_node, mpiexec --ppn), or run on the CPU with --device cpu")
    if isinstance(error, ModuleNotFoundError) and error.name == "oneccl_bindings_for_pytorch":
        return UserError("the ccl backend needs oneCCL's bindings (oneccl_bindings_for_pytorch), which are not "
                         "installed: load Aurora's frameworks module, or use --backend gloo")
    return None


def _place() -> tuple[int, int]:
    """(rank, world size) from the launcher's variables; (0, 1) when they cannot be read."""
    from scaledl.launch_env import detect

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
    rank, world_size = _place()
    line = consequence_line(prog, rank, world_size)
    _say(line)
    _leave_for_launcher(rank, 1, line, consequence=True)
    return 1


def _report(prog: str, message: str, code: int, every_rank: bool = False) -> int:
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
        signals.install(interrupted_line(prog))
        signals.at_interrupt(_release_deepspeed_buffers)
        # A flag error is a user error too: every rank parses the same flags, one prints.
        argparse.ArgumentParser.exit = _raise_usage_exit
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
                waited = f"the --timeout of {collective_timeout_s:g} s" if collective_timeout_s else "its timeout"
                detail = text.splitlines()[0][:200] if text else type(error).__name__
                return _report(prog, f"a collective waited {waited} for a peer rank that hung or died; check the "
                               f"other ranks' output ({detail})", 1, every_rank=True)
            return _consequence(prog)
        finally:
            argparse.ArgumentParser.exit = _argparse_exit

    return wrapper
