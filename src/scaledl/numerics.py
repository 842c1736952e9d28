"""Stop (or skip the step) when training produces a NaN or an infinity.

A diverged run that carries on writes NaN weights into every later checkpoint, and on a
shared machine nobody notices until the allocation is gone.  The guard looks at the
gradients after they have been averaged across ranks, so every rank sees the same verdict
and they all stop (or skip) together; a rank that stopped alone would leave its peers waiting
in the next collective until the timeout.

Under fp16 loss scaling an infinite gradient is expected now and then: the GradScaler skips
that step and lowers the scale, so the guard stands aside.

Reading a verdict on the host (`.item()`) makes the host wait for the device, which stops a GPU's
queue of kernels from running ahead of Python (lesson 2).  So under `stop` (the default) the
verdict stays on the device: the guard notes the first step whose gradients were not finite and
`check()` reads it when the run reads its metrics anyway (every --log-interval) and before any
checkpoint is written, so the run stops a few steps later than the bad one, names it, and never
saves what came after it.  `skip` must know before the optimizer steps, so it reads the verdict
every step: one host sync a step, the price of skipping.
"""
from __future__ import annotations

import math
from pathlib import Path

from scaledl.errors import RunError

POLICIES = ("stop", "skip")


class NonFiniteError(RunError):
    """The loss or the gradients became NaN or infinite; the message says where and what next."""


class NonFiniteGuard:
    def __init__(self, policy: str, rank: int, checkpoint_path: str | Path, enabled: bool = True, log=None,
                 step=None):
        """`step()` gives the number of the step being checked, so callers need not pass it."""
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.policy, self.rank, self.enabled, self.log = policy, rank, enabled, log
        self._step = step
        self.checkpoint_path = Path(checkpoint_path)
        self.skipped_steps = 0
        self._first_bad = self._bad_loss = None  # on the device, under `stop`: the first bad step and its loss

    def allows_step(self, parameters, loss, step: int | None = None) -> bool:
        """True when the optimizer may step; False to skip this step; raises to stop the run."""
        step = self._step() if step is None else step
        if not self.enabled:
            return True
        import torch

        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return True
        # One norm over all gradients: a single host sync per step, and a NaN anywhere shows.  A sharded
        # gradient (a DTensor: FSDP2, tensor parallelism) counts its local shard, and one all-reduce of
        # the norms (a sum keeps NaN and inf) gives every rank the same verdict.
        sharded = any(hasattr(g, "to_local") for g in grads)
        norm = torch.nn.utils.get_total_norm([g.to_local() if hasattr(g, "to_local") else g for g in grads])
        if sharded:
            torch.distributed.all_reduce(norm)
        if self.policy == "stop":
            self._watch(norm, loss, step)  # no host sync: `check()` reads it at the next log line or checkpoint
            return True
        if math.isfinite(norm.item()):
            return True
        return self._non_finite(loss, step, "gradients")

    def _watch(self, norm, loss, step: int) -> None:
        import torch

        if self._first_bad is None:
            self._first_bad = torch.full((), -1, dtype=torch.long, device=norm.device)
            self._bad_loss = torch.zeros((), dtype=torch.float32, device=norm.device)
        first = (~torch.isfinite(norm)) & (self._first_bad < 0)
        self._first_bad = torch.where(first, step, self._first_bad)
        self._bad_loss = torch.where(first, loss.detach().float().to(norm.device), self._bad_loss)

    def check(self) -> None:
        """Under `stop`: raise if a step since the last check had non-finite gradients (reads the device's
        verdict: a host sync, so the run calls it where it syncs anyway, at --log-interval and before a save)."""
        if self._first_bad is None:
            return
        step = int(self._first_bad.item())
        if step >= 0:
            self._non_finite(self._bad_loss, step, "gradients")

    def allows_loss(self, loss, step: int | None = None) -> bool:
        """The same verdict from the loss alone, agreed over all ranks (one tiny all-reduce):
        for engines that keep the averaged gradients to themselves (DeepSpeed's ZeRO)."""
        step = self._step() if step is None else step
        if not self.enabled:
            return True
        import torch
        import torch.distributed as dist

        bad = (~torch.isfinite(loss.detach())).float().reshape(1)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        return bad.item() == 0 or self._non_finite(loss, step, "loss")

    def _non_finite(self, loss, step: int, what: str) -> bool:
        loss_value = float(loss.detach().float().item())
        if self.policy == "skip":
            self.skipped_steps += 1
            if self.log is not None:
                self.log.warning("step %d: non-finite %s (loss %s on rank 0); step skipped (%d so far)",
                                 step, what, loss_value, self.skipped_steps)
            return False
        last_good = (f"last good checkpoint {self.checkpoint_path}" if self.checkpoint_path.exists()
                     else "no checkpoint written yet")
        raise NonFiniteError(
            f"non-finite {what} at step {step} on rank {self.rank} (loss on this rank: {loss_value}); {last_good}. "
            "Lower --lr, or pass --on-nonfinite skip to skip such steps")
