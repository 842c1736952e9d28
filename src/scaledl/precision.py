"""--precision for PyTorch: autocast for bf16/fp16, and loss scaling where fp16 needs it.

fp16 has 5 exponent bits: small gradients underflow to zero, so the loss is multiplied by a
large factor before backward and the gradients divided by it before the step (GradScaler).
bf16 has fp32's exponent range and needs no scaling.
"""
from __future__ import annotations

import contextlib


def torch_dtype(precision: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def autocast(device, precision: str):
    import torch

    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch_dtype(precision))


def grad_scaler(device, precision: str):
    """A GradScaler that is a no-op unless precision is fp16."""
    import torch

    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def fsdp_policy(precision: str):
    """FSDP2's mixed precision for --precision: each layer's weights are all-gathered and computed on
    in bf16 or fp16 (half the bytes sent and held of fp32's), gradients reduce-scattered in fp32 into
    fp32 shards, and the sharded fp32 weights are the master copy the optimizer updates.  Autocast
    alone would gather fp32 weights and cast them again inside every layer (torchtitan's FSDP
    path uses this policy, and no autocast: torchtitan/models/llama3/infra/parallelize.py).  The
    rungs keep their autocast around the forward as well, so that the norms, the softmax and the
    loss run in fp32 as on every other rung."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "fp32":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch_dtype(precision), reduce_dtype=torch.float32)
