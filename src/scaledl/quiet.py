"""Keep library noise that a learner cannot act on out of a run's and a notebook's outputs, at its source.

    import deepspeed
    from scaledl import quiet
    quiet.deepspeed()      # on every rank, before deepspeed.initialize
    with quiet.flatten_advice():   # around a gather of whole tensors from a 2-D mesh

Nothing here hides an error: each function names the one message it silences and why.
"""
from __future__ import annotations

import contextlib
import os
import sys
import warnings


@contextlib.contextmanager
def _descriptor_2_to_devnull():
    """Point file descriptor 2 (what child processes such as a compiler write to) at /dev/null."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def deepspeed() -> None:
    """Run DeepSpeed's probe of the ops this machine can build now, with descriptor 2 at /dev/null,
    and silence torch's deprecation warning for the collectives DeepSpeed calls by old names.

    The probe (`deepspeed.ops.__compatible_ops__`, first read when `deepspeed.initialize` builds
    its communication backend) compiles and links small test programs, libaio's `io_submit`
    among them, and silences the compiler by redirecting `sys.stderr.fileno()`
    (`OpBuilder.has_function`, deepspeed/ops/op_builder/builder.py, 0.19.8).  In a Jupyter or
    ipyparallel kernel that is a copy of the original stream, not descriptor 2
    (ipykernel's `OutStream.fileno`), so on a machine without libaio the linker's
    "cannot find -laio" lands in the notebook.  DeepSpeed caches the probe's result in the
    module, so `deepspeed.initialize` does not probe again.  (Releases that probe at import,
    older than 0.19, have probed already: then this only sets the warning filter.)

    torch 2.13 deprecates `all_gather_into_tensor` and `reduce_scatter_tensor`, which ZeRO in
    DeepSpeed 0.19.8 still calls: the FutureWarning is for DeepSpeed's authors, not for a learner.
    """
    import deepspeed.ops

    for name in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        warnings.filterwarnings("ignore", message=rf"`torch\.distributed\.{name}` is deprecated",
                                category=FutureWarning)
    if "__compatible_ops__" not in vars(deepspeed.ops):
        with _descriptor_2_to_devnull():
            getattr(deepspeed.ops, "__compatible_ops__")


@contextlib.contextmanager
def flatten_advice():
    """Hold back torch 2.13's per-rank warning, while gathering whole tensors from a 2-D mesh
    (FSDP2 x tensor parallelism), that one all-gather would be faster than the two it takes per
    tensor (`_warn_flatten_optimization_not_possible`, torch/distributed/tensor/_redistribute.py):
    advice for a training loop, not for a checkpoint's once-per-save gather (scaledl.ladder.harness.run_state)."""
    import logging

    logger = logging.getLogger("torch.distributed.tensor._redistribute")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
