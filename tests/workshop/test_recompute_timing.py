import pytest

from scaledl.workshop.recompute_timing import reruns_seconds, seconds_per_step


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_each_mode_times_a_positive_step(recompute):
    seconds = seconds_per_step(16, 1, 2, 8, 2, recompute, steps=2, warmup=1)
    assert 0 < seconds < 10


def test_the_selective_reruns_take_less_than_a_step():
    step = seconds_per_step(64, 2, 4, 32, 4, "none", steps=3, warmup=1)
    reruns = reruns_seconds(64, 2, 4, 32, 4, steps=3, warmup=1)
    assert 0 < reruns < step
