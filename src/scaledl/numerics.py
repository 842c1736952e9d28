"""Stop (or skip the step) when training produces a NaN or an infinity.

A diverged run that carries on writes NaN weights into every later checkpoint, and on a
shared machine nobody notices until the allocation is gone.  The guard looks at the
gradients after they have been averaged across ranks, so every rank sees the same verdict
and they all stop (or skip) together; a rank that stopped alone would leave its peers waiting
in the next collective until the timeout.

Under fp16 loss scaling an infinite gradient is expected now and then: the GradScaler skips
that step and lowers the scale, so the guard stands aside.
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
        if math.isfinite(norm.item()):
            return True
        return self._non_finite(loss, step, "gradients")

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
