"""The ladder: one runnable module per rung, from one device to ZeRO.

RUNGS maps each rung to the launcher the demo starts it with; any launcher works for a
multi-process rung (torchrun, mpiexec, srun, ...), this is only the demo's choice.
"""
RUNGS = {
    "single_torch": "python",
    "single_tf": "python",
    "horovod_tf": "horovodrun",
    "horovod_torch": "horovodrun",
    "ddp": "torchrun",
    "deepspeed": "deepspeed",
    "fsdp": "torchrun",
    "pipeline": "torchrun",
}
