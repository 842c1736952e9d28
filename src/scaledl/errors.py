"""Errors a user can fix, and the ones a run meets on its own: what each means, in one line.

A wrong flag, missing data, a half-set launcher environment or a corrupt checkpoint is not
a bug in the program: it gets one line that says what is wrong and what to do, not a
traceback, and the run stops before it writes anything.  How a command turns these into that
line and its exit status is `scaledl.exits`.
"""
from __future__ import annotations

import re


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
