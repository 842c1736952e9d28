"""The DDP and DeepSpeed rungs under MPICH's hydra mpiexec (Debian's mpich, the family of Polaris' and
Aurora's Cray MPICH), beside Open MPI, whose mpi4py cannot see hydra's ranks.

Marked `mpich` and `slow` (tests/conftest.py); skipped where MPICH is not installed.  Each run has a
timeout: a rendezvous that waited on MPI would hang, not fail.  Each prints its exit status and the
time to its first line.
"""
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from scaledl.hpc import launchers
from scaledl.launch_env import free_port

MPIEXEC = "/usr/bin/mpiexec.mpich"  # by its full path: `mpiexec` stays Open MPI's
QUICK = ["--epochs", "1", "--train-limit", "512", "--log-interval", "2"]

pytestmark = pytest.mark.skipif(not os.access(MPIEXEC, os.X_OK),
                                reason=f"no {MPIEXEC}: `make setup` installs Debian's mpich through apt")


def hydra(command: list[str], hosts: list[str] | None = None, timeout: float = 300, **env):
    """Run under hydra; (exit status, seconds to the first line, output).  Past `timeout` it fails."""
    placement = ["-bootstrap", "fork", "-hosts", ",".join(hosts), "-ppn", "1"] if hosts else []
    started = time.monotonic()
    process = subprocess.Popen([MPIEXEC, *placement, "-n", "2", *command], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env={**launchers.local_env(2), **env})
    lines, first = [], []

    def read():
        for line in process.stdout:
            first.append(first[0] if first else time.monotonic() - started)
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"still running after {timeout:.0f} s (a hang):\n{''.join(lines)[-3000:]}")
    reader.join(timeout=10)
    return process.returncode, first[0] if first else float("nan"), "".join(lines)


@pytest.mark.parametrize("master_addr", [None, "127.0.0.1"])
@pytest.mark.parametrize("rung", ["ddp", "deepspeed"])
def test_rung_under_hydra_with_open_mpis_mpi4py(tmp_path, rung, master_addr):
    env = {"MASTER_ADDR": master_addr} if master_addr else {}
    code, first, output = hydra([sys.executable, "-m", f"scaledl.ladder.{rung}", *QUICK, "--out-dir", str(tmp_path)],
                                **env)
    print(f"{rung} under {MPIEXEC}, MASTER_ADDR {master_addr or 'unset'}: exit {code}, first line after "
          f"{first:.1f} s")
    assert code == 0, output[-3000:]
    assert output.count(f"summary rung={rung} world_size=2 ") == 1
    assert json.loads((tmp_path / "summary.json").read_text())["params_in_sync"] is True


def test_two_nodes_without_master_addr_is_one_line(tmp_path):
    # Hydra's fork bootstrap gives each rank a node of its own (MPI_LOCALNRANKS=1): nothing names rank
    # 0's host, and mpi4py loads Open MPI, which would start a singleton instead of joining hydra's ranks.
    code, first, output = hydra([sys.executable, "-m", "scaledl.ladder.ddp", *QUICK, "--out-dir", str(tmp_path)],
                                hosts=["node-a", "node-b"], timeout=120)
    print(f"ddp under {MPIEXEC} on 2 'nodes', no MASTER_ADDR: exit {code}, first line after {first:.1f} s")
    errors = [line for line in output.splitlines() if "error" in line.lower()]
    assert code == 2 and len(errors) == 1, output[-3000:]
    assert "nothing names rank 0's host" in errors[0] and "export MASTER_ADDR=" in errors[0]
    assert not list(tmp_path.iterdir())  # nothing written


def test_two_nodes_with_master_addr_needs_no_mpi(tmp_path):
    code, first, output = hydra([sys.executable, "-m", "scaledl.ladder.ddp", *QUICK, "--out-dir", str(tmp_path)],
                                hosts=["node-a", "node-b"], MASTER_ADDR="127.0.0.1",
                                MASTER_PORT=str(free_port()))
    print(f"ddp under {MPIEXEC} on 2 'nodes', MASTER_ADDR set: exit {code}, first line after {first:.1f} s")
    assert code == 0, output[-3000:]
    assert "summary rung=ddp world_size=2 " in output


def test_open_mpi_stays_the_default_mpi():
    # Installing MPICH must not move mpirun, mpicc or libmpi.so, which Horovod and mpi4py use.
    for program in ("mpirun", "mpicc"):
        version = subprocess.run([program, "--version" if program == "mpirun" else "--showme:version"],
                                 capture_output=True, text=True)
        assert "Open MPI" in version.stdout + version.stderr, (program, version.stdout, version.stderr)
    probe = "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; print(MPI.Get_library_version())"
    assert "Open MPI" in subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout
