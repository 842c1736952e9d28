"""The ladder: one runnable module per rung, from one device to ZeRO, tensor and 2D parallelism.

Each rung (`python -m scaledl.ladder.<rung>` under any launcher) is a teaching text: a plain loop
and, in the open, every call its framework needs; its diff against the rung it extends is that
framework alone, each changed line marked `# New Code #`.  What every rung does the same way
(metrics, checkpoints, the non-finite guard, the summary line) is `harness`, beneath the rungs.

May import: the helpers (scaledl.*) only; the harness may not import a rung.

RUNGS lists the rows of `scaledl demo`: the module each runs, the launcher the demo starts
it with (any launcher works for a multi-process rung: torchrun, mpiexec, srun, ...), and
the flags that make the row (ZeRO's stages are one module with different flags).
"""
import sys

if sys.argv[:1] == ["-m"]:  # Python says "-m" here while it imports the package of `python -m scaledl.ladder.<rung>`
    import os

    from scaledl import signals

    signals.until_installed()  # a launcher's SIGTERM during the seconds torch takes to import ends the rank quietly
    # TensorFlow's C++ start-up lines (INFO and WARNING: oneDNN, CUDA drivers absent) before the rung's own, as
    # the launchers already set it for every rank (scaledl.hpc.launchers.local_env); its errors still print.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RUNGS = {
    "single_torch": ("single_torch", "python", []),
    "single_tf": ("single_tf", "python", []),
    "horovod_tf": ("horovod_tf", "horovodrun", []),
    "horovod_torch": ("horovod_torch", "horovodrun", []),
    "ddp": ("ddp", "torchrun", []),
    "deepspeed": ("deepspeed", "deepspeed", ["--zero-stage", "0"]),
    "zero1": ("deepspeed", "deepspeed", ["--zero-stage", "1"]),
    "zero2": ("deepspeed", "deepspeed", ["--zero-stage", "2"]),
    "zero3": ("deepspeed", "deepspeed", ["--zero-stage", "3"]),
    "zero3_offload": ("deepspeed", "deepspeed", ["--zero-stage", "3", "--offload-optimizer", "--offload-params"]),
    "fsdp": ("fsdp", "torchrun", []),
    "pipeline": ("pipeline", "torchrun", []),
    "tensor_parallel": ("tensor_parallel", "torchrun", []),  # the transformer, split across all ranks
    "fsdp_tp": ("fsdp_tp", "torchrun", []),  # the transformer on a dp x tp mesh
}
