import pytest

from scaledl.workshop.recompute_timing import seconds_per_step


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_each_mode_times_a_positive_step(recompute):
    seconds = seconds_per_step(16, 1, 2, 8, 2, recompute, steps=2, warmup=1)
    assert 0 < seconds < 10
