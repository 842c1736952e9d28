"""`scaledl demo`: the README's first command, shortened: one row per rung, none failed."""
import json
import subprocess

import pytest

from conftest import tool
from scaledl.hpc import launchers
from scaledl.ladder import RUNGS


@pytest.mark.slow
def test_demo_runs_every_rung(tmp_path):
    result = subprocess.run([tool("scaledl"), "demo", "--out-dir", str(tmp_path), "--epochs", "1",
                             "--train-limit", "4096", "--log-interval", "4"],
                            capture_output=True, text=True, timeout=1800, env=launchers.local_env(2))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads((tmp_path / "demo.json").read_text())
    assert [row["rung"] for row in rows] == list(RUNGS)
    assert all(row["ok"] for row in rows)
    for row in rows:
        assert row["samples_per_s"] > 0 and 0.5 < row["test_accuracy"] <= 1
        assert row["world_size"] == (1 if RUNGS[row["rung"]][1] == "python" else 4 if row["rung"] == "fsdp_tp" else 2)
        assert row["rung"] in result.stdout
    state = {row["rung"]: row["state_bytes_per_rank"] for row in rows}
    # In fp32 on 2 ranks ZeRO-1 saves nothing: DeepSpeed's fp32 master copy of the partition
    # costs what partitioning the momentum saves. Stages 2 and 3 each save more.
    assert state["zero1"] == state["deepspeed"] and state["zero2"] < state["zero1"] and state["zero3"] < state["zero2"]
    assert state["fsdp"] < state["ddp"]
    assert state["fsdp_tp"] < state["tensor_parallel"]  # the 2 x 2 mesh shards the split layers once more
    assert (tmp_path / "demo.png").stat().st_size > 5000


@pytest.mark.slow
def test_the_demo_shows_a_language_models_tokens_and_mfu(tmp_path):
    result = subprocess.run([tool("scaledl"), "demo", "--rungs", "single_torch", "ddp", "--out-dir", str(tmp_path),
                             "--model", "gpt", "--width", "32", "--depth", "1", "--heads", "2", "--seq-len", "32",
                             "--max-steps", "6", "--log-interval", "2"],
                            capture_output=True, text=True, timeout=600, env=launchers.local_env(2))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads((tmp_path / "demo.json").read_text())
    for row in rows:
        # the rows round samples_per_s to 0.1; tokens_per_s comes from the unrounded rate
        assert row["tokens_per_s"] == pytest.approx(32 * row["samples_per_s"], abs=32 * 0.05 + 0.05)
        assert 0 < row["mfu"] < 1.5
    header = next(line for line in result.stdout.splitlines() if line.startswith("rung "))
    assert "tokens_per_s" in header and "mfu" in header


def test_unknown_rung_is_a_one_line_error(tmp_path):
    result = subprocess.run([tool("scaledl"), "demo", "--rungs", "nope", "--out-dir", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "unknown rung nope" in result.stderr
    assert not list(tmp_path.iterdir())
