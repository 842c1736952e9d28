"""Shared test helpers: run real launchers on this machine and read what ranks report."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from scaledl.hpc import launchers

ROOT = Path(__file__).resolve().parent.parent
PROBES = Path(__file__).resolve().parent / "probes"
DATA = Path(__file__).resolve().parent / "data"


def run(command: list[str], timeout: float = 300, env: dict | None = None, nproc: int = 2,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run a launcher command to completion; fail the test with its output if it does not exit 0."""
    full_env = launchers.local_env(nproc, {**os.environ, **(env or {})})
    full_env["PYTHONPATH"] = os.pathsep.join([str(PROBES), full_env.get("PYTHONPATH", "")])
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(command)} exited {result.returncode}\n--- stdout\n{result.stdout[-4000:]}"
                    f"\n--- stderr\n{result.stderr[-4000:]}")
    return result


def reports(output: str, tag: str = "REPORT") -> list[dict]:
    """JSON objects that ranks printed as `TAG {...}` lines, sorted by rank."""
    # Launchers may prefix each line ("[1,0]<stdout>:", "[0]<stdout>:"); the tag finds the JSON.
    decoder = json.JSONDecoder()
    found = [decoder.raw_decode(output, match.end())[0] for match in re.finditer(rf"{tag} (?=\{{)", output)]
    return sorted(found, key=lambda r: r.get("rank", 0))


def verdict(capsys) -> str:
    """A check's one line (it prints exactly one)."""
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1, lines  # one line, always
    return lines[0]


def fails(capsys, result, *phrases):
    """The check returned False and said FAIL, with each phrase in its line.  A name still unset says
    NOT ATTEMPTED YET instead (checks.common._unfinished), and only that line may."""
    line = verdict(capsys)
    unset = line.startswith("NOT ATTEMPTED YET: ") and "is not set" in line
    assert result is False and (line.startswith("FAIL: ") or unset), line
    for phrase in phrases:
        assert phrase in line, line
    return line


def unattempted(capsys, result, *phrases):
    """The check returned False and said NOT ATTEMPTED YET (a name still unset), with each phrase in its line."""
    line = verdict(capsys)
    assert result is False and line.startswith("NOT ATTEMPTED YET: ") and "is not set" in line, line
    for phrase in phrases:
        assert phrase in line, line
    return line


def assert_refused(rung: str, flags: list[str], out: Path, message: str, env: dict | None = None) -> None:
    """`python -m scaledl.ladder.<rung> <flags> --out-dir <out>` stops with exit 2 and one stderr line that
    holds `message`, before it writes anything (`out` does not exist).  `env` adds to the environment (a
    launcher's variables: the rank of a larger job, refused before it joins one)."""
    result = subprocess.run([sys.executable, "-m", f"scaledl.ladder.{rung}", *flags, "--out-dir", str(out)],
                            capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})
    assert result.returncode == 2 and not out.exists(), result.stderr
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def untouched(*args, **kwargs):
    """An exercise's function as the learner finds it."""
    raise NotImplementedError("exercise")


def tool(name: str) -> str:
    return os.path.join(os.path.dirname(sys.executable), name)


def lesson_and_deeper(stem: str) -> list[Path]:
    """A lesson's solution notebook and, where it has one, its deeper page (notebooks/deeper/): a claim or a
    passage moved off the lesson's main path is still read."""
    found = [ROOT / "solutions" / f"{stem}.ipynb", ROOT / "notebooks" / "deeper" / f"{stem}.ipynb"]
    return [path for path in found if path.exists()]


# Tiers (pyproject.toml's markers) that whole files belong to; `make check` leaves them out.  Lesson 2
# times its simulated device in real seconds (its checks' tolerance is 10%): it runs alone, `serial`.
FILE_TIERS = {"test_slurm.py": ("slurm", "slow"), "test_mpich.py": ("mpich", "slow"),
              "test_browser.py": ("browser", "slow"), "test_gpu.py": ("gpu",),
              "02_single_device.ipynb": ("serial",)}


# The tier a test's time is counted under at the end of a run, the first of these it is marked with;
# unmarked tests are "unit", the lessons' cells (nbval) "notebooks".  Read from each report, so that it
# works the same in pytest-xdist's controller, which collects nothing itself.
TIME_TIERS = ("gpu", "browser", "slurm", "mpich", "slow")
TIER_ORDER = ("unit", *reversed(TIME_TIERS), "notebooks")
_tier_seconds: dict[str, float] = {}
_tier_tests: dict[str, set] = {}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for marker in FILE_TIERS.get(item.path.name, ()):
            item.add_marker(marker)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: every worker sorts the same way
        longest_files_first(items)


# tools/test.sh keeps each test's time in the last run here (runs/ is not tracked); a fresh clone (CI) reads
# the times committed beside this file instead (`python tests/conftest.py` writes them from the last run).
LAST_TIMES = ROOT / "runs" / "last-test" / "times.tsv"
FILE_TIMES = Path(__file__).resolve().parent / "file_seconds.json"


def file_seconds(path: Path | None = None) -> dict[str, float]:
    """Seconds per test file (a notebook counts as one), summed over its tests' setup, call and teardown;
    from the last run's log unless `path` names another."""
    seconds: dict[str, float] = {}
    for line in (path or LAST_TIMES).read_text().splitlines():
        duration, _, _, nodeid = line.split("\t", 3)
        key = nodeid.split("::", 1)[0]
        seconds[key] = seconds.get(key, 0.0) + float(duration)
    return seconds


def longest_files_first(items) -> None:
    """Order the files by their time in the last run, longest first, each file's tests in their own order.

    Phase 1 hands out whole files (--dist loadfile, with --no-loadscope-reorder: in this order); xdist's own
    order, by the number of tests, leaves the files of one long test (the demo's 150 s) to the end, where one
    worker runs them while the other has nothing left.  A file the last run did not time goes first."""
    try:
        seconds = file_seconds()
    except (OSError, ValueError):
        try:
            seconds = json.loads(FILE_TIMES.read_text())
        except (OSError, ValueError):
            seconds = {}
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    items[:] = [item for path in sorted(files, key=lambda path: seconds.get(path, float("inf")), reverse=True)
                for item in files[path]]


def tier_of(report) -> str:
    if ".ipynb::" in report.nodeid:
        return "notebooks"
    return next((name for name in TIME_TIERS if name in report.keywords), "unit")


class TierTimes:
    """Registered as a plugin (pytest_configure), not as conftest hooks: a conftest's hooks see only the
    tests below its folder, and the lessons' notebooks are outside tests/."""

    def __init__(self, worker: bool):
        self.worker = worker  # a pytest-xdist worker: its reports also reach the controller, which logs them

    def pytest_runtest_logreport(self, report):
        """Setup, call and teardown all count: a shared fixture's start is paid by its tier's first test."""
        tier = tier_of(report)
        _tier_seconds[tier] = _tier_seconds.get(tier, 0.0) + report.duration
        _tier_tests.setdefault(tier, set()).add(report.nodeid)
        log = os.environ.get("SCALEDL_TIMES_LOG")  # one line per phase as it ends: a run cut off keeps its times
        if log and not self.worker:
            with open(log, "a") as out:
                out.write(f"{report.duration:.2f}\t{report.when}\t{report.outcome}\t{report.nodeid}\n")

    def pytest_terminal_summary(self, terminalreporter, config):
        """The tests' own time per tier (summed over workers when there are several); with
        $SCALEDL_TIER_TIMES set, also added to that JSON file, which tools/test.sh prints at the end."""
        if not _tier_seconds or hasattr(config, "workerinput"):
            return
        terminalreporter.section("time per tier")
        for tier in (t for t in TIER_ORDER if t in _tier_seconds):
            terminalreporter.write_line(f"{tier:>10}: {_tier_seconds[tier] / 60:6.1f} min in "
                                        f"{len(_tier_tests[tier])} tests")
        path = os.environ.get("SCALEDL_TIER_TIMES")
        if path:
            totals = json.loads(Path(path).read_text() or "{}") if Path(path).is_file() else {}
            for tier, seconds in _tier_seconds.items():
                before = totals.get(tier, [0.0, 0])
                totals[tier] = [before[0] + seconds, before[1] + len(_tier_tests[tier])]
            Path(path).write_text(json.dumps(totals))


def pytest_configure(config):
    config.pluginmanager.register(TierTimes(worker=hasattr(config, "workerinput")), "scaledl-tier-times")


@dataclass
class SlurmCluster:
    """A running one-node cluster: `env` reaches it (SLURM_CONF) from any subprocess."""

    folder: Path
    env: dict

    def run(self, command: list[str], timeout: float = 300, cwd: Path | None = None, **env):
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                              env={**self.env, **env})

    def job(self, job_id: str) -> dict:
        """`scontrol show job`'s fields (JobState, ExitCode, Restarts, ...)."""
        text = self.run(["scontrol", "show", "job", "-o", job_id]).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait_for(self, job_id: str, states: tuple[str, ...], timeout: float = 300) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.job(job_id)
            if found.get("JobState") in states:
                return found
            time.sleep(0.5)
        pytest.fail(f"job {job_id} not {'/'.join(states)} after {timeout:.0f} s: {self.job(job_id)}")


CLUSTER_SCRIPT = ROOT / "tools" / "slurm_cluster.sh"


def free_port_pair() -> int:
    """A port that is free with the next one (slurmctld's and slurmd's), below the kernel's ephemeral range:
    a port the kernel hands out (what `free_port` returns) can be given next to an outgoing connection of a
    test running beside this one (a rendezvous, a gloo pair), and slurmd then cannot bind it."""
    import random
    import socket

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    for _ in range(200):
        port = random.randrange(10000, ephemeral - 1)
        try:
            with socket.socket() as first, socket.socket() as second:
                first.bind(("", port))
                second.bind(("", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no two free ports in a row between 10000 and {ephemeral}")


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """tools/slurm_cluster.sh's cluster in a private folder, stopped at the end with nothing left running."""
    missing = [p for p in ("slurmctld", "slurmd", "munged", "sbatch") if shutil.which(p) is None]
    if missing:
        pytest.skip(f"no Slurm here ({', '.join(missing)} missing): `make setup` installs Debian's slurm-wlm and "
                    "munge through apt")
    if os.geteuid() != 0 and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("the Slurm daemons need root (or sudo without a password)")
    folder = tmp_path_factory.mktemp("slurm")
    port = free_port_pair()
    env = {**launchers.local_env(2), "SCALEDL_SLURM_DIR": str(folder), "SCALEDL_SLURM_PORT": str(port),
           "SLURM_CONF": str(folder / "slurm.conf"), "SCALEDL_VENV": str(ROOT / ".venv"),
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    for name in [n for n in env if n.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_")) and n != "SLURM_CONF"]:
        del env[name]  # a test run inside a Slurm job must not hand that job's variables to this cluster
    env.pop("DS_ACCELERATOR", None)  # as a user's shell: what the jobs need, `scaledl launch` must set
    started = subprocess.run(["bash", str(CLUSTER_SCRIPT), "start"], env=env, capture_output=True, text=True,
                             timeout=120)
    if started.returncode != 0:
        pytest.fail(f"tools/slurm_cluster.sh start failed:\n{started.stderr}")
    cluster = SlurmCluster(folder, env)
    try:
        yield cluster
    finally:
        stopped = subprocess.run(["bash", str(CLUSTER_SCRIPT), "stop"], env=env, capture_output=True, text=True,
                                 timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert not cluster_processes(env["SLURM_CONF"]), "the cluster left processes running"


def cluster_processes(slurm_conf: str) -> list[int]:
    """Processes that carry this cluster's SLURM_CONF: its daemons, job steps and tasks."""
    found = []
    mark = f"SLURM_CONF={slurm_conf}".encode()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return [pid for pid in found if pid != os.getpid()]


if __name__ == "__main__":  # after a whole `make test`: keep its times per file for a fresh clone's order
    FILE_TIMES.write_text(json.dumps({path: round(value, 1) for path, value in sorted(file_seconds().items())},
                                     indent=1) + "\n")
