"""Notebook ranks: ipyparallel engines started with MPI find their place and talk over gloo."""
import pytest

from scaledl import launchers


@pytest.mark.slow
def test_mpi_engines_join_one_process_group(monkeypatch):
    import ipyparallel as ipp

    for name, value in launchers.local_env(2).items():
        if name.startswith("OMPI_"):
            monkeypatch.setenv(name, value)
    cluster = ipp.Cluster(n=2, engines="mpi")
    client = cluster.start_and_connect_sync()
    try:
        client.wait_for_engines(2, timeout=120)
        view = client[:]

        # Code strings, as a %%px cell sends them (a function from this module would be
        # pickled by reference, and the engines cannot import the test module).
        view.execute("""
import torch, torch.distributed
import scaledl
dist = scaledl.setup(timeout_s=60)
total = torch.tensor([float(dist.rank + 1)])
torch.distributed.all_reduce(total)
result = (dist.launcher, dist.rank, dist.world_size, dist.master_addr, total.item())
scaledl.teardown()
""", block=True)
        found = sorted(view.pull("result", block=True), key=lambda r: r[1])
    finally:
        cluster.stop_cluster_sync()
    assert [r[1] for r in found] == [0, 1]
    assert all(r[0] == "openmpi" and r[2] == 2 and r[4] == 3.0 for r in found)
    assert found[0][3] == found[1][3]
