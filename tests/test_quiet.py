"""Library noise stays out of a kernel's outputs: a real process whose sys.stderr is not file
descriptor 2, as in a Jupyter or ipyparallel kernel, probes DeepSpeed's ops with and without
`scaledl.quiet.deepspeed()`."""
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

# Like ipykernel's OutStream: sys.stderr writes to a copy of descriptor 2, and fileno() names the copy.
PROBE = """
import os, sys
sys.stderr = os.fdopen(os.dup(2), "w")
import deepspeed.ops
if {quiet}:
    from scaledl import quiet
    quiet.deepspeed()
compatible = deepspeed.ops.__compatible_ops__
print("probed", len(compatible) > 0, "async_io" in compatible)
"""


def probe(quiet: bool) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE.format(quiet=quiet)], capture_output=True, text=True,
                          env={"DS_ACCELERATOR": "cpu", "PATH": "/usr/bin:/bin"}, timeout=300)


def test_deepspeeds_op_probe_writes_nothing_to_descriptor_2():
    quiet = probe(True)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert "probed True True" in quiet.stdout  # the probe ran, and its result is what DeepSpeed reads later
    assert "cannot find" not in quiet.stderr and "collect2" not in quiet.stderr, quiet.stderr
    # Without libaio's development library the same probe, unquieted, prints the linker's error:
    # the test reproduces what it removes.
    if not any(Path(folder, "libaio.so").exists() for folder in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64",
                                                                 "/usr/lib", "/usr/lib/aarch64-linux-gnu")):
        assert "cannot find -laio" in probe(False).stderr


def test_deprecated_collective_warnings_from_deepspeed_are_filtered_and_others_are_not():
    code = """
import warnings
from scaledl import quiet
quiet.deepspeed()
warnings.warn("`torch.distributed.all_gather_into_tensor` is deprecated. Use x.", FutureWarning)
warnings.warn("`torch.distributed.reduce_scatter_tensor` is deprecated. Use y.", FutureWarning)
warnings.warn("something else is deprecated", FutureWarning)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={"DS_ACCELERATOR": "cpu", "PATH": "/usr/bin:/bin"}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "all_gather_into_tensor" not in result.stderr and "reduce_scatter_tensor" not in result.stderr
    assert "something else is deprecated" in result.stderr


def test_the_untested_optimizer_warning_and_the_built_line_are_dropped_and_nothing_else():
    code = """
import logging
from scaledl import quiet
quiet.deepspeed()
import importlib
ds_torch = importlib.import_module("deepspeed.comm.torch")  # deepspeed.comm.torch the attribute is torch
from deepspeed.utils import logger
logger.warning("**** You are using ZeRO with an untested optimizer, proceed with caution *****")
logger.warning("another DeepSpeed warning")
op = ds_torch.build_shm_op()  # the real build of DeepSpeed's shared-memory op on a CPU
print("built", op is not None)
quiet.deepspeed()  # a second call wraps nothing twice
def build():
    print("DeepSpeed deepspeed.ops.comm.x_op built successfully")
    print("compiler says something")
    return 7
print("returned", quiet._without_built_line(build)())
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={"DS_ACCELERATOR": "cpu", "PATH": "/usr/bin:/bin"}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    whole = result.stdout + result.stderr
    assert "untested optimizer" not in whole and "another DeepSpeed warning" in whole
    assert "built successfully" not in whole
    assert "built True" in result.stdout  # the op was built: its line was there to drop
    assert "compiler says something\nreturned 7" in result.stdout


def test_a_cpu_device_tells_deepspeed_its_accelerator_before_it_guesses():
    """On a machine without a GPU, DeepSpeed imported with no DS_ACCELERATOR guesses the CPU and logs
    "Setting accelerator to CPU"; `quiet.deepspeed("cpu")` first sets DS_ACCELERATOR=cpu, and no guess is logged.
    A GPU device, or a DS_ACCELERATOR already set, is left as it is."""
    code = """
import os
from scaledl import quiet
quiet.deepspeed({device!r})
import deepspeed
print("accelerator", os.environ.get("DS_ACCELERATOR"))
"""
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-c", code.format(device="cpu")], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "accelerator cpu" in result.stdout
    assert "Setting accelerator to CPU" not in result.stdout + result.stderr
    result = subprocess.run([sys.executable, "-c", code.format(device="cuda:0")], capture_output=True, text=True,
                            env={**env, "DS_ACCELERATOR": "cuda"}, timeout=300)
    assert "accelerator cuda" in result.stdout
