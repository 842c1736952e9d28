"""How a rank ends when it is told to stop: Ctrl-C, a scheduler's SIGTERM, a lost terminal, a dead launcher.

A training process can be deep inside a collective (C++, no Python running) when the signal
comes, and its peers may already be gone, so Python's own handling (a KeyboardInterrupt
somewhere, then a traceback from every layer it unwinds through) gives a screenful per rank
or none at all.  Here:

- SIGINT, SIGTERM and SIGHUP raise `Interrupted` in the main thread, so the rung's `finally`
  blocks run (the process group is left, DeepSpeed's /dev/shm buffers are removed), and
  `exits.exits_cleanly` prints one line for the rank;
- a watcher process hears the same signal at once through Python's wakeup fd, even while the
  main thread is stuck in C++, and ends the rank itself after `GRACE_S` if the main thread
  has not (removing the DeepSpeed shared memory it had mapped);
- a rank started by a launcher dies with it: the kernel sends SIGTERM when the parent goes
  (PR_SET_PDEATHSIG), and the watcher also notices a launcher further up that is gone (the
  `deepspeed` runner starts a second launcher that starts the ranks);
- SIGUSR1 is a request, not an ending: it only sets `stop_requested`.  Slurm sends it before a
  job's time limit (`sbatch --signal`), and the harness answers at the next metrics line, the
  step every rank agrees on: it saves a checkpoint and stops, so that the requeued job resumes
  from there.  PyTorch Lightning listens for the same signal under Slurm (its
  `_SignalConnector`, lightning/pytorch/trainer/connectors/signal_connector.py) but saves from
  inside the handler, wherever each rank happens to be; an agreed step keeps ranks consistent.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import threading

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_REQUEST = signal.SIGUSR1  # "save and stop at the next step every rank agrees on"
GRACE_S = 5.0  # after a signal, time for the main thread to unwind before the watcher ends the process
POLL_S = 0.5  # how often the watcher looks at the launcher processes
PR_SET_PDEATHSIG = 1

received: int | None = None  # the first signal the main thread saw, if any
reported = False  # set once this rank's one line about it is out
leaving = False  # set by `leave()`: the process is exiting with its status, a signal changes nothing
stop_requested: int | None = None  # STOP_REQUEST's number once it came (see `_on_stop_request`)
_cleanups: list = []
_installed = False


class Interrupted(BaseException):
    """Raised in the main thread by SIGINT, SIGTERM or SIGHUP (a BaseException, like KeyboardInterrupt,
    so that `except Exception` in library code does not swallow it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def exit_status(signum: int) -> int:
    """The shell's convention: 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + signum


def at_interrupt(cleanup) -> None:
    """Run `cleanup()` when this process ends because of a signal (also if the main thread is stuck)."""
    _cleanups.append(cleanup)


def run_cleanups() -> None:
    while _cleanups:
        try:
            _cleanups.pop()()
        except Exception:  # noqa: BLE001  cleanup is best effort: the process is ending anyway
            pass


def started_by_launcher(env=None) -> bool:
    """A launcher's rank variables are set (torchrun, deepspeed, horovodrun, mpirun, srun, PALS)."""
    env = os.environ if env is None else env
    return any(name in env for name in ("LOCAL_RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                        "PALS_RANKID", "SLURM_STEP_NUM_TASKS"))


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat), None if it is gone.

    With the pid it names one process for good: a pid can be reused, the pair cannot."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 and fields[0] not in ("Z", "X") else None


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def launcher_processes(pid: int | None = None) -> list[tuple[int, str]]:
    """(pid, start time) of the launchers this rank must not outlive: its parent, and above the
    deepspeed launcher's per-node process also the `deepspeed` runner that started it."""
    pid = os.getpid() if pid is None else pid
    watched = []
    parent = os.getppid() if pid == os.getpid() else _parent(pid)
    while parent and parent > 1:
        start = _start_time(parent)
        if start is None:
            break
        watched.append((parent, start))
        if "deepspeed.launcher.launch" not in _command(parent):
            break
        parent = _parent(parent)
    return watched


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        return int(stat[stat.rfind(")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _die_with_parent() -> None:
    """Ask the kernel to send SIGTERM when the parent exits (Linux only; elsewhere the watcher polls)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return


def _on_signal(signum, frame):
    global received
    if received is not None or leaving:
        # Already unwinding: a second Ctrl-C must not interrupt the cleanup.  Or already
        # leaving: the launcher's SIGTERM to a rank that is exiting anyway (its peer stopped)
        # must not turn its last moments into a traceback.  The watcher still heard it and
        # ends the process after GRACE_S if it does not end by itself.
        received = signum if received is None else received
        return
    received = signum
    raise Interrupted(signum)


def _on_stop_request(signum, frame):
    # Only a flag: the main thread may be inside a collective, and every rank must stop at the
    # same step (scaledl.ladder.harness reads the flag when the ranks next reduce their metrics).
    global stop_requested
    stop_requested = signum


def _end_quietly(signum, frame):
    os._exit(exit_status(signum))


def until_installed() -> None:
    """From a program's first moment until `install()`: a signal ends the process at once, quietly,
    with the shell's status (143 for SIGTERM).

    Importing torch takes seconds, and a launcher may stop the job inside them: horovodrun ends
    every rank as soon as one fails (its safe_shell_exec sends SIGTERM to each rank's shell's
    children), and a rank killed outright by the signal makes that shell print "Terminated" under
    the rank's tag, a line about nothing.  Nothing has started yet (no process group, no buffer,
    no file), so there is nothing to clean up or to say."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in HANDLED:
        if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
            continue  # started under nohup
        signal.signal(signum, _end_quietly)
    if signal.getsignal(STOP_REQUEST) in (signal.SIG_DFL, None):  # its default would end the process
        signal.signal(STOP_REQUEST, _on_stop_request)


def leave() -> None:
    """From here on the process is exiting: a signal is noted, not raised (see `_on_signal`)."""
    global leaving
    leaving = True


# The watcher is a small process of its own, not a thread: a rank can sit in C++ holding the
# GIL (DeepSpeed's shared-memory all-reduce spins there while it waits for a dead peer), and
# then no thread of it runs Python; Python's C-level handler still writes the signal's number
# to the wakeup fd, which the watcher reads.  It exits when the rank does.
_WATCHER = r"""
import os, select, signal, sys, time
def start_time(pid):
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if fields[0] not in ("Z", "X") else None
def shared_memory(pid):
    try:
        maps = open(f"/proc/{pid}/maps").read().split("\n")
    except OSError:
        return set()
    return {m.split()[-1] for m in maps if " /dev/shm/deepspeed_" in m}
def signal_rank(rank, born, signum):
    # The rank (this process's parent) may end at any moment, and its pid be reused.
    if os.getppid() != rank or start_time(rank) != born:
        return False
    try:
        os.kill(rank, signum)
    except OSError:
        return False
    return True
def watch():
    rank, fd, grace, poll = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    handled, line = {int(s) for s in sys.argv[5].split(",")}, sys.argv[6]
    launchers = [(int(p), t) for p, t in (w.split(":") for w in sys.argv[7:])]
    born = start_time(rank)
    deadline, heard, told = None, signal.SIGTERM, False
    while os.getppid() == rank:
        if select.select([fd], [], [], poll)[0]:
            data = os.read(fd, 64)
            if not data:
                return  # the rank closed its end: it is exiting
            got = [b for b in data if b in handled]
            if got and deadline is None:
                deadline, heard = time.monotonic() + grace, got[0]
        if deadline is None and not told and any(start_time(p) != t for p, t in launchers):
            told = signal_rank(rank, born, signal.SIGTERM)  # the launcher is gone: stop as its signal would
            if not told:
                return
        if deadline is not None and time.monotonic() > deadline:
            for path in shared_memory(rank):  # DeepSpeed never removes its buffers
                try:
                    os.unlink(path)
                except OSError:
                    pass
            if signal_rank(rank, born, signal.SIGKILL):
                os.write(2, (line.replace("{signal}", signal.Signals(heard).name) + "\n").encode())
            return
# Signals to the group reach the watcher too: only the rank's count.  Whatever happens here, the
# rank's output (which is also the watcher's) gets no traceback: a launcher that closed the
# pipe, a rank gone between two looks, a signal to the whole group.
for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a signal to the rank's process group (torchrun,
    signal.signal(signum, signal.SIG_IGN)  # mpirun) is the rank's to handle; the watcher ends with its rank
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
try:
    watch()
except BaseException:
    pass
os._exit(0)
"""


def _start_watcher(reader: socket.socket, launchers: list[tuple[int, str]], line: str) -> None:
    import subprocess

    command = [sys.executable, "-I", "-S", "-c", _WATCHER, str(os.getpid()), str(reader.fileno()), str(GRACE_S),
               str(POLL_S), ",".join(str(int(s)) for s in HANDLED), line,
               *(f"{pid}:{start}" for pid, start in launchers)]
    try:
        subprocess.Popen(command, pass_fds=(reader.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         close_fds=True)
    except OSError:
        pass  # no watcher: signals still work whenever the main thread runs Python


def mapped_shared_memory(pid: int | str = "self") -> set[str]:
    """/dev/shm/deepspeed_* files a process has mapped (its own all-reduce buffer and its peers')."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {line.split()[-1] for line in f if " /dev/shm/deepspeed_" in line}
    except OSError:
        return set()


def install(line: str = "stopped by {signal}") -> None:
    """Handle SIGINT, SIGTERM and SIGHUP as `Interrupted`; under a launcher, die with it.

    `line` is the rank's one line ("{signal}" becomes the signal's name), printed by the
    watcher if it has to end the process itself.  Call from the main thread at the start of a
    command (`exits.exits_cleanly` does)."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _installed = True
    for signum in HANDLED:
        if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
            continue  # started under nohup: keep ignoring a lost terminal
        signal.signal(signum, _on_signal)
    if signal.getsignal(STOP_REQUEST) in (signal.SIG_DFL, None):  # left alone if the caller has a handler
        signal.signal(STOP_REQUEST, _on_stop_request)
    launchers = []
    if started_by_launcher():
        _die_with_parent()
        launchers = launcher_processes()
    if not sys.platform.startswith("linux"):
        return  # the watcher reads /proc
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    try:
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:
        return
    _start_watcher(reader, launchers, line)
    # Both ends stay open for the life of the process: with a reader of its own, a signal that
    # comes after the watcher is gone fills the buffer (ignored) instead of failing with EPIPE,
    # which Python reports as "Exception ignored ... BrokenPipeError" from inside the handler.
    install.reader, install.writer = reader, writer
