"""Notebook ranks: engines started by `scaledl.engines.start` find their place and talk over gloo."""
import pytest

from scaledl import engines


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
