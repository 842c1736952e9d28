"""Notebook ranks: engines started by `scaledl.workshop.engines.start` find their place and talk over gloo."""
import pytest

from scaledl.workshop import engines


@pytest.mark.slow
def test_engines_join_one_process_group(capsys):
    cluster, view = engines.start(2)
    try:
        assert "2 ranks up (local: " in capsys.readouterr().out
        # Code strings, as a %%px cell sends them (a function from this module would be
        # pickled by reference, and the engines cannot import the test module).
        view.execute("""
import torch, torch.distributed
import scaledl
dist = scaledl.setup(timeout_s=60)
total = torch.tensor([float(dist.rank + 1)], device=dist.device)
torch.distributed.all_reduce(total)
result = (dist.launcher, dist.rank, dist.world_size, dist.master_addr, total.item(), str(dist.device))
scaledl.teardown()
""")
        found = view.pull("result")  # in engine order: engine ids are the MPI ranks
    finally:
        cluster.stop_cluster_sync()
    assert [r[1] for r in found] == [0, 1]
    assert all(r[0] == "openmpi" and r[2] == 2 and r[4] == 3.0 and r[5] == "cpu" for r in found)
    assert found[0][3] == found[1][3]


def ipyparallel_processes() -> set[int]:
    import subprocess

    found = subprocess.run(["pgrep", "-f", "ipyparallel.(controller|engine)"], capture_output=True, text=True)
    return {int(pid) for pid in found.stdout.split()}


@pytest.mark.slow
@pytest.mark.serial  # counts every ipyparallel process on the machine
def test_a_start_that_times_out_says_so_in_one_line_and_leaves_nothing_running():
    """ipyparallel waits for the engines `engine_timeout` seconds inside start_and_connect_sync (60 by
    default), so `timeout_s` must reach it; and a start that times out must stop the controller and
    the engines it did start, or they linger beside the next start (seen on a busy node)."""
    import time

    from scaledl.launch_env import LaunchError

    before = ipyparallel_processes()
    started = time.monotonic()
    with pytest.raises(LaunchError, match=r"2 ranks did not all start within 0.5 s \(.*mpiexec -n 2"):
        engines.start(2, timeout_s=0.5)  # MPI engines that import torch take longer than 1 s to register
    assert time.monotonic() - started < 45  # the engine timeout, not ipyparallel's 60 s default
    deadline = time.monotonic() + 20
    while ipyparallel_processes() - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not ipyparallel_processes() - before


@pytest.mark.slow
def test_a_stop_whose_engine_cannot_answer_still_ends_and_leaves_nothing_running():
    """`cluster.stop_cluster_sync()` asks the engines to exit before it signals them; an engine that
    never answers (here stopped with SIGSTOP, as one whose reply is lost) must not hang the cell:
    the wait is bounded, then the signal ends the ranks, the frozen one too."""
    import signal
    import threading
    import time

    import psutil

    cluster, view = engines.start(2)
    mine = psutil.Process().children(recursive=True)  # the controller, mpiexec and the engines
    # `-m ipyparallel.engine`: the ranks, and mpiexec's command line that starts them (a nanny runs `.engine.nanny`)
    ranks = [p for p in mine if "ipyparallel.engine" in p.cmdline() and "mpiexec" not in p.cmdline()[0]]
    assert len(ranks) == 2, [p.cmdline() for p in mine]
    ranks[0].send_signal(signal.SIGSTOP)
    started = time.monotonic()
    stopper = threading.Thread(target=cluster.stop_cluster_sync, daemon=True)
    stopper.start()
    stopper.join(timeout=60)
    took = time.monotonic() - started
    if stopper.is_alive():  # the hang this test guards against: free the machine before failing
        for process in mine:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
    assert not stopper.is_alive() and took < 30, f"stop_cluster_sync still waiting after {took:.0f} s"
    gone, alive = psutil.wait_procs(mine, timeout=20)
    assert not alive, [p.cmdline() for p in alive]
