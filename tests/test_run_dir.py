"""A run writes only into its --out-dir, and never over another run unless asked."""
import json
import os
import subprocess
import sys

import pytest

from scaledl import run_dir
from scaledl.run_dir import OutDirError

RUNG = [sys.executable, "-m", "scaledl.ladder.single_torch", "--epochs", "1", "--train-limit", "640"]


def train(out_dir, *args, cwd=None):
    return subprocess.run([*RUNG, "--out-dir", str(out_dir), *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_an_empty_or_missing_directory_is_free(tmp_path):
    assert run_dir.claim(tmp_path / "new", resume=False, overwrite=False, is_main=True) is False
    assert run_dir.claim(tmp_path, resume=False, overwrite=False, is_main=True) is False


def test_a_directory_with_a_run_is_refused_unless_resumed_or_overwritten(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutDirError, match="already holds a run: pass --resume .* --overwrite"):
        run_dir.claim(tmp_path, resume=False, overwrite=False, is_main=True)
    assert run_dir.claim(tmp_path, resume=True, overwrite=False, is_main=True) is True
    assert (tmp_path / "metrics.jsonl").exists()
    run_dir.claim(tmp_path, resume=False, overwrite=True, is_main=True)
    assert not (tmp_path / "metrics.jsonl").exists() and (tmp_path / "notes.txt").read_text() == "mine"


def test_only_the_main_rank_judges_and_a_torchrun_restart_recovers(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "notes.txt").write_text("mine")
    assert run_dir.claim(tmp_path, resume=False, overwrite=False, is_main=False) is False
    restart = {"TORCHELASTIC_RESTART_COUNT": "1"}
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    assert run_dir.claim(tmp_path, resume=False, overwrite=False, is_main=True, env=restart) is True
    (tmp_path / "checkpoint.pt").unlink()
    # Died before its first checkpoint: the restart starts the run again over the failed attempt's files.
    assert run_dir.claim(tmp_path, resume=False, overwrite=False, is_main=True, env=restart) is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_an_out_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutDirError, match="is a file"):
        run_dir.claim(tmp_path / "file", resume=False, overwrite=False, is_main=True)


@pytest.mark.slow
def test_a_second_run_into_the_same_directory_changes_nothing(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    first = train("out", cwd=work)
    assert first.returncode == 0, first.stderr
    assert sorted(os.listdir(work)) == ["out"]  # nothing written beside the output directory
    before = {path.name: path.read_bytes() for path in (work / "out").iterdir()}
    second = train("out", cwd=work)
    assert second.returncode == 2 and "error: --out-dir out already holds a run" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    assert {path.name: path.read_bytes() for path in (work / "out").iterdir()} == before
    third = train("out", "--overwrite", "--seed", "1", cwd=work)
    assert third.returncode == 0, third.stderr
    config = json.loads((work / "out" / "metrics.jsonl").read_text().splitlines()[0])["config"]
    assert config["seed"] == 1 and config["overwrite"] is True
