"""A class read back: a simulated class of 8 learners (4 rank counts, 2 learners each) whose runs are real
rung runs under real launchers and whose verdicts come from the lessons' own checks; the report's
points, figure, page and text; and every kind of file the report must not trust."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tool
from scaledl import class_records
from scaledl.hpc import launchers
from scaledl.workshop import class_report, classroom

RUN = ["--epochs", "1", "--train-limit", "512", "--log-interval", "2"]
LEARNERS = {"ann": 1, "bob": 1, "cy": 2, "dee": 2, "eve": 3, "fay": 3, "gus": 4, "hal": 4}  # user: ranks
CHECKS = """
from scaledl.workshop import checks
checks.check_efficiency(lambda rates: {n: rate / rates[min(rates)] for n, rate in rates.items()}, {1: 100.0, 2: 150.0})
checks.check_efficiency(lambda rates: {n: rate / (n * rates[min(rates)] / min(rates)) for n, rate in rates.items()},
                        {1: 100.0, 2: 150.0})
"""

def init(folder: Path, system: str = "local") -> Path:
    result = subprocess.run([tool("scaledl"), "class", "init", str(folder), "--name", "sim", "--system", system],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return folder


@pytest.fixture(scope="module")
def simulated_class(tmp_path_factory):
    """8 learners' real runs of the ddp rung: `scaledl launch` for half of them, torchrun for the others,
    two at a time (two cores); then each learner runs a check twice, wrong then right."""
    folder = init(tmp_path_factory.mktemp("class") / "sim", system="polaris")
    outs = tmp_path_factory.mktemp("runs")
    pending = []
    for index, (user, ranks) in enumerate(LEARNERS.items()):
        # One thread a rank: two learners' jobs share this machine's cores at once, as two jobs would share a node.
        env = launchers.local_env(ranks, {**os.environ, class_records.ENV: str(folder),
                                          class_records.LEARNER_ENV: user, "OMP_NUM_THREADS": "1"})
        args = [*RUN, "--out-dir", str(outs / user)]
        command = ([tool("scaledl"), "launch", "-n", str(ranks), "--", "scaledl.ladder.ddp", *args] if index % 2 else
                   launchers.torchrun(ranks, "scaledl.ladder.ddp", args))
        pending.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        if len(pending) == 2 or index == len(LEARNERS) - 1:
            for process in pending:
                output, _ = process.communicate(timeout=600)
                assert process.returncode == 0, output[-3000:]
            pending = []
        subprocess.run([sys.executable, "-c", CHECKS], env={**env}, check=True, capture_output=True)
    return folder


@pytest.mark.slow
def test_a_simulated_class_of_eight_gives_four_points_of_two_learners(simulated_class):
    report = class_report.build(simulated_class)
    assert report.key == "ranks" and report.records.skipped == []
    points = [p for p in report.points if p["series"] == "weak"]
    assert [p["ranks"] for p in points] == [1, 2, 3, 4]
    assert all(len(p["learners"]) == 2 and p["runs"] == 2 and p["low"] <= p["samples_per_s"] <= p["high"]
               for p in points)
    assert points[0]["efficiency"] == 1.0
    # The figure: one throughput line through the four medians, with the learners' spread as error bars.
    speed, efficiency = report.figure.axes
    xs, ys = speed.lines[0].get_xdata(), speed.lines[0].get_ydata()
    assert list(xs) == [1, 2, 3, 4] and list(ys) == [p["samples_per_s"] for p in points]
    # The predictor's line (Polaris, the class's system) against the first point, and the measured points.
    line = report.predicted[("ddp", "weak", 64)]
    assert [x for x, _ in line] == [1, 2, 3, 4] and line[0][1] == pytest.approx(1.0)
    drawn = [list(drawn.get_xdata()) for drawn in efficiency.lines if drawn.get_linestyle() == "--"]
    assert drawn == [[1, 2, 3, 4]]
    # Every learner's last verdict (file order): the check ran wrong, then right.
    assert len(report.verdicts) == 8
    assert all(table[("07", "check_efficiency")]["verdict"] == "PASS" for table in report.verdicts.values())
    assert all(len([r for r in report.records.verdicts if r["learner"] == name]) == 2 for name in report.verdicts)
    png, page = class_report.write(report, simulated_class / "report")
    assert png.read_bytes()[:4] == b"\x89PNG" and "data:image/png;base64," in page.read_text()
    assert page.read_text().count("<tr>") == 1 + len(report.points) + 1 + 8
    print(report.text)


@pytest.mark.slow
def test_scaledl_class_report_prints_and_writes_the_page(simulated_class, tmp_path):
    result = subprocess.run([tool("scaledl"), "class", "report", str(simulated_class), "--out", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "verdicts: 8 learners, 1 checks" in result.stdout and (tmp_path / "index.html").is_file()
    assert "predictor: scaledl predict, DDP on polaris" in result.stdout


def run_record(folder: Path, user: str, ranks: int, samples_per_s: float, **extra) -> Path:
    """A run record as a rung writes it (class_records.write_run), for one learner."""
    os.environ[class_records.LEARNER_ENV] = user
    try:
        return class_records.write_run({"rung": "ddp", "world_size": ranks, "samples_per_s": samples_per_s},
                                       folder=folder, nodes=extra.pop("nodes", 1), batch_size=64,
                                       global_batch_size=64 * ranks, **extra)
    finally:
        del os.environ[class_records.LEARNER_ENV]


def test_a_learner_far_from_the_others_at_a_point_is_named(tmp_path):
    folder = init(tmp_path / "c")
    for user, nodes, speed in [("ann", 1, 4000), ("bob", 1, 4100), ("ann", 2, 7900), ("bob", 2, 8000),
                               ("cy", 2, 5200), ("dee", 4, 15000), ("eve", 4, 9000)]:
        run_record(folder, user, 4 * nodes, speed, nodes=nodes)
    report = class_report.build(folder)
    klass = report.records.klass
    assert report.key == "nodes"
    lines = report.disagreements
    cy, eve = class_records.learner(klass, "cy"), class_records.learner(klass, "eve")
    assert len(lines) == 2, lines
    assert f"at 2 nodes: {cy} ran 5200 samples/s, 35% below the median of 2 others (7950)" in lines[0]
    assert f"at 4 nodes: {eve} ran 9000 samples/s, 40% below the other learner (15000)" in lines[1]
    assert "a slow or shared node, or a wrong binding?" in lines[0]


def test_a_rerun_counts_once_and_the_clocks_do_not_order_anything(tmp_path):
    folder = init(tmp_path / "c")
    for speed in (1000, 3000, 1100):  # three runs of one point by one learner: its median, one learner
        run_record(folder, "ann", 2, speed)
    run_record(folder, "bob", 2, 1000)
    (point,) = classroom.points(classroom.read(folder))
    assert point["runs"] == 4 and len(point["learners"]) == 2 and point["samples_per_s"] == 1050
    # A learner whose nodes' clocks disagree: the later verdict in the file wins, whatever its time says.
    klass = class_records.read_class(folder)
    name = class_records.learner(klass, "ann")
    lines = [{"format": 1, "class": klass["id"], "kind": "verdict", "learner": name, "lesson": "03",
              "exercise": "check_sharding", "verdict": verdict, "line": "x", "time": when, "host": "n"}
             for verdict, when in (("FAIL", 2e9), ("PASS", 1e9))]  # the PASS came second, stamped a day earlier
    (folder / "verdicts" / f"{name}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    table = classroom.latest_verdicts(classroom.read(folder))
    assert table[name][("03", "check_sharding")]["verdict"] == "PASS"


def test_files_the_report_cannot_trust_are_skipped_one_line_each(tmp_path):
    folder = init(tmp_path / "c")
    good = run_record(folder, "ann", 1, 1000)
    record = json.loads(good.read_text())
    (folder / "runs" / "torn.json").write_text(good.read_text()[:50])
    (folder / "runs" / "notes.txt").write_text("my notes")
    (folder / "runs" / "edited.json").write_text(json.dumps({**record, "summary": {**record["summary"],
                                                                                  "samples_per_s": "fast"}}))
    (folder / "runs" / "other.json").write_text(json.dumps({**record, "class": "0123456789abcdef"}))
    (folder / "runs" / ".ann-ddp.json.partial").write_text("{")  # being written: not even named
    name = record["learner"]
    verdict = {"format": 1, "class": record["class"], "kind": "verdict", "learner": name, "lesson": "03",
               "exercise": "check_sharding", "verdict": "PASS", "line": "ok", "time": 1.0, "host": "n"}
    (folder / "verdicts" / f"{name}.jsonl").write_text(json.dumps(verdict) + "\n" + json.dumps(verdict)[:40])
    (folder / "verdicts" / "learner-00000000.jsonl").write_text(json.dumps(verdict) + "\n")  # someone else's line
    records = classroom.read(folder)
    assert len(records.runs) == 1 and len(records.verdicts) == 1
    reasons = sorted(line.split(": ", 1)[1] for line in records.skipped)
    assert len(reasons) == 6, records.skipped
    expected = ["cannot be read as JSON", "not a run record (runs/ holds <learner>-...json files)",
                "its world_size, samples_per_s, batch_size or learner is missing or not a positive number",
                f"a record of another class ('0123456789abcdef', this one is {record['class']!r})",
                "not a whole record", f"names learner {name!r} in learner-00000000's file"]
    assert all(any(reason.startswith(e) for reason in reasons) for e in expected), reasons
    assert all(line.startswith(f"skipped {folder}") for line in records.skipped)
    # The report goes on, and says what it skipped.
    assert "skipped " in class_report.build(folder).text


def test_two_classes_one_directory_is_refused_and_a_learner_in_two_classes_is_two_learners(tmp_path):
    first = init(tmp_path / "one")
    again = subprocess.run([tool("scaledl"), "class", "init", str(first)], capture_output=True, text=True)
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [
        f"scaledl class: error: {first} already holds a class (class.json): one class per directory; "
        "choose an empty one"]
    second = init(tmp_path / "two")
    run_record(first, "ann", 1, 1000)
    run_record(second, "ann", 1, 1000)
    one, two = classroom.read(first), classroom.read(second)
    assert one.runs[0]["learner"] != two.runs[0]["learner"] and one.skipped == two.skipped == []
    # A record copied from one class into the other is the other class's: skipped, named.
    copy = second / "runs" / "copied.json"
    copy.write_text((first / "runs" / one.runs[0]["file"]).read_text())
    assert any("a record of another class" in line for line in classroom.read(second).skipped)


@pytest.mark.parametrize("args, message", [
    (["assign", "{dir}", "--nodes", "0", "2"], "--nodes needs whole numbers of nodes, at least 1, got [0, 2]"),
    (["assign", "{dir}", "--nodes", "2", "--users", "{tmp}/missing.txt"], "--users {tmp}/missing.txt: cannot be read"),
    (["report", "{tmp}"], "{tmp} is not a class directory (no class.json)"),
    (["init", "{dir}/class.json/below"], "DIR"),
    (["init", "{dir}", "--name", "a b"], None),
])
def test_bad_input_to_scaledl_class_is_one_line_and_exit_2(tmp_path, args, message):
    folder = init(tmp_path / "c")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = subprocess.run([tool("scaledl"), "class", *(a.format(dir=folder, tmp=tmp_path) for a in args)],
                            capture_output=True, text=True)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scaledl class: error: "), lines
    if message:
        assert message.format(dir=folder, tmp=tmp_path) in lines[0]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written
