"""`make test` keeps each test's time as it ends, and orders the next run's files by them, longest first."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import conftest
from conftest import ROOT


def test_each_phase_of_each_test_is_logged_as_it_ends(tmp_path):
    log = tmp_path / "times.tsv"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                             "tests/test_config.py", "tests/test_log.py"], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "SCALEDL_TIMES_LOG": str(log)}, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:]
    rows = [line.split("\t") for line in log.read_text().splitlines()]
    passed = int(result.stdout.split(" passed")[0].split()[-1])
    # one line per phase, written once (by the controller, not again by the worker that ran it)
    assert sorted(row[1] for row in rows) == sorted(["setup", "call", "teardown"] * passed)
    assert {row[3].split("::")[0] for row in rows} == {"tests/test_config.py", "tests/test_log.py"}
    assert all(float(row[0]) >= 0 and row[2] == "passed" for row in rows)


def test_files_go_longest_first_and_an_untimed_one_before_them(tmp_path, monkeypatch):
    (tmp_path / "times.tsv").write_text("1.50\tcall\tpassed\ta.py::t1\n2.00\tcall\tpassed\ta.py::t2\n"
                                        "5.00\tsetup\tpassed\tb.ipynb::Cell 0\n0.10\tcall\tpassed\tc.py::t\n")
    assert conftest.file_seconds(tmp_path / "times.tsv") == {"a.py": 3.5, "b.ipynb": 5.0, "c.py": 0.1}
    items = [SimpleNamespace(nodeid=nodeid) for nodeid in ("a.py::t1", "a.py::t2", "b.ipynb::Cell 0", "c.py::t",
                                                           "new.py::t")]
    monkeypatch.setattr(conftest, "LAST_TIMES", tmp_path / "times.tsv")
    conftest.longest_files_first(items)
    assert [item.nodeid for item in items] == ["new.py::t", "b.ipynb::Cell 0", "a.py::t1", "a.py::t2", "c.py::t"]
    # A fresh clone has no last run: the committed times order it.
    (tmp_path / "committed.json").write_text(json.dumps({"c.py": 9.0, "a.py": 1.0}))
    monkeypatch.setattr(conftest, "LAST_TIMES", tmp_path / "none.tsv")
    monkeypatch.setattr(conftest, "FILE_TIMES", tmp_path / "committed.json")
    conftest.longest_files_first(items)
    assert [item.nodeid for item in items][-3:] == ["c.py::t", "a.py::t1", "a.py::t2"]
