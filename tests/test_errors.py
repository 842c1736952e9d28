"""A user's mistake gets one line and exit status 2, and nothing is written."""
import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("rung, args, env, message", [
    ("single_torch", ["--dataset", "mnist", "--data-dir", "{tmp}/nowhere"], {}, "MNIST file train-images-idx3-ubyte"),
    ("single_torch", ["--resume"], {}, "holds no run to resume: leave out --resume"),
    ("ddp", [], {"RANK": "0"}, "half-set torchrun environment"),
    ("single_tf", ["--dataset", "cifar10"], {"SCALEDL_DATA": ""}, "needs --data-dir"),
    ("pipeline", ["--microbatches", "5"], {}, "argument --microbatches: must divide --batch-size 64"),
    ("single_torch", ["--precision", "fp8"], {}, "argument --precision: invalid choice: 'fp8'"),
    ("single_tf", ["--epochs", "0"], {}, "--epochs must be > 0, got 0"),
    ("single_torch", ["--lr", "-1"], {}, "--lr must be > 0"),
    ("single_torch", ["--on-nonfinite", "ignore"], {}, "argument --on-nonfinite: invalid choice"),
    ("ddp", ["--backend", "foo"], {}, "unknown backend 'foo': use one of nccl"),
    ("single_torch", ["--backend", "gloo"], {}, "unrecognized arguments: --backend"),  # one device: no collectives
    ("single_torch", ["--device", "tpu"], {}, "unknown device 'tpu'"),
    ("single_torch", ["--device", "cuda"], {"CUDA_VISIBLE_DEVICES": ""}, "device 'cuda' is not available"),
    ("single_torch", ["--train-limit", "32"], {}, "fewer than one --batch-size of 64"),
    ("single_tf", ["--train-limit", "100", "--batch-size", "128"], {}, "fewer than one --batch-size of 128"),
    ("single_tf", ["--train-limit", "100", "--batch-size", "32", "--grad-accum", "4"], {},
     "fewer than one --batch-size of 32 x --grad-accum 4"),
    ("single_torch", ["--dataset", "mnist", "--data-dir", "{tmp}/garbage"], {}, "is not an unsigned-byte IDX file"),
    ("deepspeed", ["--offload-params"], {}, "argument --offload-params: needs --zero-stage 3"),
    ("deepspeed", ["--model", "gpt", "--dataset", "text", "--recompute", "selective", "--offload-activations"], {},
     "argument --offload-activations: needs --recompute full"),
    ("horovod_torch", [], {"HOROVOD_RANK": "0"}, "half-set"),
])
def test_user_errors_are_one_line(tmp_path, rung, args, env, message):
    out_dir = tmp_path / "out"
    (tmp_path / "garbage").mkdir()
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (tmp_path / "garbage" / name).write_bytes(b"not an IDX file")
    command = [sys.executable, "-m", f"scaledl.ladder.{rung}", "--out-dir", str(out_dir),
               *[a.format(tmp=tmp_path) for a in args]]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env}, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if "error:" in line or "Traceback" in line]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert lines[0].startswith(f"scaledl.ladder.{rung}: error:") or lines[0].startswith("python -m scaledl.ladder")
    assert not out_dir.exists()


@pytest.mark.parametrize("nccl_says", [
    "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 6000",  # NCCL up to 2.29 (init.cc)
    "Multiple ranks detected using the same GPU on this node. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to allow it.",  # 2.30.3
    "Multiple Ranks are using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.",
])
def test_two_ranks_on_one_gpu_is_the_users_launch(nccl_says):
    """What PyTorch raises when NCCL refuses two ranks on one GPU (its message ends with NCCL's last error);
    the gpu tier starts the real thing (test_gpu.py::test_ranks_that_share_a_gpu_get_one_line)."""
    from scaledl import errors

    raised = RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1, invalid usage (run with NCCL_DEBUG=WARN for "
                          f"details), NCCL version 2.28.9\nncclInvalidUsage: This usually reflects invalid usage of "
                          f"NCCL library.\nLast error:\n{nccl_says}")
    mapped = errors.as_user_error(raised)
    assert mapped is not None and "two ranks share one GPU" in str(mapped) and "--nproc_per_node" in str(mapped)
    assert errors.as_user_error(RuntimeError("NCCL error: unhandled system error")) is None


# A command whose error is being handled when the launcher's SIGTERM comes: str(error), which the
# handler needs for the error's line, sends it (horovodrun stops every rank the moment one fails).
SIGNAL_WHILE_HANDLING = """
import os, signal, sys
from scaledl.errors import {error}
from scaledl.exits import exits_cleanly

class Failure({error}):
    def __str__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        return "the rank's own error"

@exits_cleanly
def main(argv=None):
    raise Failure()

sys.exit(main())
"""


# The launcher's SIGTERM while the command is still setting up its handling: the handler is in
# place and the watcher process is starting (a fork and an exec, slow on a busy machine).
SIGNAL_WHILE_INSTALLING = """
import os, signal, sys
from scaledl import signals
from scaledl.exits import exits_cleanly

start_watcher = signals._start_watcher

def signalled_then_start(*args):
    os.kill(os.getpid(), signal.SIGTERM)
    return start_watcher(*args)

signals._start_watcher = signalled_then_start

@exits_cleanly
def main(argv=None):
    return 0

sys.exit(main())
"""


def test_a_signal_while_the_handler_is_installed_is_the_one_line_never_a_traceback(tmp_path):
    script = tmp_path / "command.py"
    script.write_text(SIGNAL_WHILE_INSTALLING)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PBS_", "SLURM_", "PMI_", "OMPI_COMM"))}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 128 + 15, result.stderr
    assert result.stderr.splitlines() == [f"{script}: stopped by SIGTERM"], result.stderr


@pytest.mark.parametrize("error", ["UserError", "RunError"])
def test_a_signal_while_an_error_is_handled_is_the_one_line_never_a_traceback(tmp_path, error):
    script = tmp_path / "command.py"
    script.write_text(SIGNAL_WHILE_HANDLING.format(error=error))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PBS_", "SLURM_", "PMI_", "OMPI_COMM"))}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 128 + 15, result.stderr
    assert result.stderr.splitlines() == [f"{script}: stopped by SIGTERM"], result.stderr
