"""Keep library noise that a learner cannot act on out of a run's and a notebook's outputs, at its source.

    from scaledl import quiet
    quiet.deepspeed(device)  # on every rank, before deepspeed.initialize; on a CPU before `import deepspeed`
    import deepspeed
    with quiet.flatten_advice():   # around a gather of whole tensors from a 2-D mesh

Nothing here hides an error: each function names the one message it silences and why.
"""
from __future__ import annotations

import contextlib
import logging
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


def deepspeed(device=None) -> None:
    """Run DeepSpeed's probe of the ops this machine can build now, with descriptor 2 at /dev/null,
    and silence torch's deprecation warning for the collectives DeepSpeed calls by old names.

    `device`, the torch device (or its name) this process trains on: where it is the CPU and
    `DS_ACCELERATOR` is not set, it is set to "cpu" before DeepSpeed is first imported, so that
    DeepSpeed does not guess its accelerator and log "Setting accelerator to CPU. If you have GPU
    or other accelerator, we were unable to detect it." (`get_accelerator`,
    deepspeed/accelerator/real_accelerator.py, 0.19.8).  That is the setting the deepspeed
    launcher's environment gets on a machine without a GPU (`scaledl.hpc.launchers.local_env`);
    it has no effect once DeepSpeed has been imported, so call this first.

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

    Two more lines each successful run printed, neither of which a learner can act on:
    - "**** You are using ZeRO with an untested optimizer, proceed with caution *****" (rank 0's
      logger, `DeepSpeedEngine._do_optimizer_sanity_check`, deepspeed/runtime/engine.py): the
      rungs train every framework with torch's SGD with momentum, so that their runs compare like
      for like, and say so in their config (`zero_allow_untested_optimizer`); ZeRO partitions any
      torch optimizer's state.
    - "DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully" on every rank on a
      CPU (`build_shm_op`, deepspeed/comm/torch.py; `build_ccl_op` in comm/ccl.py says the same):
      printed each time the communication backend is made.  Only that line is dropped; anything
      else the build prints, and every error it raises, goes through.
    """
    import importlib

    if device is not None and str(device).split(":")[0] == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed.ops

    for name in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        warnings.filterwarnings("ignore", message=rf"`torch\.distributed\.{name}` is deprecated",
                                category=FutureWarning)
    if "__compatible_ops__" not in vars(deepspeed.ops):
        with _descriptor_2_to_devnull():
            getattr(deepspeed.ops, "__compatible_ops__")
    ds_logger = logging.getLogger("DeepSpeed")
    if not any(isinstance(f, _UntestedOptimizer) for f in ds_logger.filters):
        ds_logger.addFilter(_UntestedOptimizer())
    for module_name, function in (("deepspeed.comm.torch", "build_shm_op"), ("deepspeed.comm.ccl", "build_ccl_op")):
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a release without it, or oneCCL's bindings missing
            continue
        build = getattr(module, function, None)
        if build is not None and not getattr(build, "_scaledl_quiet", False):
            setattr(module, function, _without_built_line(build))


class _UntestedOptimizer(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "untested optimizer" not in str(record.msg)


def _without_built_line(build):
    """`build` with its "DeepSpeed <op> built successfully" line dropped from what it prints."""
    import functools
    import io

    @functools.wraps(build)
    def quiet_build(*args, **kwargs):
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                return build(*args, **kwargs)
        finally:
            kept = [line for line in printed.getvalue().splitlines(keepends=True)
                    if not (line.startswith("DeepSpeed ") and line.rstrip().endswith(" built successfully"))]
            sys.stdout.write("".join(kept))

    quiet_build._scaledl_quiet = True
    return quiet_build


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
