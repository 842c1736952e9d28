import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import PROBES, run
from mounts import tmpfs
from scaledl import checkpoint
from scaledl.hpc import launchers
from scaledl.checkpoint import CheckpointError, DiskFullError

RUNG = [sys.executable, "-m", "scaledl.ladder.single_torch", "--epochs", "2", "--train-limit", "1280",
        "--batch-size", "32", "--log-interval", "5"]


def small_model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


def test_save_and_load_round_trip(tmp_path):
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    torch.manual_seed(123)
    path = checkpoint.save(tmp_path / "c.pt", model=model, optimizer=optimizer, epoch=1, step=7)
    expected_draw = torch.rand(3)
    other = torch.nn.Linear(4, 2)
    other_optimizer = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    state = checkpoint.load(path, model=other, optimizer=other_optimizer)
    assert (state["epoch"], state["step"]) == (1, 7)
    assert torch.equal(other.weight, model.weight)
    assert other_optimizer.state_dict()["state"][0]["momentum_buffer"].equal(
        optimizer.state_dict()["state"][0]["momentum_buffer"])
    assert torch.equal(torch.rand(3), expected_draw)  # RNG restored to the moment of saving
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary file left behind


def test_non_main_rank_writes_nothing(tmp_path):
    assert checkpoint.save(tmp_path / "c.pt", model=small_model(), is_main=False) is None
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_checkpoint_is_a_clear_error(tmp_path, damage):
    path = checkpoint.save(tmp_path / "c.pt", model=small_model())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"not a checkpoint" * 10)
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        checkpoint.load(path, model=small_model())


def test_missing_checkpoint_says_how_to_start_fresh(tmp_path):
    with pytest.raises(CheckpointError, match="run without --resume"):
        checkpoint.load(tmp_path / "nothing.pt")


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_parameters(tmp_path):
    run(RUNG + ["--out-dir", str(tmp_path / "whole")], nproc=1)
    interrupted = tmp_path / "interrupted"
    process = subprocess.Popen(RUNG + ["--out-dir", str(interrupted), "--checkpoint-every", "7"],
                               env=launchers.local_env(1), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (interrupted / "checkpoint.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = torch.load(interrupted / "checkpoint.pt", weights_only=True)["step"]
    run(RUNG + ["--out-dir", str(interrupted), "--checkpoint-every", "7", "--resume"], nproc=1)
    whole = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)
    resumed = torch.load(interrupted / "checkpoint.pt", weights_only=True)
    assert killed_at < resumed["step"] == whole["step"] == 80
    for name, tensor in whole["model"].items():
        assert torch.equal(tensor, resumed["model"][name]), name


@pytest.mark.slow
def test_a_kill_during_a_write_leaves_the_previous_checkpoint_whole(tmp_path):
    path = tmp_path / "checkpoint.pt"
    caught_mid_write = 0
    # Kills land at different points of the writes; keep going (up to 24) until at least 3 of them
    # caught a write half done, since on a loaded machine some land between writes.
    for attempt in range(24):
        if attempt >= 6 and caught_mid_write >= 3:
            break
        writer = subprocess.Popen([sys.executable, str(PROBES / "checkpoint_writer.py"), str(path)],
                                  stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline().startswith("saved")  # one whole checkpoint exists
        time.sleep(0.05 * (attempt % 6))  # land at different points of the next writes
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        caught_mid_write += any(tmp_path.glob(".checkpoint.pt.*.tmp"))
        state = checkpoint.load(path, restore_rng=False)
        values = {float(tensor[0]) for tensor in state["model"].values()}
        assert values == {float(state["step"])}, values  # all from one checkpoint
        assert all(torch.all(t == state["step"]) for t in state["model"].values())
    # The kills really interrupted writes (a partial file was left behind) most of the time.
    assert caught_mid_write >= 3
    checkpoint.save(path, model={"w": torch.zeros(1)})
    assert not any(tmp_path.glob(".checkpoint.pt.*.tmp"))  # the next save clears what a killed writer left


def test_a_full_disk_is_one_clear_error_and_leaves_no_partial_file(tmp_path):
    with tmpfs(tmp_path / "small", "256k") as folder:
        path = folder / "checkpoint.pt"
        checkpoint.save(path, model={"w": torch.ones(1000)}, step=1)
        with pytest.raises(DiskFullError) as caught:
            checkpoint.save(path, model={"w": torch.ones(100_000)}, step=2)  # about 400 KiB
        message = str(caught.value)
        assert f"no space left to write checkpoint {path}" in message and "KiB free" in message, message
        assert isinstance(caught.value, CheckpointError)  # a user error: one line, exit status 2
        assert sorted(p.name for p in folder.iterdir()) == ["checkpoint.pt"]  # no partial file keeps the disk full
        assert checkpoint.load(path, restore_rng=False)["step"] == 1  # the previous checkpoint is whole
        checkpoint.save(path, model={"w": torch.ones(1000)}, step=3)  # and the space is there to write again


def test_a_full_disk_ends_the_writing_command_with_one_line(tmp_path):
    # The writer probe saves ~40 MB checkpoints in a loop: the first one cannot fit.
    with tmpfs(tmp_path / "small", "8m") as folder:
        code = ("import sys, torch\n"
                "from scaledl import checkpoint\n"
                "from scaledl.exits import exits_cleanly\n"
                "@exits_cleanly\n"
                "def main(argv=None):\n"
                "    checkpoint.save(sys.argv[1], model={'w': torch.ones(10_000_000)})\n"
                "sys.exit(main())\n")
        result = subprocess.run([sys.executable, "-c", code, str(folder / "checkpoint.pt")], capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "error: no space left to write checkpoint" in lines[0], result.stderr
        assert not list(folder.iterdir())
