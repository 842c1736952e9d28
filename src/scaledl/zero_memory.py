"""ZeRO's memory arithmetic: what each rank keeps, predicted and counted.

Rajbhandari et al. (2020), "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models": with Psi parameters on N ranks, a rank keeps parameters, gradients and optimizer
states of sizes

    stage 0:  P*Psi      + G*Psi      + K*Psi        (plain data parallelism)
    stage 1:  P*Psi      + G*Psi      + K*Psi / N    (optimizer states partitioned)
    stage 2:  P*Psi      + G*Psi / N  + K*Psi / N    (and gradients)
    stage 3:  P*Psi / N  + G*Psi / N  + K*Psi / N    (and parameters)

in bytes per parameter P, G and K.  The paper's example is mixed-precision Adam: P = G = 2
(fp16) and K = 12 (an fp32 copy of the weights, momentum and variance).  Here the model is
trained in fp32 with SGD and momentum: P = G = 4, and K = 4 (momentum) at stage 0, but
DeepSpeed keeps an fp32 master copy of each rank's partition from stage 1 on, even when the
weights are already fp32, so K = 8 there.  `measure` counts the same three quantities from
a DeepSpeed engine's own tensors; the tests check the two agree at every stage.
"""
from __future__ import annotations

import math


def predict(num_params: int, world_size: int, stage: int, param_bytes: int = 4, grad_bytes: int = 4,
            optimizer_bytes: int | None = None) -> dict:
    """Bytes of parameters, gradients and optimizer states per rank (see the module docstring)."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage}")
    if optimizer_bytes is None:
        optimizer_bytes = 4 if stage == 0 else 8  # fp32 SGD momentum, plus DeepSpeed's master copy
    share = lambda partitioned: math.ceil(num_params / world_size) if partitioned else num_params  # noqa: E731
    result = {"params": param_bytes * share(stage >= 3), "grads": grad_bytes * share(stage >= 2),
              "optimizer": optimizer_bytes * share(stage >= 1)}
    result["total"] = sum(result.values())
    return result


def predict_for_engine(engine) -> dict:
    """`predict` for a DeepSpeed engine's model, world size and stage (what the tests check
    `measure` against)."""
    # Under ZeRO-3 a parameter's own tensor is emptied; ds_numel keeps its full size.
    num_params = sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters())
    return predict(num_params, engine.world_size, engine.zero_optimization_stage())


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
    if stage == 0:
        return _total({"params": _bytes(parameters), "grads": _bytes(p.grad for p in parameters),
                       "optimizer": _bytes(_state_tensors(optimizer))})
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
