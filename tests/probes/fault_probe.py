"""Run a rung with a fault injected on one rank at one training step, then as usual.

    FAULT=kill|stop|nan FAULT_RANK=1 FAULT_STEP=5 python -m fault_probe scaledl.ladder.ddp ARGS

kill: the rank SIGKILLs itself (a crashed process); stop: it SIGSTOPs itself (a hung node:
alive, silent); nan: its loss becomes NaN; error: it stops with a one-line error of its own
(what a full disk while checkpointing on rank 0 does).  The step is counted at the rung's loss function,
which every PyTorch rung calls once per training step.
"""
import os
import runpy
import signal
import sys

import torch
import torch.nn.functional as F

from scaledl.errors import UserError
from scaledl.launch_env import detect

fault, fault_rank, fault_step = os.environ["FAULT"], int(os.environ["FAULT_RANK"]), int(os.environ["FAULT_STEP"])
# Only in the first attempt: a job that torchrun restarts must get through the second.
is_target = detect().rank == fault_rank and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
real_cross_entropy = F.cross_entropy
steps = 0


def cross_entropy_with_fault(*args, **kwargs):
    global steps
    loss = real_cross_entropy(*args, **kwargs)
    if not torch.is_grad_enabled():  # evaluation
        return loss
    steps += 1
    if is_target and steps == fault_step:
        if fault == "nan":
            return loss * float("nan")
        if fault == "error":
            raise UserError(f"fault injected at step {steps} on rank {fault_rank}")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    return loss


F.cross_entropy = cross_entropy_with_fault
# The deepspeed launcher puts --local_rank=N before the module's name.
launcher_args = [arg for arg in sys.argv[1:] if arg.startswith("--local_rank")]
module, *rung_args = [arg for arg in sys.argv[1:] if not arg.startswith("--local_rank")]
sys.argv = [module, *rung_args, *launcher_args]
runpy.run_module(module, run_name="__main__", alter_sys=True)
