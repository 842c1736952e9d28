"""Large-batch learning rate: linear scaling with the global batch, and a gradual warm-up.

Goyal et al. (2017), "Accurate, Large Minibatch SGD": when the global batch grows k-fold,
multiply the learning rate by k, and ramp it up from the unscaled value over the first
epochs, because the scaled rate is too large while the weights are still random.
"""
from __future__ import annotations


def target_lr(lr: float, global_batch_size: int, base_batch_size: int, scale_lr: bool) -> float:
    return lr * global_batch_size / base_batch_size if scale_lr else lr


def lr_at(step: int, *, lr: float, global_batch_size: int, base_batch_size: int, scale_lr: bool,
          warmup_steps: int) -> float:
    """The learning rate for optimizer step `step` (0-based)."""
    target = target_lr(lr, global_batch_size, base_batch_size, scale_lr)
    if step >= warmup_steps:
        return target
    start = min(lr, target)
    return start + (target - start) * step / warmup_steps


def for_config(config, world_size: int, steps_per_epoch: int):
    """lr_at(step) for a `scaledl.Config`: the function every rung's scheduler calls.  The global batch
    is --batch-size x --grad-accum x the data-parallel ranks (`world_size` here); a step is an optimizer step."""
    global_batch_size = config.batch_size * config.grad_accum * world_size
    warmup_steps = int(round(config.warmup_epochs * steps_per_epoch))
    return lambda step: lr_at(step, lr=config.lr, global_batch_size=global_batch_size,
                              base_batch_size=config.base_batch_size, scale_lr=config.scale_lr,
                              warmup_steps=warmup_steps)


def torch_scheduler(optimizer, config, world_size: int, steps_per_epoch: int):
    """A LambdaLR that follows `for_config` (the optimizer's lr must be config.lr)."""
    from torch.optim.lr_scheduler import LambdaLR

    schedule = for_config(config, world_size, steps_per_epoch)
    return LambdaLR(optimizer, lambda step: schedule(step) / config.lr)
