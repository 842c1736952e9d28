"""Joining and leaving: a script that ends without teardown() still exits 0 after its collectives.

A gloo worker drops a finished collective's tensors after the caller's wait() returned, and since
torch 2.10 that takes the GIL; at interpreter exit Python 3.11 ends such a thread inside C++ and the
process aborts ("terminate called without an active exception", SIGABRT) after a good run.
`scaledl.setup` registers a wait for the workers that runs before the interpreter finalizes.
"""
import os
import subprocess

import pytest

from conftest import PROBES, tool
from scaledl.hpc import launchers

RUNS = 5


def ends(mode: str, until_abort: bool = False) -> list[tuple[int, str]]:
    """Exit status and stderr of RUNS 2-rank runs of probes/exit_probe.py, the GIL's hand-over slowed;
    with `until_abort`, no more runs after the first that aborts."""
    env = launchers.local_env(2, {**os.environ, "SWITCH_S": "0.05"})
    env["PYTHONPATH"] = os.pathsep.join([str(PROBES), env.get("PYTHONPATH", "")])
    found = []
    for _ in range(RUNS):
        r = subprocess.run([tool("torchrun"), "--standalone", "--nproc_per_node=2", "-m", "exit_probe", mode],
                           capture_output=True, text=True, env=env, timeout=300)
        found.append((r.returncode, r.stderr))
        if until_abort and "terminate called" in r.stderr:
            break
    return found


@pytest.mark.slow
def test_a_script_that_joined_through_setup_exits_0_without_teardown():
    # The control only decides whether there is anything to guard (one abort in RUNS runs): it stops at the first.
    control = ends("plain", until_abort=True)
    if not any("terminate called" in stderr for _, stderr in control):
        pytest.skip(f"init_process_group alone did not abort in {RUNS} runs on this torch: nothing to guard")
    runs = ends("scaledl")
    assert [code for code, _ in runs] == [0] * RUNS, [stderr[-2000:] for code, stderr in runs if code]
    assert not any("terminate called" in stderr for _, stderr in runs)
