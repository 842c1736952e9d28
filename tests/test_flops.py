"""MFU's denominator: the peak table matched by the names torch reports, and a CPU's measured peak."""
import pytest

from scaledl import flops


@pytest.mark.parametrize("name, precision, tf32, expected", [
    ("NVIDIA A100-SXM4-40GB", "bf16", False, 312.0),  # Polaris
    ("NVIDIA A100-SXM4-40GB", "fp32", True, 156.0),
    ("NVIDIA A100-SXM4-40GB", "fp32", False, 19.5),
    ("NVIDIA H100 80GB HBM3", "bf16", False, 989.0),  # the SXM part's name has no "SXM"
    ("NVIDIA H100 PCIe", "bf16", False, 756.0),
    ("NVIDIA H100 NVL", "bf16", False, 835.0),
    ("NVIDIA H100 NVL", "fp32", False, None),  # not in the row: measured instead
    ("NVIDIA H200", "bf16", False, 989.0),
    ("Intel(R) Data Center GPU Max 1550", "bf16", False, 419.0),  # Aurora, one tile
    ("AMD Instinct MI250X", "bf16", False, 191.5),
    ("NVIDIA GeForce RTX 4090", "bf16", False, None),
])
def test_the_table_matches_devices_by_the_names_torch_reports(name, precision, tf32, expected):
    assert flops.table_peak(name, precision, tf32) == expected


def test_a_cpu_peak_is_measured_and_labelled():
    import torch

    tflops, source = flops.peak(torch.device("cpu"), "fp32")
    assert 0.001 < tflops < 100 and "measured fp32 matmul" in source


def test_mfu_is_the_share_of_the_ranks_peak():
    # 1e5 tokens/s at 1e9 flops a token on 4 devices of 100 TFLOP/s: 1e14 / 4e14
    assert flops.mfu(1e5, 1e9, 4, 100.0) == pytest.approx(0.25)
