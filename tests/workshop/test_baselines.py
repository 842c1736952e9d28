import json
import os
import subprocess
import sys

import pytest

from scaledl.workshop import baselines


@pytest.mark.parametrize("speedup, expected", [
    (1.9, "close to the ideal"),
    (1.61, "faster than one rank, short of the ideal"),
    (1.07, "within 20% of one rank, the spread of reruns: no speed-up measured"),
    (0.82, "within 20% of one rank, the spread of reruns: no speed-up measured"),
    (0.6, "slower than one rank, beyond the spread of reruns"),
])
def test_every_lesson_words_a_speed_up_by_the_same_bands(speedup, expected):
    assert baselines.speedup_verdict(speedup, 2) == expected


def test_a_measured_spread_moves_the_bands():
    assert baselines.speedup_verdict(1.15, 2, spread=0.1).startswith("faster")
    assert baselines.speedup_verdict(1.15, 2, spread=0.2).startswith("within 20%")


def test_every_framework_gets_the_thread_count():
    env = baselines.thread_env({"PATH": "x", "OMP_NUM_THREADS": "8"}, 1)
    assert (env["OMP_NUM_THREADS"], env["TF_NUM_INTRAOP_THREADS"], env["TF_NUM_INTEROP_THREADS"]) == ("1", "1", "1")
    assert env["PATH"] == "x"


def test_a_pinned_command_runs_on_the_cores_it_names():
    if not baselines.shutil.which("taskset"):
        pytest.skip("no taskset on this system: the command runs unpinned")
    code = "import json, os; print(json.dumps(sorted(os.sched_getaffinity(0))))"
    result = subprocess.run(baselines.pinned([sys.executable, "-c", code], 1), capture_output=True, text=True)
    assert json.loads(result.stdout) == [0]
    if len(os.sched_getaffinity(0)) > 1:  # a second core to pin to
        result = subprocess.run(baselines.pinned([sys.executable, "-c", code], 1, first=1), capture_output=True,
                                text=True)
        assert json.loads(result.stdout) == [1]


def test_without_taskset_the_command_is_unchanged(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a system with no taskset on its PATH (macOS has none)
    assert baselines.pinned(["python", "-c", "pass"], 1) == ["python", "-c", "pass"]


def test_a_failed_rung_raises_with_its_error_lines():
    with pytest.raises(RuntimeError, match="failed"):
        baselines.one_rank_samples_per_s("scaledl.ladder.single_torch", ["--epochs", "0"])


def test_a_rung_alone_runs_through_its_launcher_on_one_rank(tmp_path):
    from scaledl.hpc import launchers
    flags = ["--epochs", "1", "--train-limit", "256", "--log-interval", "2", "--out-dir", str(tmp_path)]
    command = launchers.torchrun(1, "scaledl.ladder.ddp", flags)
    rate = baselines.alone_samples_per_s(command, launchers.local_env(1), str(tmp_path))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world_size"] == 1 and rate == summary["samples_per_s"] > 0


def test_side_by_side_runs_each_write_their_own_rate():
    rates = baselines.side_by_side_samples_per_s("scaledl.ladder.single_torch",
                                                 ["--epochs", "1", "--train-limit", "256", "--log-interval", "2"])
    assert len(rates) == 2 and all(rate > 0 for rate in rates)


def test_a_failed_side_by_side_run_raises():
    with pytest.raises(RuntimeError, match="failed beside"):
        baselines.side_by_side_samples_per_s("scaledl.ladder.single_torch", ["--epochs", "0"])
