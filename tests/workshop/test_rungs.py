"""scaledl.workshop.rungs: a rung run once from a lesson, its launch faked (the rungs' own tests run them)."""
import json
import subprocess
from pathlib import Path

import pytest

from scaledl.workshop import rungs


def fake_run(returncode=0, stdout="step 1\nsummary rung=tensor_parallel world_size=2\n", stderr=""):
    calls = []

    def run(command, **kwargs):
        calls.append((command, kwargs))
        out_dir = Path(command[command.index("--out-dir") + 1])
        (out_dir / "summary.json").write_text(json.dumps({"state_bytes_per_rank": 834936}))
        return subprocess.CompletedProcess(command, returncode, stdout, stderr)
    return run, calls


def test_run_launches_the_module_with_torchrun_and_reads_its_summary(monkeypatch):
    run, calls = fake_run()
    monkeypatch.setattr(rungs.subprocess, "run", run)
    line, summary, out_dir = rungs.run("scaledl.ladder.tensor_parallel", 2, ["--epochs", "1"])
    assert line == "summary rung=tensor_parallel world_size=2"
    assert summary == {"state_bytes_per_rank": 834936}
    assert out_dir.name.startswith("tensor_parallel-")
    command, kwargs = calls[0]
    assert "scaledl.ladder.tensor_parallel" in command and "--epochs" in command
    assert kwargs["env"] is not None and kwargs["capture_output"]


def test_a_failed_rung_raises_with_its_error(monkeypatch):
    run, _ = fake_run(returncode=1, stderr="RuntimeError: no such flag")
    monkeypatch.setattr(rungs.subprocess, "run", run)
    with pytest.raises(RuntimeError, match="no such flag"):
        rungs.run("scaledl.ladder.fsdp_tp", 4)
    run, _ = fake_run(stdout="step 1\n")
    monkeypatch.setattr(rungs.subprocess, "run", run)
    with pytest.raises(RuntimeError, match="no summary line"):
        rungs.run("scaledl.ladder.fsdp_tp", 4)
