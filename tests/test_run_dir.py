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
    # No checkpoint: --resume would be refused, so the advice leaves it out.
    with pytest.raises(OutDirError, match="already holds a run: pass --overwrite to replace it, or name another"):
        run_dir.claim(tmp_path, resume=False, overwrite=False, is_main=True)
    with pytest.raises(OutDirError, match="holds a run but no checkpoint .* start it over with --overwrite"):
        run_dir.claim(tmp_path, resume=True, overwrite=False, is_main=True)
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    with pytest.raises(OutDirError, match="already holds a run: pass --resume to continue it, --overwrite to"):
        run_dir.claim(tmp_path, resume=False, overwrite=False, is_main=True)
    assert run_dir.claim(tmp_path, resume=True, overwrite=False, is_main=True) is True
    assert (tmp_path / "metrics.jsonl").exists()
    with pytest.raises(OutDirError, match="pass one of them"):
        run_dir.claim(tmp_path, resume=True, overwrite=True, is_main=True)
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


def test_resume_needs_a_run_on_every_rank(tmp_path):
    for is_main in (True, False):
        with pytest.raises(OutDirError, match="holds no run to resume: leave out --resume"):
            run_dir.claim(tmp_path / "new", resume=True, overwrite=False, is_main=is_main)
    assert not (tmp_path / "new").exists()


def test_every_rank_stops_with_the_main_ranks_verdict(tmp_path):
    # What an all-gather gives each rank: the main rank's refusal, and None from the others.
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    verdicts = []

    def share(mine):
        verdicts.append(mine)
        return [verdicts[0], None]

    with pytest.raises(OutDirError, match="already holds a run"):
        run_dir.claim(tmp_path, resume=False, overwrite=False, is_main=True, share=share)
    with pytest.raises(OutDirError, match="already holds a run"):
        run_dir.claim(tmp_path, resume=False, overwrite=False, is_main=False, share=share)
    assert verdicts[1] is None  # the other rank did not judge on its own


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


def follow(advice: str, args: list[str]) -> list[str]:
    """The command line an error's advice asks for, made from the one that failed."""
    if "with --overwrite instead of --resume" in advice:
        return [a if a != "--resume" else "--overwrite" for a in args]
    if "leave out --resume" in advice:
        return [a for a in args if a != "--resume"]
    if "pass --overwrite to replace it" in advice:
        return [*args, "--overwrite"]
    if "resume with a larger --epochs" in advice:
        return [*args[:args.index("--epochs")], "--epochs", "2", *args[args.index("--epochs") + 2:]]
    raise AssertionError(f"no advice this test knows how to follow: {advice}")


def run_rung(out_dir, args):
    return subprocess.run([sys.executable, "-m", "scaledl.ladder.single_torch", "--train-limit", "640",
                           "--out-dir", str(out_dir), *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("held", ["nothing", "metrics but no checkpoint"])
def test_the_advice_of_a_refused_resume_leads_to_a_run(tmp_path, held):
    out_dir = tmp_path / "out"
    if held != "nothing":
        out_dir.mkdir()
        (out_dir / "metrics.jsonl").write_text('{"type": "config", "config": {}}\n')  # stopped before a checkpoint
    args = ["--epochs", "1", "--resume"]
    for _ in range(3):  # each refusal's advice is followed, until a run starts
        result = run_rung(out_dir, args)
        if result.returncode == 0:
            break
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        args = follow(result.stderr, args)
    assert result.returncode == 0 and "summary rung=single_torch" in result.stdout, result.stderr
    assert (out_dir / "summary.json").is_file()


@pytest.mark.slow
def test_resuming_a_finished_run_leaves_it_as_it_is_and_says_how_to_train_on(tmp_path):
    out_dir = tmp_path / "out"
    assert run_rung(out_dir, ["--epochs", "1"]).returncode == 0
    before = {path.name: path.read_bytes() for path in out_dir.iterdir()}
    result = run_rung(out_dir, ["--epochs", "1", "--resume"])
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.strip() == (f"scaledl.ladder.single_torch: the run in {out_dir} has finished (step 10 of 10; "
                                     f"its results are in {out_dir}/summary.json), so there is nothing to resume: to "
                                     "train it further, resume with a larger --epochs")
    assert {path.name: path.read_bytes() for path in out_dir.iterdir()} == before
    further = run_rung(out_dir, follow(result.stdout, ["--epochs", "1", "--resume"]))
    assert further.returncode == 0, further.stderr
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["samples_per_s"] > 0  # the resumed epoch's throughput, not NaN
    assert json.loads((out_dir / "metrics.jsonl").read_text().splitlines()[-1])["type"] == "summary"


@pytest.mark.slow
def test_resuming_after_a_torn_metrics_line_drops_it_once(tmp_path):
    out_dir = tmp_path / "out"
    assert run_rung(out_dir, ["--epochs", "1", "--log-interval", "2"]).returncode == 0
    metrics = out_dir / "metrics.jsonl"
    whole = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join(whole[:-1]) + whole[-1][:25])  # killed while writing its last line
    result = run_rung(out_dir, ["--epochs", "2", "--log-interval", "2", "--resume"])
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("dropped") == 1 and f"{metrics}: dropped 1 torn line" in result.stderr, result.stderr
    records = [json.loads(line) for line in metrics.read_text().splitlines()]  # every line parses
    assert [r["type"] for r in records].count("config") == 2 and records[-1]["type"] == "summary"
    assert [r["step"] for r in records if r["type"] == "log"] == list(range(2, 21, 2))
