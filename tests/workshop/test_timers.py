"""scaledl.workshop.timers: the all-reduce timer sees the functional collectives and nothing else."""
import os

import pytest
import torch
import torch.distributed as tdist

from scaledl.workshop.timers import AllReduceTimer, median_run


@pytest.fixture
def one_rank_group(tmp_path):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    tdist.destroy_process_group()


def test_timer_counts_no_all_reduce_in_plain_compute():
    with AllReduceTimer() as timer:
        out = (torch.ones(4, 4) @ torch.ones(4, 4)).sum()
    assert out.item() == 64.0  # the operations ran as they are
    assert timer.all_reduces == 0 and timer.seconds == 0.0


def test_timer_counts_and_times_functional_all_reduces(one_rank_group):
    import torch.distributed._functional_collectives as funcol

    group = tdist.group.WORLD
    with AllReduceTimer() as timer:
        for _ in range(3):
            reduced = funcol.all_reduce(torch.ones(8), "sum", group)
            reduced = funcol.wait_tensor(reduced)
    assert torch.equal(reduced, torch.ones(8))  # one rank: the sum is itself
    assert timer.all_reduces == 3
    assert timer.seconds > 0.0


def test_median_run_returns_the_median_run(one_rank_group):
    seconds, timer = median_run(lambda: torch.ones(2) * 2, repeats=5)
    assert seconds >= 0.0 and isinstance(timer, AllReduceTimer) and timer.all_reduces == 0
