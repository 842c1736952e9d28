"""A user's mistake gets one line and exit status 2, and nothing is written."""
import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("rung, args, env, message", [
    ("single_torch", ["--dataset", "mnist", "--data-dir", "{tmp}/nowhere"], {}, "MNIST file train-images-idx3-ubyte"),
    ("single_torch", ["--resume"], {}, "no checkpoint at"),
    ("ddp", [], {"RANK": "0"}, "half-set torchrun environment"),
    ("single_tf", ["--dataset", "cifar10"], {"SCALEDL_DATA": ""}, "needs --data-dir"),
    ("pipeline", ["--microbatches", "5"], {}, "argument --microbatches: must divide --batch-size 64"),
])
def test_user_errors_are_one_line(tmp_path, rung, args, env, message):
    out_dir = tmp_path / "out"
    command = [sys.executable, "-m", f"scaledl.ladder.{rung}", "--out-dir", str(out_dir),
               *[a.format(tmp=tmp_path) for a in args]]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env}, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if "error:" in line or "Traceback" in line]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert lines[0].startswith(f"scaledl.ladder.{rung}: error:") or lines[0].startswith("python -m scaledl.ladder")
    assert not out_dir.exists()
