"""ZeRO's memory arithmetic: what each rank keeps, predicted and counted.

Rajbhandari et al. (2020), "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models": with Psi parameters on N ranks, a rank keeps parameters, gradients and optimizer
states of sizes

    stage 0:  P*Psi      + G*Psi      + K*Psi        (plain data parallelism)
    stage 1:  P*Psi      + G*Psi      + K*Psi / N    (optimizer states partitioned)
    stage 2:  P*Psi      + G*Psi / N  + K*Psi / N    (and gradients)
    stage 3:  P*Psi / N  + G*Psi / N  + K*Psi / N    (and parameters)

in bytes per parameter P, G and K.  The paper's example is mixed-precision Adam: P = G = 2
(fp16) and K = 12 (an fp32 copy of the weights, momentum and variance).  The rungs train
with SGD and momentum (4 bytes of state a parameter, fp32), so `bytes_per_param` gives:

    --precision  stage 0     stages 1-3
    fp32         4, 4, 4     4, 4, 8     DeepSpeed keeps an fp32 master copy of each rank's
                                         partition from stage 1 on, even of fp32 weights
    bf16, fp16   2, 2, 8     2, 2, 8     16-bit weights and gradients; the fp32 master copy
                                         (4) and the momentum (4) are the optimizer's

So mixed precision saves no state at stage 0: 12 bytes a parameter either way, the master copy
costing what the halved weights and gradients saved (with Adam, 2 + 2 + 12 against 4 + 4 + 8:
16 either way).  From stage 1 on, where fp32 pays for a master copy too, it saves: per rank
8 + 8/N against 4 + 8/N at stage 1, 4 + 12/N against 2 + 10/N at stage 2, 16/N against 12/N at
stage 3.  What it does halve is the activations (`scaledl.activations`) and every byte sent.

During the optimizer step at stage 0 DeepSpeed also holds fp32 copies of every gradient, made
before the step and freed after it (runtime/fp16/unfused_optimizer.py, `step`): 16 bytes a
parameter at that moment, not counted here.  `measure` counts the same three quantities from a
DeepSpeed engine's own tensors; the tests check the two agree at every stage in fp32 and bf16
(DeepSpeed offers no fp16 on this machine's CPU).  At stage 3 DeepSpeed means to reuse fp32 weights
as their own master partitions, but its check compares a torch.device with a string and so copies
them (runtime/zero/stage3.py, 0.19.8): the copy is there, and counted.

FSDP2 (`predict_fsdp`) keeps its sharded parameters in fp32 under any --precision: they are
the master copy.  `MixedPrecisionPolicy(param_dtype=bf16)` only makes the all-gathered copy
(one layer at a time) 16-bit, and `reduce_dtype=fp32` reduce-scatters into fp32 gradient
shards: (4 + 4 + 4) / N bytes a parameter, with or without bf16.  With --grad-accum FSDP2
keeps each micro batch's unsharded gradients, in fp32, until the step's last micro batch
reduce-scatters them (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, `unsharded_accumulated_grad`):
4 bytes a parameter more between micro batches.
"""
from __future__ import annotations

import math


def bytes_per_param(precision: str = "fp32", stage: int = 0, optimizer_state_bytes: int = 4) -> tuple[int, int, int]:
    """(P, G, K): bytes a parameter of weights, gradients and optimizer states as DeepSpeed keeps them
    at a ZeRO stage, before partitioning (see the module docstring).  `optimizer_state_bytes`: the
    torch optimizer's own fp32 state, 4 for SGD with momentum, 8 for Adam."""
    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"precision must be fp32, bf16 or fp16, got {precision!r}")
    if precision == "fp32":
        return 4, 4, optimizer_state_bytes + (4 if stage >= 1 else 0)
    return 2, 2, 4 + optimizer_state_bytes  # the fp32 master copy at every stage


def predict(num_params: int, world_size: int, stage: int, param_bytes: int | None = None,
            grad_bytes: int | None = None, optimizer_bytes: int | None = None, precision: str = "fp32") -> dict:
    """Bytes of parameters, gradients and optimizer states per rank (see the module docstring); the
    bytes a parameter default to `bytes_per_param(precision, stage)`."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage}")
    default = bytes_per_param(precision, stage)
    param_bytes = default[0] if param_bytes is None else param_bytes
    grad_bytes = default[1] if grad_bytes is None else grad_bytes
    optimizer_bytes = default[2] if optimizer_bytes is None else optimizer_bytes
    share = lambda partitioned: math.ceil(num_params / world_size) if partitioned else num_params  # noqa: E731
    result = {"params": param_bytes * share(stage >= 3), "grads": grad_bytes * share(stage >= 2),
              "optimizer": optimizer_bytes * share(stage >= 1)}
    result["total"] = sum(result.values())
    return result


def predict_fsdp(num_params: int, world_size: int, optimizer_state_bytes: int = 4) -> dict:
    """FSDP2's bytes per rank: fp32 shards of weights, gradients and optimizer states under any
    --precision (the sharded weights are the master copy; see the module docstring)."""
    return predict(num_params, world_size, 3, 4, 4, optimizer_state_bytes)


def predict_for_engine(engine) -> dict:
    """`predict` for a DeepSpeed engine's model, world size and stage (what the tests check
    `measure` against)."""
    # Under ZeRO-3 a parameter's own tensor is emptied; ds_numel keeps its full size.
    num_params = sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters())
    precision = "bf16" if engine.bfloat16_enabled() else "fp16" if engine.fp16_enabled() else "fp32"
    return predict(num_params, engine.world_size, engine.zero_optimization_stage(), precision=precision)


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _state_tensors(torch_optimizer):
    import torch

    return [value for state in torch_optimizer.state.values() for value in state.values()
            if isinstance(value, torch.Tensor) and value.dim() > 0]


def measure(engine) -> dict:
    """Bytes this rank holds, counted from a DeepSpeed engine's tensors.

    Call it after `engine.backward()` and before `engine.step()` once the optimizer has
    stepped at least once (so that gradients and optimizer states both exist)."""
    stage = engine.zero_optimization_stage()
    optimizer = engine.optimizer
    parameters = list(engine.module.parameters())
    if stage == 0 and type(optimizer).__name__ == "BF16_Optimizer":
        # DeepSpeed's bf16 wrapper for pipeline modules (engine.py, _configure_optimizer): its master copy and
        # gradients live in flat partitions (fp32_groups_flat_partition, fp32_groups_gradients_flat), p.grad None.
        raise ValueError("zero_memory.measure counts the optimizers the DeepSpeed rung gets, not BF16_Optimizer's "
                         "flat partitions")
    if stage == 0:
        # Under bf16 or fp16 the engine's optimizer wraps the torch one and keeps the fp32 master
        # weights beside it (FP16_UnfusedOptimizer.fp32_groups; the fused one's fp32_groups_flat).
        master = getattr(optimizer, "fp32_groups_flat", None) or getattr(optimizer, "fp32_groups", None) or []
        master = [t for group in master for t in (group if isinstance(group, (list, tuple)) else [group])]
        return _total({"params": _bytes(parameters), "grads": _bytes(p.grad for p in parameters),
                       "optimizer": _bytes(master) + _bytes(_state_tensors(optimizer))})
    if stage in (1, 2):
        # After backward both keep only this rank's reduced partition of the gradients.  They
        # differ during backward: stage 2 reduces bucket by bucket as gradients appear, stage 1
        # holds every full gradient until the end of backward, so its peak is the paper's G*Psi.
        grads = _bytes(t for group in optimizer.averaged_gradients.values() if group for t in group)
        return _total({"params": _bytes(parameters), "grads": grads,
                       "optimizer": _bytes(optimizer.single_partition_of_fp32_groups)
                       + _bytes(_state_tensors(optimizer.optimizer))})
    return _total({"params": _bytes(p.ds_tensor for p in parameters),
                   "grads": _bytes([optimizer.grad_partitions_flat_buffer]),
                   "optimizer": _bytes(optimizer.fp32_partitioned_groups_flat)
                   + _bytes(_state_tensors(optimizer.optimizer))})


def _total(counts: dict) -> dict:
    return {**counts, "total": sum(counts.values())}
