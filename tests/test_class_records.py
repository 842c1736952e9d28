"""What a learner leaves in a class directory: a check's verdict appended to their own file, a run's
summary as a file of its own; many writers at once, as separate processes, and nothing torn."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from conftest import tool
from scaledl import class_records
from scaledl.class_records import ClassError
from scaledl.workshop import classroom


@pytest.fixture
def klass_dir(tmp_path):
    folder = tmp_path / "class"
    result = subprocess.run([tool("scaledl"), "class", "init", str(folder), "--name", "test", "--system", "local"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return folder


def test_a_learner_is_a_pseudonym_of_the_class_unless_real_names_are_on(klass_dir, monkeypatch):
    monkeypatch.delenv(class_records.LEARNER_ENV, raising=False)
    klass = class_records.read_class(klass_dir)
    ann = class_records.learner(klass, "ann")
    assert ann.startswith("learner-") and "ann" not in ann and ann == class_records.learner(klass, "ann")
    assert ann != class_records.learner(klass, "bob")
    other = {**klass, "salt": "another class's salt"}
    assert class_records.learner(other, "ann") != ann  # a learner in two classes is two pseudonyms
    assert class_records.learner({**klass, "real_names": True}, "ann") == "ann"
    monkeypatch.setenv(class_records.LEARNER_ENV, "guest seat 3")  # a shared training account
    assert class_records.learner(klass) == class_records.learner(klass, "guest seat 3")


@pytest.mark.parametrize("setup, message", [
    (lambda d: None, "is not a directory"),
    (lambda d: d.mkdir(), "is not a class directory (no class.json)"),
    (lambda d: (d.mkdir(), (d / "class.json").write_text("{torn")), "cannot be read as a class"),
    (lambda d: (d.mkdir(), (d / "class.json").write_text('{"format": 99, "id": "x", "salt": "y"}')),
     "is not a class file of this scaledl"),
])
def test_a_class_directory_that_is_not_one_is_one_line(tmp_path, setup, message):
    folder = tmp_path / "not-a-class"
    setup(folder)
    with pytest.raises(ClassError, match=re.escape(message)):
        class_records.from_env({class_records.ENV: str(folder)})
    assert class_records.from_env({class_records.ENV: "  "}) is None  # unset or blank: no class


def test_records_land_whole_and_name_their_class_and_learner(klass_dir, monkeypatch):
    monkeypatch.setenv(class_records.ENV, str(klass_dir))
    monkeypatch.setenv(class_records.LEARNER_ENV, "ann")
    assert class_records.append_verdict("07", "check_efficiency", True, "efficiency right")
    path = class_records.write_run({"rung": "ddp", "world_size": 2, "samples_per_s": 900.0}, nodes=1, batch_size=64)
    assert path.parent == klass_dir / "runs" and not list(path.parent.glob(".*"))  # no partial file left
    records = classroom.read(klass_dir)
    assert records.skipped == []
    (run,), (verdict,) = records.runs, records.verdicts
    learner = class_records.learner(records.klass)
    assert run["learner"] == verdict["learner"] == learner and run["class"] == records.klass["id"]
    assert verdict["verdict"] == "PASS" and verdict["lesson"] == "07" and run["summary"]["world_size"] == 2
    monkeypatch.delenv(class_records.ENV)
    assert not class_records.append_verdict("07", "x", True, "no class: nothing written")


WRITER = """
import os, sys, time
from scaledl import class_records
start, n = float(sys.argv[1]), int(sys.argv[2])
while time.time() < start:
    pass
for i in range(n):
    class_records.append_verdict("03", f"check_{i % 7}", i % 2 == 0, f"line {i} of {os.getpid()} " + "x" * (i % 300))
    if i % 10 == 0:
        class_records.write_run({"rung": "ddp", "world_size": 1 + i % 4, "samples_per_s": 100.0 + i}, nodes=1,
                                batch_size=64, global_batch_size=64 * (1 + i % 4))
"""


def test_many_writers_at_once_leave_every_record_whole(klass_dir):
    """12 processes, one learner (a shared account) and their own, append 120 verdicts and write 12 runs
    each, all starting at the same instant; a reader reads the class all the while."""
    writers, per_writer = 12, 120
    start = time.time() + 2.0
    env = {**os.environ, class_records.ENV: str(klass_dir)}
    processes = [subprocess.Popen([sys.executable, "-c", WRITER, str(start), str(per_writer)],
                                  env={**env, class_records.LEARNER_ENV: "shared" if i % 2 else f"seat{i}"})
                 for i in range(writers)]
    seen_while_writing = []
    while any(p.poll() is None for p in processes):
        records = classroom.read(klass_dir)
        # A run file appears only whole (renamed into place); only a verdict being appended may be cut short.
        assert not [line for line in records.skipped if "/runs/" in line], records.skipped
        seen_while_writing.append(len(records.verdicts))
    assert all(p.wait(timeout=120) == 0 for p in processes)
    records = classroom.read(klass_dir)
    assert records.skipped == []
    assert len(records.verdicts) == writers * per_writer
    assert len(records.runs) == writers * (per_writer // 10)
    shared = class_records.learner(records.klass, "shared")
    assert sum(r["learner"] == shared for r in records.verdicts) == writers // 2 * per_writer
    lines = (klass_dir / "verdicts" / f"{shared}.jsonl").read_text().splitlines()
    assert all(json.loads(line)["kind"] == "verdict" for line in lines)  # none torn, none interleaved
    print(f"{writers} writers x {per_writer} verdicts + {len(records.runs)} runs: all whole; a reader read the "
          f"class {len(seen_while_writing)} times while they wrote")


def test_an_assignment_gives_every_learner_a_count_even_one_who_joins_later(klass_dir, monkeypatch):
    users = ["ann", "bob", "cy", "dee", "eve"]
    plan = classroom.assign(klass_dir, [1, 2, 4], users)
    klass = class_records.read_class(klass_dir)
    assert [plan["by_learner"][class_records.learner(klass, u)] for u in users] == [1, 2, 4, 1, 2]
    monkeypatch.setenv(class_records.ENV, str(klass_dir))
    assert class_records.assignment(user="bob")["nodes"] == 2
    late = class_records.assignment(user="zed")["nodes"]
    assert late in (1, 2, 4) and late == class_records.assignment(user="zed")["nodes"]
    (klass_dir / "assignments.json").write_text('{"class": "another", "nodes": [1]}')
    with pytest.raises(ClassError, match="not this class's assignment"):
        class_records.assignment(user="bob")


def test_the_submit_line_runs_the_assigned_point_on_each_system(klass_dir):
    part = {"nodes": 16, "rung": "ddp", "run_flags": "--epochs 3"}
    polaris = classroom.submit_command(part, "polaris", klass_dir)
    assert polaris == (f"qsub -q prod -l select=16:system=polaris -v "
                       f"'SCALEDL_CLASS_DIR={klass_dir},SCALEDL_RUN_FLAGS=--epochs 3' jobs/polaris/ddp.sh")
    assert classroom.submit_command({**part, "nodes": 2}, "aurora", klass_dir).startswith("qsub -q debug -l select=2 ")
    assert classroom.submit_command(part, "slurm", klass_dir).startswith("sbatch --nodes=16 --export='ALL,SCALEDL_")
    assert classroom.submit_command({**part, "nodes": 3}, "local", klass_dir).startswith(
        f"SCALEDL_CLASS_DIR={klass_dir} scaledl launch -n 3 -- scaledl.ladder.ddp")


def test_a_rung_refuses_a_class_directory_that_is_not_one_before_it_writes(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, class_records.ENV: str(tmp_path / "nope")}
    result = subprocess.run([sys.executable, "-m", "scaledl.ladder.single_torch", "--epochs", "1", "--out-dir",
                             str(out)], capture_output=True, text=True, env=env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"scaledl.ladder.single_torch: error: {tmp_path / 'nope'} is not a directory: ask your instructor for the "
        "class directory, or unset SCALEDL_CLASS_DIR"]
    assert not out.exists() and not (tmp_path / "nope").exists()


def test_lesson_7_tells_a_learner_their_point_or_why_there_is_none(klass_dir, monkeypatch):
    monkeypatch.delenv(class_records.ENV, raising=False)
    assert classroom.my_point().startswith("not in a class (SCALEDL_CLASS_DIR is unset)")
    monkeypatch.setenv(class_records.ENV, str(klass_dir))
    monkeypatch.setenv(class_records.LEARNER_ENV, "ann")
    assert "no node count is assigned yet" in classroom.my_point()
    classroom.assign(klass_dir, [4], ["ann"])
    lines = classroom.my_point("polaris").splitlines()
    assert lines[0].endswith("4 nodes of ddp; submit it from a login node:")
    assert lines[1].startswith("qsub -q debug-scaling -l select=4:system=polaris -v ")
