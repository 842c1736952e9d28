"""Model FLOPs utilization (MFU): the share of a device's peak that a training step's model flops use.

    mfu = tokens_per_s * flops_per_token / (world_size * peak_flops)

`flops_per_token` is the model's own count (`scaledl.models.gpt_flops_per_token`: 6 per
multiplying parameter, and attention's), the same with and without recomputation: the flops a
recomputed forward adds are not the model's (they would count in a "hardware" utilization).
`peak(device, precision)` is the device's dense matrix peak from PEAKS, matched by the name torch
reports; a CPU's is measured (a large matrix multiplication, `measured_peak`) and labelled so,
since no table knows a CPU's vector width, core count and clock.

PEAKS, in TFLOP/s per torch device, dense (no 2:4 sparsity), from the vendors' specifications:
- A100 SXM4: 312 bf16/fp16, 156 TF32, 19.5 fp32 (NVIDIA A100 datasheet, as nanoGPT's
  `estimate_mfu` and torchtitan's `get_peak_flops` use it).
- H100 SXM: 989 bf16, 495 TF32, 67 fp32; H100 PCIe: 756, 378, 51; H100 NVL: 835 bf16 (NVIDIA
  H100 datasheet; torchtitan `torchtitan/tools/utils.py` tells them apart by "NVL" and "PCIe" in
  the name, SXM otherwise).
- H200: 989 bf16, 495 TF32, 67 fp32 (NVIDIA H200 datasheet, 2023: H100 SXM's tensor cores).
- Intel Data Center GPU Max 1550, per torch device, which under Aurora's FLAT hierarchy is one
  tile (of two per GPU): 419 bf16, 210 TF32, 26 fp32: half of Intel's 839 / 52 for the GPU at
  1.6 GHz (Hot Chips 34, 2022).  torchtitan counts 298-341 per tile at the 1.3 GHz Intel's
  optimization guide gives under load; ALCF measured 273 bf16 GEMM per tile (user-guides, aurora
  node-performance-overview), 65% of this peak.
- AMD MI250X, per torch device (one GCD, half a module): 191.5 bf16, 47.9 fp32 (AMD's MI250X
  specification, 383 and 95.7 per module; torchtitan's 191.5 per GCD).
- AMD MI300X: 1307 bf16, 654 TF32, 163 fp32 (AMD ROCm documentation, MI300 peak performance).
fp32 on an NVIDIA GPU counts TF32's peak when torch lets matrix multiplications use it
(`torch.get_float32_matmul_precision() != "highest"`), fp32's otherwise.
"""
from __future__ import annotations

import functools
import time

# name substrings (all must be in the lower-cased device name) -> TFLOP/s by precision; first match wins.
PEAKS = [
    (("a100",), {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (("h100", "nvl"), {"bf16": 835.0, "fp16": 835.0}),
    (("h100", "pcie"), {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    (("h100",), {"bf16": 989.0, "fp16": 989.0, "tf32": 495.0, "fp32": 67.0}),
    (("h200", "nvl"), {}),  # the NVL part runs at a lower power: no checked figure, so measured
    (("h200",), {"bf16": 989.0, "fp16": 989.0, "tf32": 495.0, "fp32": 67.0}),
    (("max 1550",), {"bf16": 419.0, "fp16": 419.0, "tf32": 210.0, "fp32": 26.0}),
    (("mi250x",), {"bf16": 191.5, "fp16": 191.5, "fp32": 47.9}),
    (("mi300x",), {"bf16": 1307.0, "fp16": 1307.0, "tf32": 654.0, "fp32": 163.0}),
]


def table_peak(name: str, precision: str, tf32: bool = False) -> float | None:
    """TFLOP/s of the device called `name` (as torch reports it) at `precision`, or None when the
    table has no entry (an unknown device, or a precision its row does not give)."""
    lowered = name.lower()
    for needles, peaks in PEAKS:
        if all(needle in lowered for needle in needles):
            key = "tf32" if precision == "fp32" and tf32 and "tf32" in peaks else precision
            return peaks.get(key)
    return None


@functools.lru_cache(maxsize=8)
def measured_peak(device_type: str = "cpu", precision: str = "fp32", size: int = 1024, repeats: int = 5) -> float:
    """TFLOP/s of the best of `repeats` size x size matrix multiplications on this device: the
    peak that a CPU's MFU is against (what this process's torch threads reach, not the chip's)."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    a = torch.randn(size, size, dtype=dtype, device=device_type)
    b = torch.randn(size, size, dtype=dtype, device=device_type)
    torch.mm(a, b)  # warm-up: the first call sets up threads and caches
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best / 1e12


def peak(device, precision: str = "fp32") -> tuple[float, str]:
    """(TFLOP/s, where it comes from) for one torch device: the table's, or measured on a CPU or a
    device the table does not know."""
    import torch

    kind = getattr(device, "type", str(device))
    if kind in ("cuda", "xpu"):
        name = getattr(torch, kind).get_device_name(device)
        tf32 = torch.get_float32_matmul_precision() != "highest"
        found = table_peak(name, precision, tf32)
        if found is not None:
            return found, f"{name} ({precision}{', tf32' if tf32 and precision == 'fp32' else ''}, spec)"
        return measured_peak(kind, precision), f"{name} (measured matmul, not in scaledl.flops.PEAKS)"
    return measured_peak("cpu", precision), f"{kind} (measured {precision} matmul, {torch.get_num_threads()} threads)"


def mfu(tokens_per_s: float, flops_per_token: float, world_size: int, peak_tflops: float) -> float:
    """The share of world_size devices' peak that the model's flops use."""
    return tokens_per_s * flops_per_token / (world_size * peak_tflops * 1e12)
