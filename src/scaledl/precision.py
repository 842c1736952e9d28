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
